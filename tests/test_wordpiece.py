"""Tests of bertjax.tokenization.WordPieceTokenizer and load_tokenizer.

The reference is the pure-Python BERT tokenizer that transformers keeps
(models/bert/tokenization_bert_legacy.py: BasicTokenizer + WordpieceTokenizer, Google's rules),
and transformers.BertTokenizer, which in transformers 5 is built on the `tokenizers` library.
"""
import json
import os
import sys

import numpy as np
import pytest
import transformers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers, trainers
from transformers.models.bert import tokenization_bert_legacy as legacy

from bertjax import tokenization
from bertjax.data import sources
from bertjax.data.pretraining import masking
from bertjax.errors import UserError

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Google's layout: [PAD]=0, [unused0..98]=1..99, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103.
GOOGLE_HEAD = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] +
               ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])
VARIED = [  # text the trainer also sees, so that some accented and CJK pieces are in the vocab
    "Café naïve Ångström façade résumé Über straße Zoë",
    "中文字符 日本語の文 한국어",
    "In 1811, 3.14 of 1,000,000 pounds: £20, 50% or $3!",
]
SAMPLES = [
    "Café naïve Ångström CAFÉ NAÏVE résumé Façade",
    "中文字符和日本語、한국어 mixed with English",
    "Wait!!!...? (yes)--no; \"quoted\" 'single' [bracketed] {braces} a/b\\c @#$%^&*~`|",
    "ctrl\x00chars\tand\u200bzero\x07width\ufffdhere\r\nnext\x0bline\x1f \x85 \u2028 \u00a0nbsp",
    "emoji 😀 here👍🏽 and ❤️ flags 🇫🇷",
    "x" * 101, "y" * 100, "x" * 200, "y" * 201, "z" * 250 + " short", "é" * 101, "é" * 201,
    "Elizabeth BENNET and Mr. Darcy of PEMBERLEY; eLiZaBeTh",
    "3.14159 1,000,000 2024-11-23 12:30 4th 1st #42 007",
    "", "   \t\n ", "İstanbul ǅ ﬁne Ⅻ ß ẞ", "Ich heiße Maß; Straße",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "[MASK] [CLS] hello [UNK] [unused0]",  # text never yields special ids
]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  """A vocab.txt in Google's layout, pieces trained (cased) on some of the bundled corpus."""
  with open(sources.BUNDLED_CORPUS, encoding="utf-8") as f:
    text = f.read(400_000)
  trainer_tok = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
  trainer_tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
  trainer_tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  trainer = trainers.WordPieceTrainer(vocab_size=2000, special_tokens=SPECIALS,
                                      show_progress=False)
  trainer_tok.train_from_iterator(text.split("\n\n") + VARIED * 3, trainer)
  vocab = trainer_tok.get_vocab()
  pieces = [p for p in sorted(vocab, key=vocab.get) if p not in SPECIALS]
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("".join(p + "\n" for p in GOOGLE_HEAD + pieces), encoding="utf-8")
  return str(path)


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def lowercase(request):
  return request.param


@pytest.fixture(scope="module")
def tok(vocab_file, lowercase):
  return tokenization.WordPieceTokenizer(vocab_file, lowercase=lowercase)


def reference_ids(vocab_file, lowercase, text):
  """Google's rules in pure Python (no special tokens matched in the text); words of up to 200
  characters, as google-research/bert tokenization.py's WordpieceTokenizer."""
  vocab = legacy.load_vocab(vocab_file)
  basic = legacy.BasicTokenizer(do_lower_case=lowercase, tokenize_chinese_chars=True,
                                strip_accents=None)
  wordpiece = legacy.WordpieceTokenizer(vocab, unk_token="[UNK]", max_input_chars_per_word=200)
  return [vocab[p] for word in basic.tokenize(text) for p in wordpiece.tokenize(word)]


def austen_paragraphs():
  """Paragraphs from far into the corpus (past the text the vocab was trained on)."""
  docs = sources.read_text_files(sources.BUNDLED_CORPUS)
  return [s for doc in docs[-20:] for s in doc][::7]


def test_matches_reference(vocab_file, lowercase, tok):
  hf = transformers.BertTokenizer(vocab_file, do_lower_case=lowercase, split_special_tokens=True)
  hf.backend_tokenizer.model.max_input_chars_per_word = 200  # a bare vocab.txt: Google's rules
  texts = SAMPLES + austen_paragraphs()
  if lowercase:  # NFD input: see test_no_unicode_composition for the cased case
    texts += ["cafe\u0301 Cafe\u0301 A\u030angstro\u0308m"]
  unk_seen = 0
  for text in texts:
    ids = tok.encode(text)
    assert ids == reference_ids(vocab_file, lowercase, text), text
    assert ids == hf.encode(text, add_special_tokens=False), text
    assert all(isinstance(i, int) for i in ids)
    assert not set(ids) & {tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id}
    unk_seen += ids.count(tok.unk_id)
  assert unk_seen >= 5  # emoji, the long words, characters outside the vocab
  assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
  assert tok.encode_batch([]) == []


def test_case_and_accents(tok, lowercase):
  pieces = lambda text: [tok.id_to_token(i) for i in tok.encode(text)]
  if lowercase:
    assert pieces("CAFÉ") == pieces("cafe") and tok.unk_id not in tok.encode("CAFÉ")
    assert pieces("Ångström") == pieces("angstrom")
  else:
    assert pieces("Café") != pieces("cafe")
    assert pieces("Elizabeth")[0][0] == "E"
  assert pieces("中文") == ["中", "文"]  # each CJK character is a word
  assert pieces("x" * 200) != ["[UNK]"] and pieces("x" * 201) == ["[UNK]"]  # Google's 200
  assert pieces("a\x00b") == pieces("ab") and pieces("a\tb") == pieces("a b")


def test_no_unicode_composition(vocab_file):
  # Google's BERT and the tokenizers library do not NFC-normalize: cased, "e" + U+0301 is not
  # "é" (transformers 5's pure-Python BasicTokenizer does NFC first, so it differs here).
  cased = tokenization.WordPieceTokenizer(vocab_file, lowercase=False)
  uncased = tokenization.WordPieceTokenizer(vocab_file, lowercase=True)
  assert cased.encode("cafe\u0301") != cased.encode("café")
  assert uncased.encode("cafe\u0301") == uncased.encode("café") == uncased.encode("cafe")


def test_special_ids(tok):
  assert isinstance(tok, tokenization.Tokenizer)
  assert tok.vocab_size == len(open(tok.vocab_file, encoding="utf-8").read().splitlines())
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
  assert tok.special_ids == frozenset({0, 100, 101, 102, 103})
  assert [tok.id_to_token(i) for i in (0, 1, 99, 100, 101, 102, 103)] == [
      "[PAD]", "[unused0]", "[unused98]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert [tok.token_to_id(t) for t in SPECIALS] == [0, 100, 101, 102, 103]
  assert tok.token_to_id("no-such-piece") == tok.unk_id
  with pytest.raises(IndexError):
    tok.id_to_token(tok.vocab_size)
  with pytest.raises(IndexError):
    tok.id_to_token(-1)


def test_is_word_start(tok):
  ids = tok.encode("universally acknowledged zzzq")
  pieces = [tok.id_to_token(i) for i in ids]
  assert len(pieces) > 3 and any(p.startswith("##") for p in pieces)
  np.testing.assert_array_equal(tok.is_word_start(np.array(ids)),
                                [not p.startswith("##") for p in pieces])
  assert tok.is_word_start(np.array(ids))[0] and pieces[0] in ("universally", "univers", "un")
  specials = np.array([[0, 100], [101, 103]])
  assert tok.is_word_start(specials).tolist() == [[True, True], [True, True]]
  hash_id = next(i for i in range(tok.vocab_size) if tok.id_to_token(i).startswith("##"))
  assert not tok.is_word_start(np.array(hash_id))


def test_decode(vocab_file):
  tok = tokenization.WordPieceTokenizer(vocab_file, lowercase=True)
  text = "it is a truth universally acknowledged that a single man zzzq must be in want of a wife"
  ids = tok.encode(text)
  assert len(ids) > len(text.split())  # some words split into pieces
  assert tok.decode(ids) == text
  assert tok.decode(np.array([101] + ids + [102, 0, 0, 103], np.int32)) == text
  assert tok.decode([tok.encode("hello")[0], tok.unk_id]).endswith("[UNK]")  # [UNK] is kept
  assert tok.decode([]) == ""
  with pytest.raises(IndexError):
    tok.decode([tok.vocab_size])


def test_save_and_load_tokenizer(tmp_path, vocab_file, tok, lowercase):
  path = tok.save(str(tmp_path / "out"))
  assert path == str(tmp_path / "out" / "vocab.txt")
  with open(path, "rb") as a, open(vocab_file, "rb") as b:
    assert a.read() == b.read()
  with open(tmp_path / "out" / "tokenizer_config.json", encoding="utf-8") as f:
    assert json.load(f)["do_lower_case"] is lowercase
  text = "Café CAFÉ Elizabeth"
  for where in (path, str(tmp_path / "out")):  # the file or its directory: the config is read
    again = tokenization.load_tokenizer(where)
    assert isinstance(again, tokenization.WordPieceTokenizer) and again.lowercase is lowercase
    assert again.encode(text) == tok.encode(text)
  assert tokenization.load_tokenizer(path, lowercase=not lowercase).lowercase is (not lowercase)


def test_load_tokenizer_guesses_case_without_config(tmp_path, vocab_file):
  cased = tmp_path / "cased"
  cased.mkdir()
  (cased / "vocab.txt").write_bytes(open(vocab_file, "rb").read())
  assert tokenization.load_tokenizer(str(cased)).lowercase is False  # many upper-case pieces
  lines = open(vocab_file, encoding="utf-8").read().splitlines()
  lower = list(dict.fromkeys(line if line.startswith("[") else line.lower() for line in lines))
  (tmp_path / "vocab.txt").write_text("\n".join(lower) + "\n", encoding="utf-8")
  assert tokenization.load_tokenizer(str(tmp_path / "vocab.txt")).lowercase is True


def test_load_tokenizer_sentencepiece(tmp_path):
  sentences = [s for doc in sources.read_text_files(sources.BUNDLED_CORPUS)[:10] for s in doc]
  spm_tok = tokenization.train_sentencepiece(iter(sentences), str(tmp_path / "sp"), 300)
  loaded = tokenization.load_tokenizer(spm_tok.model_file)
  assert isinstance(loaded, tokenization.SentencePieceTokenizer)
  assert loaded.encode(sentences[0]) == spm_tok.encode(sentences[0])
  spm_tok.save(str(tmp_path / "dir"))
  assert isinstance(tokenization.load_tokenizer(str(tmp_path / "dir")),
                    tokenization.SentencePieceTokenizer)


def test_load_tokenizer_errors(tmp_path):
  (tmp_path / "empty_dir").mkdir()
  (tmp_path / "weights.json").write_text("{}")
  for path, words in ((tmp_path / "missing.txt", "does not exist"),
                      (tmp_path / "empty_dir", "holds neither vocab.txt"),
                      (tmp_path / "weights.json", "cannot tell")):
    with pytest.raises(UserError, match=words):
      tokenization.load_tokenizer(str(path))
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "vocab.txt").write_text("\n".join(GOOGLE_HEAD + ["a", "##b"]) + "\n")
  for config, words in (("{not json", "not valid JSON"), ("[1]", "not a JSON object"),
                        ('{"do_lower_case": "yes"}', "do_lower_case='yes'"),
                        ('{"do_lower_case": true, "strip_accents": false}', "strip_accents"),
                        ('{"tokenize_chinese_chars": false}', "tokenize_chinese_chars")):
    (bad / "tokenizer_config.json").write_text(config)
    with pytest.raises(UserError, match=words):
      tokenization.load_tokenizer(str(bad))
  (bad / "tokenizer_config.json").write_text('{"do_lower_case": false, "strip_accents": null}')
  assert tokenization.load_tokenizer(str(bad)).lowercase is False


def test_vocab_errors(tmp_path):
  def vocab(name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return str(path)

  good = GOOGLE_HEAD + ["a", "##b"]
  cases = [
      (str(tmp_path / "missing.txt"), "does not exist"),
      (str(tmp_path), "is a directory"),
      (vocab("empty.txt", b""), "is empty"),
      (vocab("latin1.txt", "\n".join(good).encode() + b"\ncaf\xe9\n"), r"not UTF-8 \(line 107\)"),
      (vocab("no_mask.txt", "\n".join(good[:-3] + good[-2:])), r"lacks \[MASK\]"),
      (vocab("no_unk_cls.txt", "\n".join(t for t in good if t not in ("[UNK]", "[CLS]"))),
       r"lacks \[UNK\], \[CLS\]"),
      (vocab("pad_late.txt", "\n".join(good[1:] + ["[PAD]"])), r"\[PAD\] on line 106"),
      (vocab("repeat.txt", "\n".join(good + ["a"])), "repeats the piece 'a'"),
  ]
  for path, words in cases:
    with pytest.raises(UserError, match=words):
      tokenization.WordPieceTokenizer(path)
  ok = tokenization.WordPieceTokenizer(vocab("crlf.txt", "\r\n".join(good) + "\r\n"))
  assert ok.vocab_size == len(good) and ok.id_to_token(ok.vocab_size - 1) == "##b"


def test_pretraining_accepts_it(tok):
  special = masking.SpecialTokens.from_tokenizer(tok)
  assert (special.pad, special.cls, special.sep, special.mask) == (0, 101, 102, 103)
  assert special.vocab_size == tok.vocab_size
  assert special.ids_never_masked == frozenset({0, 100, 101, 102, 103})
  assert not np.isin(special.replacement_ids, [0, 100, 101, 102, 103]).any()
  assert len(special.replacement_ids) == tok.vocab_size - 5


def test_pretraining_runs_on_a_wordpiece_vocabulary(vocab_file, tmp_path):
  """data.vocab_model=vocab.txt: examples hold WordPiece ids with its specials; a step runs."""
  from bertjax.training import parallel, steps  # pylint: disable=import-outside-toplevel
  from bertjax.tasks import pretraining  # pylint: disable=import-outside-toplevel
  from bertjax.configs import tiny  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  text = tmp_path / "text.txt"
  docs = sources.read_text_files(sources.BUNDLED_CORPUS)[:6]
  text.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n")
  config.data.update(input_files=str(text), vocab_model=vocab_file, max_seq_length=32,
                     max_predictions_per_seq=5)
  config.train.update(batch_size=4, eval_batch_size=4, num_train_steps=2, warmup_steps=0)
  from bertjax import tasks  # pylint: disable=import-outside-toplevel
  from bertjax.training import train  # pylint: disable=import-outside-toplevel
  config = tasks.typed(config)
  context = train.run_context(config)
  task = pretraining.make_task(config, str(tmp_path / "workdir"), context)
  wordpiece = tokenization.load_tokenizer(vocab_file)
  batch = next(task.batches.train(None))[0]
  assert (batch["input_ids"][:, 0] == wordpiece.cls_id).all() and wordpiece.cls_id == 101
  assert batch["input_ids"].max() < wordpiece.vocab_size
  setup = steps.build(config, task, batch, context.mesh)
  _, metrics = setup.train_step(setup.init_state(), parallel.global_batch(batch, setup.mesh),
                                setup.learning_rate(0))
  assert np.isfinite(float(metrics.compute()["loss"]))
