"""Fine-tuning readers with a byte-level BPE tokenizer (ModernBERT's tokenizer.json).

The readers that encode one word at a time (NER, SQuAD's context) encode " " + word, so each word
gets the pieces it has in running text ("Ġword"): the ids of transformers' is_split_into_words
with add_prefix_space=True. SQuAD's answer text from a span of BPE pieces is their decoded text.
GLUE and SWAG encode whole texts, as transformers' pair template does. Continued pretraining
finds a model directory's tokenizer.json. The tokenizer is built here as in
test_tokenization_bpe.py: BPE over bytes with ModernBERT's special tokens after the pieces (so
[PAD] is not id 0) and the "[CLS] $A [SEP]" / "[CLS] $A [SEP] $B [SEP]" post-processor.
"""
import json
import os

import numpy as np
import pytest
from tokenizers import pre_tokenizers

from bertjax import tasks, tokenization
from bertjax.data import sources
from bertjax.data.finetuning import glue, ner as ner_data, squad as squad_data, swag
from bertjax.data.pretraining import layout, loader, preparation
from bertjax.tasks import pretraining_data, squad_answers

from bpe_helpers import write_modernbert_like_tokenizer

# Words of CoNLL-2003's first sentence and some that split into several pieces, one beginning
# with punctuation ("(Zorbax),": the word's first letter is no word start there).
WORDS = ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", ".", "Zürich",
         "(Zorbax),", "it's", "naïve", "Kello-Marlo", "1895.", "🙂"]
CONTEXT = ("The key (Zorbax), was found in  Zürich by naïve Kello-Marlo in 1895. It is a truth "
           "universally acknowledged.")


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory):
  """A ModernBERT-like tokenizer.json, trained on the bundled corpus."""
  return write_modernbert_like_tokenizer(
      tmp_path_factory.mktemp("modernbert_like") / "tokenizer.json")


@pytest.fixture(scope="module")
def tok(bpe_file):
  tok = tokenization.load_tokenizer(bpe_file)
  assert isinstance(tok, tokenization.ByteLevelBPETokenizer) and tok.pad_id != 0
  return tok


def _transformers(path, *, add_prefix_space=False):
  """transformers' PreTrainedTokenizerFast over the file. With add_prefix_space, as transformers 4
  made it: its __init__ set the ByteLevel pre-tokenizer's add_prefix_space from the argument;
  transformers 5 keeps the argument without applying it, so it is applied here the same way."""
  from transformers import PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel
  reference = PreTrainedTokenizerFast(tokenizer_file=path, add_prefix_space=add_prefix_space)
  state = json.loads(reference.backend_tokenizer.pre_tokenizer.__getstate__())
  if state["add_prefix_space"] != add_prefix_space:
    state.pop("type")
    state["add_prefix_space"] = add_prefix_space
    reference.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(**state)
  return reference


def test_the_contract_says_how_a_word_is_encoded_alone(tok):
  assert tok.word_prefix == " " and not tok.basic_tokenizer
  assert tokenization.WordPieceTokenizer.word_prefix == ""  # today's behaviour: the word itself
  assert tokenization.SentencePieceTokenizer.word_prefix == ""
  assert tokenization.WordPieceTokenizer.basic_tokenizer
  assert not tokenization.SentencePieceTokenizer.basic_tokenizer
  pieces = tok.encode_words(WORDS)
  assert pieces == [tok.encode(" " + word) for word in WORDS]
  assert [tok.id_to_token(p[0])[0] for p in pieces] == ["Ġ"] * len(WORDS)  # the first word too
  assert tok.encode(WORDS[0])[0] != pieces[0][0]  # alone, without the space: another piece
  assert [tok.span_text(p) for p in pieces] == WORDS  # the leading space stripped


def test_ner_words_are_transformers_is_split_into_words_with_a_prefix_space(bpe_file, tok):
  reference = _transformers(bpe_file, add_prefix_space=True)
  encoding = reference(WORDS, is_split_into_words=True)
  expected = encoding["input_ids"]  # [CLS] words [SEP]
  assert expected == [tok.cls_id] + sum(tok.encode_words(WORDS), []) + [tok.sep_id]
  tags = ["B-ORG", "O", "B-MISC"] + ["O"] * (len(WORDS) - 3)
  sentence = ner_data.Sentence(tuple(WORDS), tuple(tags), 1)
  labels = ner_data.label_list([sentence])
  features, windows = ner_data.encode_sentences([sentence], labels, tok, max_seq_length=128)
  assert windows == [ner_data.Window(0, 0, len(WORDS))]
  n = len(expected)
  np.testing.assert_array_equal(features["input_ids"][0, :n], expected)
  assert (features["input_ids"][0, n:] == tok.pad_id).all()
  np.testing.assert_array_equal(features["input_mask"][0], np.arange(128) < n)
  # The label sits on each word's first piece, as transformers' word_ids() say.
  word_ids = encoding.word_ids()
  firsts = [i for i, w in enumerate(word_ids) if w is not None and w != word_ids[i - 1]]
  np.testing.assert_array_equal(np.nonzero(features["label_weights"][0])[0], firsts)
  np.testing.assert_array_equal(features["label_ids"][0, firsts],
                                [labels.index(t) for t in tags])


def _squad_examples(answers, *, is_training):
  """Examples of one question per answer on CONTEXT, read as a SQuAD file is."""
  qas = [{"id": f"q{i}", "question": "Where was the key found?",
          "answers": [{"text": a, "answer_start": CONTEXT.index(a)}]}
         for i, a in enumerate(answers)]
  dataset = {"version": "1.1", "data": [{"paragraphs": [{"context": CONTEXT, "qas": qas}]}]}
  return squad_data.read_examples(dataset, is_training=is_training,
                                  version_2_with_negative=False)


def test_squad_answers_from_bpe_pieces_are_the_original_text(bpe_file, tok):
  answers = ["Zorbax", "Zürich", "1895", "Kello-Marlo", "found in  Zürich", "naïve Kello",
             "truth universally acknowledged"]
  train = _squad_examples(answers, is_training=True)
  assert len(train) == len(answers)  # every answer found in its words
  kwargs = dict(max_seq_length=96, doc_stride=32, max_query_length=16)
  features = squad_data.convert_examples_to_features(train, tok, is_training=True, **kwargs)
  assert len(features) == len(answers)  # one window each

  # The context is the words as transformers encodes them (is_split_into_words, prefix space).
  words = list(train[0].doc_tokens)
  context = _transformers(bpe_file, add_prefix_space=True)(
      words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
  query = tok.encode("Where was the key found?")
  offset = len(query) + 2
  np.testing.assert_array_equal(features.input_ids[0, :offset + len(context) + 1],
                                [tok.cls_id, *query, tok.sep_id, *context, tok.sep_id])

  # The answer's span is narrowed to the answer's own pieces ("Zorbax" in "(Zorbax),").
  for f, answer in enumerate(answers):
    start, end = features.start_position[f], features.end_position[f]
    assert squad_data.detokenize(features.input_ids[f, start:end + 1], tok) == " ".join(
        answer.split()), answer

  # Logits that pick those spans give back the original text of the answer.
  predict = _squad_examples(answers, is_training=False)
  eval_features = squad_data.convert_examples_to_features(predict, tok, is_training=False,
                                                          **kwargs)
  np.testing.assert_array_equal(eval_features.input_ids, features.input_ids)
  start_logits = np.full(features.input_ids.shape, -10.0)
  end_logits = np.full(features.input_ids.shape, -10.0)
  rows = np.arange(len(answers))
  start_logits[rows, features.start_position] = 10.0
  end_logits[rows, features.end_position] = 10.0
  result = squad_answers.postprocess(predict, eval_features, start_logits, end_logits, tok)
  # (the run of two spaces inside "found in  Zürich" is one space in the words, as run_squad)
  assert result.predictions == {f"q{i}": " ".join(a.split()) for i, a in enumerate(answers)}

  assert squad_answers.basic_tokenize("(Zorbax), it's", tok) == ["(Zorbax),", "it's"]
  assert squad_answers.get_final_text("Zorbax", "(Zorbax),", tok) == "Zorbax"


def test_glue_and_swag_pairs_are_transformers_pair_template(bpe_file, tok):
  reference = _transformers(bpe_file)  # whole texts: no prefix space
  pairs = [("The cat sat on the mat.", "A cat was sitting on a mat in Zürich."),
           ('"My dear Mr. Bennet," said his lady', "It is a truth universally acknowledged")]
  task = glue.get_task("mrpc")
  examples = [glue.Example(f"dev-{i}", a, b, "1") for i, (a, b) in enumerate(pairs)]
  features = glue.encode_examples(examples, task, tok, max_seq_length=64)
  for i, (a, b) in enumerate(pairs):
    expected = reference(a, b)["input_ids"]
    assert expected == [tok.cls_id, *tok.encode(a), tok.sep_id, *tok.encode(b), tok.sep_id]
    np.testing.assert_array_equal(features["input_ids"][i, :len(expected)], expected)
    assert (features["input_ids"][i, len(expected):] == tok.pad_id).all()
    assert features["input_mask"][i].sum() == len(expected)

  example = swag.Example("0", "Students lower their eyes nervously.", "She",
                         ("pats her shoulder.", "walks away.", "smiles.", "is in Zürich."), 0)
  rows = swag.encode_examples([example], tok, max_seq_length=32)["input_ids"][0]
  for row, choice in zip(rows, example.choices()):
    expected = reference(example.context, choice)["input_ids"]
    np.testing.assert_array_equal(row[:len(expected)], expected)


def test_continued_pretraining_finds_a_model_directorys_tokenizer_json(bpe_file, tok, tmp_path):
  """A ModernBERT model directory holds tokenizer.json and neither vocab.model nor vocab.txt:
  its data is prepared with that tokenizer, and the prepared data passes the run's checks."""
  from bertjax.configs import tiny  # pylint: disable=import-outside-toplevel
  model_dir = tmp_path / "modernbert"
  model_dir.mkdir()
  (model_dir / "tokenizer.json").write_bytes(open(bpe_file, "rb").read())
  documents = sources.read_text_files(sources.BUNDLED_CORPUS)[:4]
  text_file = tmp_path / "text.txt"
  text_file.write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n")
  config = tiny.get_config()
  config.init_checkpoint, config.data.vocab_model = str(model_dir), ""
  config.data.input_files, config.data.max_seq_length = str(text_file), 32
  config.data.max_predictions_per_seq, config.data.dupe_factor = 5, 1
  config = tasks.typed(config)

  found = str(model_dir / "tokenizer.json")
  assert pretraining_data.checkpoint_vocabulary(config) == found  # no bert_config.json: beside it
  (model_dir / "bert_config.json").write_text("{}")  # a model directory: found there too
  assert pretraining_data.checkpoint_vocabulary(config) == found
  assert pretraining_data.vocabulary(config) == found
  options = pretraining_data.prepare_options(config)
  assert options.vocab == found
  data_dir = str(tmp_path / "data")
  preparation.prepare(options, data_dir, workers=1, progress=False)
  data = loader.PreparedData(data_dir)
  assert data.info["vocab"]["file"] == "tokenizer.json"
  assert os.path.isfile(os.path.join(data_dir, "tokenizer.json"))
  pretraining_data.check_prepared(data, config)  # the same vocabulary as the checkpoint's
  prepared = data.tokenizer()
  assert isinstance(prepared, tokenization.ByteLevelBPETokenizer)
  assert (prepared.pad_id, prepared.vocab_size) == (tok.pad_id, tok.vocab_size)
  assert layout.INFO_FILE in os.listdir(data_dir)
