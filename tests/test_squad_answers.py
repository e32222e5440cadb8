"""SQuAD answers from the model's logits: BERT's basic tokenizer, get_final_text mapping a
predicted span back to the original text (WordPiece, cased or not, and SentencePiece), and
postprocess's n-best lists, max context, "empty" and SQuAD 2.0's null odds and threshold, as
run_squad.py writes them.
"""
import numpy as np
import pytest

from bertjax import tokenization
from bertjax.data.finetuning import squad as squad_data
from bertjax.tasks import squad_answers
from bertjax.tokenization import WordPieceTokenizer

from squad_helpers import _ids, _windows_examples
from squad_helpers import tok, vocab_file  # noqa: F401  (the fixtures)


def test_basic_tokenize_is_berts(vocab_file):
  # pylint: disable-next=import-outside-toplevel
  from transformers.models.bert.tokenization_bert_legacy import BasicTokenizer
  texts = ["Steve Smith's (1895-1943).", "Café,  ÅNGSTRÖM\tx", "中文ab\u00adc", "a\x00b -- ¿Qué?"]
  for lowercase in (True, False):
    tokenizer = WordPieceTokenizer(vocab_file, lowercase=lowercase)
    reference = BasicTokenizer(do_lower_case=lowercase, tokenize_chinese_chars=True)
    for text in texts:
      assert squad_answers.basic_tokenize(text, tokenizer) == reference.tokenize(text), text


def test_get_final_text(vocab_file, tok):
  cased = WordPieceTokenizer(vocab_file, lowercase=False)
  assert squad_answers.get_final_text("steve smith", "Steve Smith's", tok) == "Steve Smith"
  assert squad_answers.get_final_text("1895", "(1895-1943).", tok) == "1895"
  assert squad_answers.get_final_text("cafe", "Café,", tok) == "Café"
  # Decomposed é: lower-casing strips the accent, the lengths differ, the whole text is kept.
  assert squad_answers.get_final_text("cafe", "Cafe\u0301,", tok) == "Cafe\u0301,"
  assert squad_answers.get_final_text("john", "Steve Smith's", tok) == "Steve Smith's"
  # Cased: the prediction must match the case.
  assert squad_answers.get_final_text("steve smith", "Steve Smith's", cased) == "Steve Smith's"
  assert squad_answers.get_final_text("Steve Smith", "Steve Smith's", cased) == "Steve Smith"
  assert squad_data.detokenize(_ids(tok, ["zor", "##bax", ",", "red"]), tok) == "zorbax , red"


def test_sentencepiece_answers(tmp_path):
  rng = np.random.default_rng(0)
  words = ["key", "red", "Zorbax", "Kello", "word", "thing", "(Zorbax),", "(red)."]
  sp = tokenization.train_sentencepiece(
      (" ".join(rng.choice(words, size=8)) for _ in range(300)), str(tmp_path / "sp"), 64)
  assert [sp.id_to_token(i) for i in sp.encode("(Zorbax),")] == ["\u2581(", "Zorbax", "),"]
  assert [sp.id_to_token(i) for i in sp.encode("Zorbax")] == ["\u2581Zorbax"]  # another piece
  example = squad_data.Example("q", "key?", ("key", "(Zorbax),", "red"), "Zorbax", 1, 1)
  features = squad_data.convert_examples_to_features(
      [example], sp, max_seq_length=20, doc_stride=4, max_query_length=4, is_training=True)
  start, end = features.start_position[0], features.end_position[0]
  assert sp.id_to_token(int(features.input_ids[0, start])) == "Zorbax" and start == end
  context = features.input_ids[0, start - 2:end + 3]  # ▁key ▁( Zorbax ), ▁red
  assert squad_data.detokenize(context, sp) == "key (Zorbax), red"
  assert squad_answers.get_final_text("Zorbax", "(Zorbax),", sp) == "Zorbax"


def _logits(num_features, seq, entries):
  """[num_features, seq] start and end logits: -10, except {(feature, position): (s, e)}."""
  start, end = np.full((num_features, seq), -10.0), np.full((num_features, seq), -10.0)
  for (f, position), (s, e) in entries.items():
    if s is not None:
      start[f, position] = s
    if e is not None:
      end[f, position] = e
  return start, end


def test_postprocess(tok):
  examples = _windows_examples()
  features = squad_data.convert_examples_to_features(
      examples, tok, max_seq_length=12, doc_stride=4, max_query_length=3, is_training=False)
  start, end = _logits(4, 12, {
      (0, 0): (1.0, 1.0),  # window 0: null score 2
      (0, 9): (5.0, None), (0, 10): (None, 4.0),  # zor ##bax: 9
      (1, 0): (3.0, 2.0),  # window 1: null score 5
      (1, 5): (8.0, None), (1, 6): (None, 8.0),  # 16, but token 4 is window 0's max context
      (2, 0): (4.0, 4.0),
      (3, 6): (2.0, 2.0),  # q2: "red"
  })
  result = squad_answers.postprocess(examples, features, start, end, tok)
  assert result.predictions == {"q1": "Zorbax", "q2": "red"}
  assert result.null_odds == {} and not result.version_2_with_negative
  nbest = result.nbest["q1"]
  assert nbest[0]["text"] == "Zorbax" and (nbest[0]["start_logit"], nbest[0]["end_logit"]) == (
      5.0, 4.0)
  scores = [e["start_logit"] + e["end_logit"] for e in nbest]
  assert scores == sorted(scores, reverse=True) and len(nbest) <= 20
  assert len({e["text"] for e in nbest}) == len(nbest) and "" not in {e["text"] for e in nbest}
  assert sum(e["probability"] for e in nbest) == pytest.approx(1.0)
  # The window 1 span (16) is not taken; window 1's ##bax (position 6) ends "bax" at -10 + 8.
  assert "bax" in [e["text"] for e in nbest]
  # One token at most: window 1's ##bax (-10 + 8) beats window 0's zor (5 - 10).
  short = squad_answers.postprocess(examples, features, start, end, tok, max_answer_length=1)
  assert [e["text"] for e in short.nbest["q1"][:2]] == ["bax", "Zor"]
  # 3 best starts and ends of a window hold no valid one-token span: run_squad's "empty".
  short = squad_answers.postprocess(examples, features, start, end, tok, n_best_size=3,
                                 max_answer_length=1)
  assert short.nbest["q1"] == [{"text": "empty", "probability": 1.0, "start_logit": 0.0,
                                "end_logit": 0.0}]

  # SQuAD 2.0: the null score is the smallest [CLS] score over the windows: 2 (window 0); the
  # best span scores 9, so null - best = -7.
  v2 = squad_answers.postprocess(examples, features, start, end, tok, version_2_with_negative=True)
  assert v2.predictions["q1"] == "Zorbax" and v2.null_odds["q1"] == pytest.approx(-7.0)
  null = [e for e in v2.nbest["q1"] if e["text"] == ""]
  assert [(e["start_logit"], e["end_logit"]) for e in null] == [(1.0, 1.0)]
  assert null[0]["probability"] == pytest.approx(np.exp(2 - 9) * v2.nbest["q1"][0]["probability"])
  v2 = squad_answers.postprocess(examples, features, start, end, tok, version_2_with_negative=True,
                              null_score_diff_threshold=-7.5)
  assert v2.predictions["q1"] == ""  # -7 > -7.5
  # Windows without logits: q1 (missing window 2) is left out.
  partial = squad_answers.postprocess(examples, features, start[[0, 1, 3]], end[[0, 1, 3]], tok,
                                   feature_index=np.array([0, 1, 3]))
  assert partial.predictions == {"q2": "red"}
