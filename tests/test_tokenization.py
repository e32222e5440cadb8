"""Tests of bertjax.tokenization: sentencepiece training, the Tokenizer interface, errors."""
import logging
import os
import time

import numpy as np
import pytest
import sentencepiece as spm

from bertjax import tokenization
from bertjax.data import sources
from bertjax.errors import UserError

VOCAB_SIZE = 1000
SENTENCES = ["It is a truth universally acknowledged, that a single man in possession of a good "
             "fortune, must be in want of a wife.",
             '"My dear Mr. Bennet," said his lady to him one day, "have you heard that '
             'Netherfield Park is let at last?"',
             "Emma Woodhouse, handsome, clever, and rich, seemed to unite some of the best "
             "blessings of existence."]


@pytest.fixture(scope="module")
def corpus():
  """The sentences of the bundled corpus's first 60 chapters."""
  return [s for doc in sources.read_text_files(sources.BUNDLED_CORPUS)[:60] for s in doc]


@pytest.fixture(scope="module")
def model_dir(corpus, tmp_path_factory):
  directory = tmp_path_factory.mktemp("spm")
  tokenization.train_sentencepiece(iter(corpus), str(directory / "austen"), VOCAB_SIZE)
  return directory


@pytest.fixture(scope="module")
def tok(model_dir):
  return tokenization.SentencePieceTokenizer(str(model_dir / "austen.model"))


def test_special_ids(tok):
  assert isinstance(tok, tokenization.Tokenizer)
  assert tok.vocab_size == VOCAB_SIZE
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert tok.special_ids == frozenset({0, 1, 2, 3, 4})
  assert [tok.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert [tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
      0, 1, 2, 3, 4]
  assert tok.token_to_id("no-such-piece") == tok.unk_id
  with pytest.raises(IndexError):
    tok.id_to_token(VOCAB_SIZE)


def test_encode_decode_round_trip(tok, corpus):
  for sentence in SENTENCES + corpus[::500]:
    ids = tok.encode(sentence)
    assert ids and all(isinstance(i, int) and 5 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == sentence
    assert tok.decode(np.array(ids, np.int32)) == sentence  # numpy ids too
  assert tok.encode_batch(SENTENCES) == [tok.encode(s) for s in SENTENCES]
  assert tok.encode_batch([]) == []
  # Special tokens vanish in decoding ([UNK] excepted).
  ids = tok.encode(SENTENCES[0])
  assert tok.decode([tok.cls_id] + ids + [tok.sep_id, tok.pad_id, tok.pad_id]) == SENTENCES[0]
  # Common words are single pieces.
  assert tok.encode("the") == [tok.token_to_id("\u2581the")]


def test_typed_special_tokens_are_plain_text(tok):
  """[CLS] [SEP] [MASK] are control symbols: text never encodes to them (a user cannot inject a
  mask or a separator by typing it)."""
  for text in ("[MASK]", "the [MASK] of [CLS] and [SEP] [PAD] [UNK]"):
    ids = tok.encode(text)
    assert not set(ids) & {tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id}
  assert len(tok.encode("[MASK]")) > 1


def test_is_word_start(tok):
  ids = tok.encode("Mr. Darcy's indifference, unquestionably!")
  pieces = [tok.id_to_token(i) for i in ids]
  expected = [p.startswith("\u2581") for p in pieces]
  np.testing.assert_array_equal(tok.is_word_start(np.array(ids)), expected)
  assert expected[0] and not all(expected)  # "." "," "!" continue their word
  table = tok.is_word_start(np.arange(tok.vocab_size))
  assert table.shape == (tok.vocab_size,) and table.dtype == bool
  assert table[:5].all()  # special tokens count as word starts
  assert 0.3 < table.mean() < 0.9
  grid = np.array([[0, 2, ids[0]], [ids[1], 3, 4]])  # any shape
  np.testing.assert_array_equal(tok.is_word_start(grid),
                                [[True, True, expected[0]], [expected[1], True, True]])


def google_words(text):
  """Google's BasicTokenizer words (cased): whitespace split, then punctuation split."""
  from transformers.models.bert import tokenization_bert_legacy as legacy  # Google's rules
  return legacy.BasicTokenizer(do_lower_case=False, tokenize_chinese_chars=True,
                               strip_accents=False).tokenize(text)


def units(pieces, starts, mark):
  """Pieces -> the text of each word unit (a start and the pieces after it), `mark` removed."""
  result = []
  for piece, start in zip(pieces, starts):
    if start or not result:
      result.append("")
    result[-1] += piece.removeprefix(mark)
  return result


def test_is_punctuation_matches_google():
  from transformers.models.bert import tokenization_bert_legacy as legacy
  chars = [chr(c) for c in list(range(0x3000)) + [0xff01, 0xff0c, 0x1f600, 0xe0001]]
  assert [tokenization.is_punctuation(c) for c in chars] == [
      legacy._is_punctuation(c) for c in chars]  # pylint: disable=protected-access
  assert all(map(tokenization.is_punctuation, "$^`+<=>|~\u2014\u201c\u00a7"))
  assert not any(map(tokenization.is_punctuation, "a \u00a3\u00a9\t"))


def test_word_boundary_tables(tok):
  starts, punctuation = tok.word_boundary_tables()
  assert starts.shape == punctuation.shape == (tok.vocab_size,)
  assert starts.dtype == punctuation.dtype == bool
  np.testing.assert_array_equal(starts, tok.is_word_start(np.arange(tok.vocab_size)))
  for i in range(tok.vocab_size):
    text = tok.id_to_token(i).removeprefix("\u2581")
    expected = i >= 5 and bool(text) and all(tokenization.is_punctuation(c) for c in text)
    assert punctuation[i] == expected, tok.id_to_token(i)
  assert not punctuation[:5].any()  # [PAD] [UNK] [CLS] [SEP] [MASK]
  for piece in (".", ",", "\u2581\"", "--"):
    assert punctuation[tok.token_to_id(piece)], piece
  assert not punctuation[tok.token_to_id("\u2581the")]
  assert not punctuation[tok.token_to_id("\u2581")]  # the mark alone is no punctuation


@pytest.mark.parametrize("text", [
    '"Well," said Emma, "it is so."',
    "Mr. Darcy's indifference--unquestionably! And yet, she smiled.",
    SENTENCES[1],
])
def test_word_starts_sentencepiece_follows_google(tok, text):
  """Each word unit is one of Google's words, or a piece of several punctuation marks (',"')."""
  ids = tok.encode(text)
  pieces = [tok.id_to_token(i) for i in ids]
  assert tok.unk_id not in ids
  starts = tokenization.word_starts(np.array(ids), *tok.word_boundary_tables())
  assert starts.shape == (len(ids),) and starts.dtype == bool
  got = units(pieces, starts, "\u2581")
  words = google_words(text)
  assert "".join(got) == "".join(words)
  expected, i = [], 0  # Google's words, runs of marks merged where one piece holds them
  for unit in got:
    if unit and all(map(tokenization.is_punctuation, unit)):
      run = ""
      while len(run) < len(unit):
        run += words[i]
        i += 1
      expected.append(run)
    else:
      expected.append(words[i])
      i += 1
  assert got == expected, (pieces, got, words)
  if text.startswith('"Well,"'):  # '\u2581"' 'Well' ',"' joined by is_word_start alone
    assert got[:2] == ['"', "Well"]
    assert not tok.is_word_start(np.array(ids[1]))


def test_word_starts_rows_and_shapes():
  # ids: 0 [CLS]-like start, 1 word start, 2 continuation, 3 punctuation (not a start)
  starts = np.array([True, True, False, False])
  punctuation = np.array([False, False, False, True])
  ids = np.array([[0, 1, 2, 3, 2, 2, 3],
                  [2, 2, 1, 3, 3, 2, 3]])
  np.testing.assert_array_equal(tokenization.word_starts(ids, starts, punctuation), [
      [True, True, False, True, True, False, True],
      [False, False, True, True, True, True, True]])  # row 0's last "3" does not reach row 1
  batch = np.stack([ids, ids[::-1]])  # [2, 2, 7]
  result = tokenization.word_starts(batch, starts, punctuation)
  assert result.shape == (2, 2, 7)
  np.testing.assert_array_equal(result[1], tokenization.word_starts(ids[::-1], starts,
                                                                      punctuation))
  assert tokenization.word_starts(np.zeros((3, 0), int), starts, punctuation).shape == (3, 0)


WORDPIECE_VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "well", "said",
                   "em", "##ma", "it", "is", "so", ",", '"', ".", "##.", "'", "s", "dar",
                   "##cy", "un", "##question", "##ably", "-", "!", "##", "$", "\u2014"]


def test_word_starts_wordpiece(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("".join(p + "\n" for p in WORDPIECE_VOCAB), encoding="utf-8")
  tok = tokenization.WordPieceTokenizer(str(path), lowercase=True)
  starts, punctuation = tok.word_boundary_tables()
  np.testing.assert_array_equal(starts, [not p.startswith("##") for p in WORDPIECE_VOCAB])
  assert [p for p, is_p in zip(WORDPIECE_VOCAB, punctuation) if is_p] == [
      ",", '"', ".", "##.", "'", "-", "!", "$", "\u2014"]  # not "##" (nothing after the mark)
  text = '"Well," said Emma, "it is so." Darcy\'s--unquestionably!'
  ids = tok.encode(text)
  pieces = [tok.id_to_token(i) for i in ids]
  assert "##ma" in pieces and "##ably" in pieces and tok.unk_id not in ids
  result = tokenization.word_starts(np.array(ids), starts, punctuation)
  np.testing.assert_array_equal(result, [not p.startswith("##") for p in pieces])
  assert units(pieces, result, "##") == google_words(text.lower())
  # A "##" punctuation piece, and the piece after one, start words of their own.
  ids = [tok.cls_id] + [tok.token_to_id(p) for p in ("so", "##.", "##ma", ".", "##ma")]
  assert tokenization.word_starts(np.array(ids), starts, punctuation).tolist() == [
      True, True, True, True, True, True]
  assert tok.is_word_start(np.array(ids)).tolist() == [True, True, False, False, True, False]


def test_training_is_deterministic_and_soft_limited(corpus, model_dir, tmp_path):
  tokenization.train_sentencepiece(iter(corpus), str(tmp_path / "again"), VOCAB_SIZE)
  assert (tmp_path / "again.model").read_bytes() == (model_dir / "austen.model").read_bytes()
  assert sorted(os.listdir(tmp_path)) == ["again.model"]  # no .vocab, no temporary file
  # A vocabulary larger than a small text supports: trained smaller instead of failing.
  small = tokenization.train_sentencepiece(iter(SENTENCES * 3), str(tmp_path / "small"), 30522)
  assert 5 < small.vocab_size < 200
  assert small.decode(small.encode(SENTENCES[1])) == SENTENCES[1]


def test_bundled_corpus_training_speed(tmp_path):
  sentences = [s for doc in sources.read_text_files(sources.BUNDLED_CORPUS) for s in doc]
  start = time.perf_counter()
  tok = tokenization.train_sentencepiece(iter(sentences), str(tmp_path / "full"), 8000)
  assert time.perf_counter() - start < 30  # ~2 s on 2 cores
  assert tok.vocab_size == 8000


def test_load_or_train(corpus, tmp_path):
  path = str(tmp_path / "vocab.model")
  calls = []

  def sentences():
    calls.append(1)
    return iter(corpus[:2000])

  tok = tokenization.load_or_train_sentencepiece(sentences, path, 500)
  assert calls == [1] and tok.vocab_size == 500 and tok.model_file == path
  assert os.listdir(tmp_path) == ["vocab.model"]
  os.utime(path, (1_000_000_000, 1_000_000_000))  # an old mtime: any rewrite would show
  again = tokenization.load_or_train_sentencepiece(sentences, path, 800)  # size not retrained
  assert calls == [1] and again.vocab_size == 500
  assert os.stat(path).st_mtime == 1_000_000_000
  # A failed training leaves nothing behind, not even a temporary file.
  broken = str(tmp_path / "broken.model")
  with pytest.raises(UserError, match="no text to train"):
    tokenization.load_or_train_sentencepiece(lambda: iter(["", "  "]), broken, 500)
  assert os.listdir(tmp_path) == ["vocab.model"]

  def interrupted():
    yield from corpus[:100]
    raise KeyboardInterrupt  # as if the run were killed while reading the text

  with pytest.raises(KeyboardInterrupt):
    tokenization.load_or_train_sentencepiece(interrupted, broken, 500)
  assert os.listdir(tmp_path) == ["vocab.model"]

  def unreadable():  # an error of the text reader reaches the caller as it is
    yield from corpus[:100]
    raise UserError("some.txt is not UTF-8")

  with pytest.raises(UserError, match="some.txt is not UTF-8"):
    tokenization.load_or_train_sentencepiece(unreadable, broken, 500)
  assert os.listdir(tmp_path) == ["vocab.model"]


def test_lines_over_sentencepiece_limit_are_skipped_and_counted(corpus, tmp_path, caplog):
  """A line over sentencepiece's limit (a document or file on one line) is skipped, and the user
  is told how many were and that the format is one sentence per line. The limit is in UTF-8
  bytes, less the line break ending a line (sentencepiece drops it before measuring)."""
  limit = tokenization.MAX_SENTENCE_BYTES
  assert limit == 4192  # sentencepiece's default max_sentence_length
  over = ["a" * (limit + 1), "\u00e9" * (limit // 2 + 1)]  # 4193 bytes; 4194 in 2097 characters
  within = ["b" * limit + "\n", "\u00e9" * (limit // 2)]  # at the limit
  for line in within:  # trained on: alone, each is enough text for a (small) vocabulary
    assert tokenization.train_sentencepiece(iter([line]), str(tmp_path / "within"), 64)
  text = corpus[:2000] + over + within
  assert all(line.strip() for line in text)
  with caplog.at_level(logging.WARNING):
    tok = tokenization.train_sentencepiece(iter(text), str(tmp_path / "long"), 500)
  assert tok.vocab_size == 500
  assert [r.getMessage() for r in caplog.records if "sentencepiece" in r.getMessage()] == [
      f"sentencepiece vocabulary: 2 of {len(text)} lines of the text are longer than "
      "sentencepiece's limit of 4192 bytes and were skipped; the corpus format is one sentence "
      "per line (a blank line between documents), so split such lines into sentences."]
  caplog.clear()
  with caplog.at_level(logging.WARNING):  # no line over the limit: no warning
    tokenization.train_sentencepiece(iter(corpus[:2000]), str(tmp_path / "short"), 500)
  assert not [r for r in caplog.records if "sentencepiece" in r.getMessage()]

  # What is left cannot train the vocabulary: one error, naming the skipped lines too.
  letters = "".join(map(chr, range(0x3b1, 0x3b1 + 25))) + "".join(map(chr, range(0x430, 0x450)))
  with pytest.raises(UserError, match=r"sentencepiece training failed: .*required_chars.*; give "
                     r"more text or a larger vocab_size \(20 of 40 lines of the text are longer "
                     r"than sentencepiece's limit of 4192 bytes and were skipped; the corpus "
                     r"format is one sentence per line"):
    tokenization.train_sentencepiece(iter([letters + " abc", over[0]] * 20),
                                     str(tmp_path / "chars"), 64, character_coverage=1.0)


def test_only_lines_over_sentencepiece_limit(tmp_path):
  """One 6 MB line (a whole book on one line): one UserError naming the limit, the format and
  the fix, not sentencepiece's "give more text"; nothing is left behind."""
  line = " ".join(["It is a truth universally acknowledged."] * 160_000)
  assert len(line.encode("utf-8")) > 6_000_000
  path = str(tmp_path / "vocab.model")
  with pytest.raises(UserError) as raised:
    tokenization.load_or_train_sentencepiece(lambda: iter([line, "", line]), path, 8000)
  assert str(raised.value) == (
      "no sentence to train the sentencepiece model on: each line of the text is longer than "
      "sentencepiece's limit of 4192 bytes (2 skipped); the corpus format is one sentence per "
      "line (a blank line between documents): split the text into sentences.")
  assert raised.value.__cause__ is None and raised.value.__suppress_context__  # no traceback
  assert os.listdir(tmp_path) == []


def test_save(tok, tmp_path):
  path = tok.save(str(tmp_path / "out"))
  assert path == str(tmp_path / "out" / "vocab.model")
  loaded = tokenization.SentencePieceTokenizer(path)
  assert loaded.encode(SENTENCES[0]) == tok.encode(SENTENCES[0])


def test_errors(tmp_path, corpus):
  with pytest.raises(UserError, match=r"sentencepiece model .*missing\.model does not exist; "
                     "give a .model file, or train one"):
    tokenization.SentencePieceTokenizer(str(tmp_path / "missing.model"))
  (tmp_path / "junk.model").write_bytes(b"this is not a protobuf \x00\xff")
  with pytest.raises(UserError, match=r"junk\.model is not a sentencepiece model"):
    tokenization.SentencePieceTokenizer(str(tmp_path / "junk.model"))
  with pytest.raises(UserError, match=r"is a directory; give the .model file in it, e\.g\. "):
    tokenization.SentencePieceTokenizer(str(tmp_path))
  with pytest.raises(UserError, match=r"vocab_size=10 is too small; use 64 or more"):
    tokenization.train_sentencepiece(iter(corpus), str(tmp_path / "tiny"), 10)
  with pytest.raises(UserError, match=r"sentencepiece training failed: .*Vocabulary size is "
                     r"smaller than required_chars.*; give more text or a larger vocab_size"):
    tokenization.train_sentencepiece(iter(corpus + ["\u00e6\u00f8\u00e5 \u03b1\u03b2\u03b3 "
                                                    "\u0436\u0449\u044b"] * 50_000),
                                     str(tmp_path / "chars"), 64, character_coverage=1.0)
  # A plain sentencepiece model, trained without BERT's special pieces.
  spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus[:2000]),
                                 model_prefix=str(tmp_path / "plain"), vocab_size=300,
                                 minloglevel=2)
  with pytest.raises(UserError, match=r"plain\.model was not trained by bertjax: it lacks "
                     r"\[PAD\] at id 0 \(pad id is -1\), \[CLS\], \[SEP\], \[MASK\]; retrain it "
                     "with bertjax.tokenization.train_sentencepiece"):
    tokenization.SentencePieceTokenizer(str(tmp_path / "plain.model"))


def test_user_defined_symbols_model(tmp_path, corpus):
  """A model trained elsewhere with [CLS] [SEP] [MASK] as user-defined symbols (and default
  <pad> <unk> names) is accepted; its encode does turn the text "[MASK]" into mask_id."""
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(corpus[:2000]), model_prefix=str(tmp_path / "uds"), vocab_size=300,
      user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], pad_id=0, unk_id=1, bos_id=-1,
      eos_id=-1, minloglevel=2)
  tok = tokenization.SentencePieceTokenizer(str(tmp_path / "uds.model"))
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert tok.mask_id in tok.encode("the [MASK] of it")
