"""Tests of bertjax.tokenization's byte-level BPE backend (ModernBERT's tokenizer.json).

The tokenizer is built here with the `tokenizers` library as ModernBERT's is: BPE over bytes
(ByteLevel pre-tokenizer and decoder), [UNK] [CLS] [SEP] [PAD] [MASK] added after the trained
pieces (so [PAD] is not id 0), a run of spaces as an added token, and a TemplateProcessing
post-processor "[CLS] $A [SEP]" / "[CLS] $A [SEP] $B [SEP]".
"""
import json
import os
import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from bertjax import tokenization
from bertjax.modeldir import model_files
from bertjax.data import sources
from bertjax.errors import UserError
from bertjax.models.config import BertConfig

from bpe_helpers import SPECIALS, write_modernbert_like_tokenizer

TEXTS = ["It is a truth universally acknowledged, that a single man in possession of a good "
         "fortune, must be in want of a wife.",
         '"My dear Mr. Bennet," said his lady to him one day, "have you heard that '
         'Netherfield Park is let at last?"',
         "Hello world, it's a  test.\nNew line\t\ttabs  and   spaces",
         "naïve café — “quoted” 東京 Zürich ½ 🙂",
         " leading and trailing space ",
         ""]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A directory as a ModernBERT download holds it: tokenizer.json, tokenizer_config.json,
  special_tokens_map.json."""
  directory = tmp_path_factory.mktemp("modernbert_like")
  write_modernbert_like_tokenizer(directory / "tokenizer.json")
  (directory / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
       "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
       "unk_token": "[UNK]", "clean_up_tokenization_spaces": False}))
  (directory / "special_tokens_map.json").write_text(json.dumps(
      {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
       "unk_token": "[UNK]"}))
  return directory


@pytest.fixture(scope="module")
def tok(hf_dir):
  return tokenization.ByteLevelBPETokenizer(str(hf_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference(hf_dir):
  return HFTokenizer.from_file(str(hf_dir / "tokenizer.json"))


def _texts():
  corpus = [s for doc in sources.read_text_files(sources.BUNDLED_CORPUS)[60:64] for s in doc]
  return TEXTS + corpus[:100]


def test_ids_are_the_tokenizers_own_less_the_post_processors_specials(tok, reference):
  texts = _texts()
  for text in texts:
    ids = reference.encode(text).ids  # with the post-processor: [CLS] ... [SEP]
    assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id
    assert tok.encode(text) == ids[1:-1], text
  assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
  a, b = texts[0], texts[1]
  assert reference.encode(a, b).ids == ([tok.cls_id] + tok.encode(a) + [tok.sep_id]
                                        + tok.encode(b) + [tok.sep_id])


def test_the_files_padding_and_truncation_are_off(hf_dir, tok, tmp_path):
  config = json.loads((hf_dir / "tokenizer.json").read_text())
  config["padding"] = {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None,
                       "pad_id": tok.pad_id, "pad_type_id": 0, "pad_token": "[PAD]"}
  config["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst",
                          "stride": 0}
  (tmp_path / "tokenizer.json").write_text(json.dumps(config))
  padded = tokenization.load_tokenizer(str(tmp_path / "tokenizer.json"))
  assert padded.encode(TEXTS[0]) == tok.encode(TEXTS[0]) and len(tok.encode(TEXTS[0])) > 8
  assert padded.encode_batch(TEXTS[:2]) == tok.encode_batch(TEXTS[:2])


def test_decode_gives_the_text_back(tok):
  for text in _texts():
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode([tok.cls_id] + ids + [tok.sep_id, tok.pad_id, tok.mask_id]) == text
    assert tok.decode(np.array(ids, np.int32)) == text
  with pytest.raises(IndexError):
    tok.decode([tok.vocab_size])
  with pytest.raises(IndexError):
    tok.decode([-1])


def test_special_ids_and_pieces(tok, reference):
  assert tok.vocab_size == reference.get_vocab_size(with_added_tokens=True) == 806
  found = [reference.token_to_id(t) for t in SPECIALS]
  assert [tok.unk_id, tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id] == found == list(
      range(801, 806))  # after the pieces, as ModernBERT's 50280...50284: [PAD] is not 0
  assert tok.special_ids == frozenset(found)
  assert tok.lowercase is False
  for i in range(tok.vocab_size):
    assert tok.id_to_token(i) == reference.id_to_token(i)
    assert tok.token_to_id(tok.id_to_token(i)) == i
  assert tok.token_to_id("no-such-piece") == tok.unk_id
  for i in (-1, tok.vocab_size):
    with pytest.raises(IndexError):
      tok.id_to_token(i)
  # The contract: text never gives a special id; the text "[MASK]" is its pieces.
  ids = tok.encode("a [MASK] [CLS] [SEP] [PAD] [UNK] b")
  assert not set(ids) & tok.special_ids
  assert tok.decode(ids) == "a [MASK] [CLS] [SEP] [PAD] [UNK] b"


def _words(tok, text):
  """The words of `text` by whole-word masking's units: word_starts, and a new word after a
  special token (masking.apply_masks); whitespace-only words left out."""
  ids = np.array([tok.cls_id] + tok.encode(text) + [tok.sep_id])
  starts = tokenization.word_starts(ids, *tok.word_boundary_tables())
  starts[1:] |= np.isin(ids[:-1], list(tok.special_ids))
  bounds = list(np.flatnonzero(starts)) + [len(ids)]
  words = [tok.decode(ids[s:e]).strip() for s, e in zip(bounds[:-1], bounds[1:])]
  return [w for w in words if w]


def test_word_starts(tok):
  pieces = {p: tok.token_to_id(p) for p in ("Ġhad", "her", ",", 'Ġ"', "Ċ", "Ġ", "  ", ".")}
  assert all(i != tok.unk_id for i in pieces.values()), pieces
  starts, punctuation = tok.word_boundary_tables()
  assert starts.shape == punctuation.shape == (tok.vocab_size,)
  np.testing.assert_array_equal(starts, tok.is_word_start(np.arange(tok.vocab_size)))
  assert tok.is_word_start(np.array([[pieces["Ġhad"], pieces["her"]]])).tolist() == [[True, False]]
  assert starts[pieces["Ċ"]] and starts[pieces['Ġ"']] and not starts[pieces[","]]
  assert starts[sorted(tok.special_ids)].all() and not punctuation[sorted(tok.special_ids)].any()
  for piece in (",", 'Ġ"', ".", "Ċ", "Ġ", "  "):  # punctuation, or whitespace alone
    assert punctuation[pieces[piece]], piece
  assert not punctuation[pieces["Ġhad"]] and not punctuation[pieces["her"]]
  # Byte pieces of a UTF-8 character are no punctuation: "·" (0xB7) is U+00B7, "·" is "Â·".
  assert not punctuation[tok.token_to_id("·")] and not starts[tok.token_to_id("·")]
  assert _words(tok, "Elizabeth, however, had never seen  them\nbefore — Netherfield's park.") == [
      "Elizabeth", ",", "however", ",", "had", "never", "seen", "them", "before", "—",
      "Netherfield's", "park", "."]
  long_words = ["unaccountable", "Netherfield", "acknowledged"]
  for word in long_words:  # more than one piece each, one word
    assert len(tok.encode(" " + word)) > 1, word
  assert _words(tok, " ".join(long_words)) == long_words


def test_load_tokenizer_picks_the_backend(hf_dir, tok, tmp_path):
  for path in (hf_dir / "tokenizer.json", hf_dir):
    loaded = tokenization.load_tokenizer(str(path))
    assert isinstance(loaded, tokenization.ByteLevelBPETokenizer), path
    assert loaded.encode(TEXTS[2]) == tok.encode(TEXTS[2])
  assert model_files.load_tokenizer(str(hf_dir)).encode(TEXTS[0]) == tok.encode(TEXTS[0])
  other_name = tmp_path / "modernbert-tokenizer.json"  # any .json whose model is BPE
  shutil.copy(hf_dir / "tokenizer.json", other_name)
  assert isinstance(tokenization.load_tokenizer(str(other_name)),
                    tokenization.ByteLevelBPETokenizer)
  assert isinstance(tokenization.load_tokenizer(str(hf_dir), lowercase=False),
                    tokenization.ByteLevelBPETokenizer)
  with pytest.raises(UserError, match="cased"):
    tokenization.load_tokenizer(str(hf_dir), lowercase=True)

  # WordPiece: a tokenizer.json beside vocab.txt keeps the WordPiece path, without it one error.
  wordpiece = tmp_path / "wordpiece"
  wordpiece.mkdir()
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s"]
  (wordpiece / "vocab.txt").write_text("".join(p + "\n" for p in vocab))
  hf_wordpiece = HFTokenizer(models.WordPiece({p: i for i, p in enumerate(vocab)},
                                              unk_token="[UNK]"))
  hf_wordpiece.save(str(wordpiece / "tokenizer.json"))
  for path in (wordpiece, wordpiece / "tokenizer.json"):
    loaded = tokenization.load_tokenizer(str(path))
    assert isinstance(loaded, tokenization.WordPieceTokenizer), path
    assert loaded.encode("hello worlds") == [5, 6, 7]
  os.remove(wordpiece / "vocab.txt")
  for path in (wordpiece, wordpiece / "tokenizer.json"):
    with pytest.raises(UserError, match="no vocab.txt beside tokenizer.json"):
      tokenization.load_tokenizer(str(path))


def test_bad_files_are_one_user_error(hf_dir, tmp_path):
  text = (hf_dir / "tokenizer.json").read_text()
  config = json.loads(text)

  def variant(name, change):
    value = json.loads(text)
    change(value)
    directory = tmp_path / name
    directory.mkdir()
    (directory / "tokenizer.json").write_text(json.dumps(value))
    return directory

  def drop(content):
    def change(value):
      value["added_tokens"] = [t for t in value["added_tokens"] if t["content"] != content]
    return change

  def rename(content, new):
    def change(value):
      for t in value["added_tokens"]:
        if t["content"] == content:
          t["content"] = new
    return change

  def move_last_piece(value):  # the model's last piece from id 799 to 900
    vocab = value["model"]["vocab"]
    vocab[next(p for p, i in vocab.items() if i == 799)] = 900

  truncated = tmp_path / "truncated"
  truncated.mkdir()
  (truncated / "tokenizer.json").write_text(text[:len(text) // 2])
  latin1 = tmp_path / "latin1"
  latin1.mkdir()
  (latin1 / "tokenizer.json").write_bytes(b'{"model": "caf\xe9"}')
  array = tmp_path / "array"
  array.mkdir()
  (array / "tokenizer.json").write_text("[1, 2]")
  cases = [
      (truncated, "is not valid JSON"),
      (latin1, "is not valid JSON"),
      (array, "is not a JSON object"),
      (variant("no_vocab", lambda v: v["model"].pop("vocab")), "does not load in the tokenizers"),
      (variant("no_mask", drop("[MASK]")), r"lacks \[MASK\]; bertjax needs"),
      (variant("unk_renamed", rename("[UNK]", "<unk>")), r"lacks \[UNK\]"),
      (variant("hole", move_last_piece), r"no piece for ids \[799, 806, 807\]"),
      (variant("not_byte_level", lambda v: v.update(decoder={"type": "Metaspace",
                                                             "replacement": "\u2581",
                                                             "prepend_scheme": "always",
                                                             "split": True})),
       "not byte-level"),
  ]
  assert config["model"]["type"] == "BPE"
  for directory, words in cases:
    for path in (directory, directory / "tokenizer.json"):
      with pytest.raises(UserError, match=words) as raised:
        tokenization.load_tokenizer(str(path))
      assert str(directory / "tokenizer.json") in str(raised.value), raised.value
      assert "\n" not in str(raised.value)
  with pytest.raises(UserError, match="not BPE"):  # the class itself, given a WordPiece file
    unigram = variant("unigram", lambda v: v.update(model={"type": "Unigram", "vocab": []}))
    tokenization.ByteLevelBPETokenizer(str(unigram / "tokenizer.json"))
  for path, words in ((tmp_path / "missing" / "tokenizer.json", "does not exist"),
                      (tmp_path, "is a directory")):
    with pytest.raises(UserError, match=words):
      tokenization.ByteLevelBPETokenizer(str(path))


def test_save_and_a_model_directory_keep_the_files(hf_dir, tok, tmp_path):
  names = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
  saved = tmp_path / "saved"
  assert tok.save(str(saved)) == str(saved / "tokenizer.json")
  for name in names:  # the bytes as read, and the files beside it
    assert (saved / name).read_bytes() == (hf_dir / name).read_bytes(), name

  assert [os.path.basename(p) for p in model_files.tokenizer_files(str(hf_dir))] == names
  assert sorted(model_files.tokenizer_file_contents(str(hf_dir))) == sorted(names)
  out = tmp_path / "model"
  config = BertConfig(vocab_size=tok.vocab_size, hidden_size=8, num_layers=1, num_heads=2,
                      intermediate_size=16, max_position_embeddings=16)
  model_files.save_model_dir(str(out), {"w": np.zeros((2, 2), np.float32)}, config,
                             model_files.tokenizer_files(str(hf_dir)))
  for name in names:
    assert (out / name).read_bytes() == (hf_dir / name).read_bytes(), name
  again = model_files.load_tokenizer(str(out))
  assert isinstance(again, tokenization.ByteLevelBPETokenizer)
  assert again.encode_batch(TEXTS) == tok.encode_batch(TEXTS)
  assert (again.cls_id, again.sep_id, again.pad_id) == (tok.cls_id, tok.sep_id, tok.pad_id)
  # A fine-tuning workdir writes the contents it carries: the same directory again.
  workdir = tmp_path / "workdir"
  workdir.mkdir()
  for name, data in model_files.tokenizer_file_contents(str(out)).items():
    (workdir / name).write_bytes(data)
  assert model_files.load_tokenizer(str(workdir)).encode(TEXTS[1]) == tok.encode(TEXTS[1])


def test_transformers_gives_the_same_ids(hf_dir, tok):
  transformers = pytest.importorskip("transformers")
  hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(hf_dir / "tokenizer.json"))
  texts = [t for t in _texts() if t]
  for text in texts:
    assert hf(text)["input_ids"] == [tok.cls_id] + tok.encode(text) + [tok.sep_id], text
  a, b = texts[0], texts[1]
  assert hf(a, b)["input_ids"] == ([tok.cls_id] + tok.encode(a) + [tok.sep_id] + tok.encode(b)
                                   + [tok.sep_id])
  loaded = transformers.AutoTokenizer.from_pretrained(str(hf_dir))  # the directory as on the Hub
  assert loaded(texts[2])["input_ids"] == [tok.cls_id] + tok.encode(texts[2]) + [tok.sep_id]
  assert (loaded.cls_token_id, loaded.sep_token_id, loaded.pad_token_id, loaded.mask_token_id) == (
      tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id)
