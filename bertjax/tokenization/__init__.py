"""Tokenizers, the package's interface: one `Tokenizer` over sentencepiece, WordPiece vocab.txt and
byte-level BPE tokenizer.json.

  tok = load_or_train_sentencepiece(lambda: sentences, "workdir/vocab.model", 8000)
  ids = tok.encode("It is a truth universally acknowledged.")   # [num_pieces] ids
  tok.decode(ids)                                                # the text again
  tok = load_tokenizer("uncased_L-12_H-768_A-12/vocab.txt")     # Google's BERT: WordPiece
  tok = load_tokenizer("ModernBERT-base/tokenizer.json")        # ModernBERT: byte-level BPE

Import this package (`from bertjax import tokenization`), not its modules: it re-exports their
public names and holds `load_tokenizer`, which picks the backend and its settings by what a path
is. The modules:
  tokenizer            the `Tokenizer` contract, BERT's special tokens, the file names.
  sentencepiece_model  `SentencePieceTokenizer`: a sentencepiece .model file.
  wordpiece            `WordPieceTokenizer`: a BERT vocab.txt with Google's WordPiece rules.
  byte_level_bpe       `ByteLevelBPETokenizer`: a byte-level BPE tokenizer.json (ModernBERT's).
  vocab_training       `train_sentencepiece`, `load_or_train_sentencepiece`.
  whole_word           Google's whole-word rule (`is_punctuation`, `word_starts`).
"""
from __future__ import annotations

import json
import os

from bertjax.errors import UserError
from bertjax.tokenization.byte_level_bpe import ByteLevelBPETokenizer, model_type
from bertjax.tokenization.sentencepiece_model import SentencePieceTokenizer
from bertjax.tokenization.tokenizer import (CLS, CONFIG_FILE, GOOGLE_MAX_CHARS_PER_WORD,
                                            HF_TOKENIZER_FILE, MASK, MODEL_FILE, PAD, SEP, UNK,
                                            VOCAB_FILE, Tokenizer, UnreadableVocabulary)
from bertjax.tokenization.vocab_training import (MAX_SENTENCE_BYTES, MIN_VOCAB_SIZE,
                                                 load_or_train_sentencepiece, skipped_lines,
                                                 too_long, train_sentencepiece)
from bertjax.tokenization.whole_word import is_punctuation, word_starts
from bertjax.tokenization.wordpiece import WordPieceTokenizer

__all__ = [
    "CLS", "CONFIG_FILE", "GOOGLE_MAX_CHARS_PER_WORD", "HF_TOKENIZER_FILE", "MASK",
    "MAX_SENTENCE_BYTES", "MIN_VOCAB_SIZE", "MODEL_FILE", "PAD", "SEP", "UNK", "VOCAB_FILE",
    "ByteLevelBPETokenizer", "SentencePieceTokenizer", "Tokenizer", "UnreadableVocabulary", "WordPieceTokenizer",
    "is_punctuation", "load_or_train_sentencepiece", "load_tokenizer", "max_chars_per_word",
    "skipped_lines", "too_long", "train_sentencepiece", "word_starts",
]


def load_tokenizer(path: str, *, lowercase: bool | None = None) -> Tokenizer:
  """The tokenizer at `path`, by what `path` is.

  - a .model file (or a directory holding vocab.model): `SentencePieceTokenizer`;
  - a vocab.txt (any .txt file), a directory holding vocab.txt, or a Hugging Face tokenizer.json
    with vocab.txt beside it: `WordPieceTokenizer`, cased or uncased as `lowercase` says, else
    as do_lower_case in tokenizer_config.json beside it, else as the vocabulary suggests (cased
    if over 1% of its pieces hold an upper-case letter; Google's uncased vocab.txt holds none
    outside [PAD]-like special pieces). Its longest word is `max_chars_per_word`'s.
  - a Hugging Face tokenizer.json (or any .json file) whose model is BPE, or a directory holding
    one and neither vocab.txt nor vocab.model: `ByteLevelBPETokenizer` (ModernBERT's tokenizer;
    always cased).

  Args:
    path: file or directory, as above.
    lowercase: for WordPiece, True (uncased) or False (cased); None to decide as above. A BPE
      tokenizer.json is cased: True is refused.

  Returns:
    The tokenizer.

  Raises:
    UserError: `path` is none of the above, or its files are bad.
  """
  path = os.fspath(path)
  if os.path.isdir(path):
    if os.path.isfile(os.path.join(path, VOCAB_FILE)):
      path = os.path.join(path, VOCAB_FILE)
    elif os.path.isfile(os.path.join(path, MODEL_FILE)):
      path = os.path.join(path, MODEL_FILE)
    elif os.path.isfile(os.path.join(path, HF_TOKENIZER_FILE)):
      path = os.path.join(path, HF_TOKENIZER_FILE)
    else:
      raise UserError(f"{path} holds neither {VOCAB_FILE} (WordPiece), {MODEL_FILE} "
                      f"(sentencepiece) nor {HF_TOKENIZER_FILE} (byte-level BPE); give the "
                      "tokenizer's file or the directory holding it.")
  elif not os.path.exists(path):
    raise UserError(f"tokenizer {path} does not exist; give a {VOCAB_FILE} (WordPiece), a .model "
                    f"file (sentencepiece), a {HF_TOKENIZER_FILE} (byte-level BPE) or a directory "
                    "holding one.")
  if path.endswith(".json") and model_type(path) == "BPE":
    if lowercase:
      raise UserError(f"{path} is a byte-level BPE tokenizer, which is cased: it cannot be read "
                      "uncased (lowercase=True / do_lower_case); leave the casing unset.")
    return ByteLevelBPETokenizer(path)
  if os.path.basename(path) == HF_TOKENIZER_FILE:
    path = os.path.join(os.path.dirname(path), VOCAB_FILE)
    if not os.path.isfile(path):
      raise UserError(f"no {VOCAB_FILE} beside {HF_TOKENIZER_FILE} in {os.path.dirname(path)}; "
                      f"bertjax reads WordPiece pieces from {VOCAB_FILE}: save it there (a Hugging "
                      "Face tokenizer's save_pretrained writes both).")
  if path.endswith(".model"):
    return SentencePieceTokenizer(path)
  if not path.endswith(".txt"):
    raise UserError(f"cannot tell what tokenizer {path} is; give a {VOCAB_FILE} (WordPiece), a "
                    f".model file (sentencepiece), a {HF_TOKENIZER_FILE} whose model is BPE "
                    "(byte-level BPE) or a directory holding one.")
  if lowercase is None:
    lowercase = _do_lower_case(os.path.join(os.path.dirname(path), CONFIG_FILE))
  max_chars = max_chars_per_word(os.path.dirname(path))
  tok = WordPieceTokenizer(path, lowercase=True if lowercase is None else lowercase,
                           max_input_chars_per_word=max_chars)
  if lowercase is None:  # no word from the user or a config: guess from the pieces
    pieces = map(tok.id_to_token, range(tok.vocab_size))
    upper = sum(t != t.lower() for t in pieces if not t.startswith("["))
    if upper > 0.01 * tok.vocab_size:
      tok = WordPieceTokenizer(path, lowercase=False, max_input_chars_per_word=max_chars)
  return tok


def max_chars_per_word(directory: str) -> int:
  """The longest word the WordPiece vocab.txt in `directory` splits into pieces, by its origin.

  A Hugging Face tokenizer.json beside it: its model.max_input_chars_per_word (100 in
  transformers). Else max_input_chars_per_word in tokenizer_config.json (`WordPieceTokenizer.save`
  writes it). Else, a bare vocab.txt as in Google's releases: 200, Google's tokenization.py.
  """
  hf_file = os.path.join(directory, HF_TOKENIZER_FILE)
  if os.path.isfile(hf_file):
    model = _json_object(hf_file).get("model")
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
      kind = model.get("type") if isinstance(model, dict) else None
      raise UserError(f"{hf_file} is not a WordPiece tokenizer (its model is {kind!r}), so it "
                      f"does not go with {VOCAB_FILE} beside it; remove it from {directory}.")
    return _positive_int(hf_file, "model.max_input_chars_per_word",
                         model.get("max_input_chars_per_word", 100))
  config_file = os.path.join(directory, CONFIG_FILE)
  config = _json_object(config_file) if os.path.isfile(config_file) else {}
  if "max_input_chars_per_word" in config:
    return _positive_int(config_file, "max_input_chars_per_word",
                         config["max_input_chars_per_word"])
  return GOOGLE_MAX_CHARS_PER_WORD


def _positive_int(path: str, key: str, value) -> int:
  """`value` of `key` in the file `path`, checked to be a positive integer (UserError if not)."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise UserError(f"{path} has {key}={value!r}; it must be a positive number of characters "
                    f"(Hugging Face's is 100, Google's {GOOGLE_MAX_CHARS_PER_WORD}).")
  return value


def _json_object(path: str) -> dict:
  """The JSON object in the file `path` (a tokenizer's settings); UserError if it is not one."""
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise UserError(f"{path} is not valid JSON ({e}); fix it or delete it.") from None
  if not isinstance(value, dict):
    raise UserError(f"{path} is not a JSON object; fix it or delete it (a {CONFIG_FILE} may be "
                    "{\"do_lower_case\": true} for an uncased vocabulary, false for a cased one).")
  return value


def _do_lower_case(config_file: str) -> bool | None:
  """do_lower_case of a tokenizer_config.json (None without the file or the key)."""
  if not os.path.isfile(config_file):
    return None
  config = _json_object(config_file)
  value = config.get("do_lower_case")
  if value is not None and not isinstance(value, bool):
    raise UserError(f"{config_file} has do_lower_case={value!r}; it must be true (uncased) or "
                    "false (cased).")
  unsupported = [f"{key}={config[key]!r}" for key, ok in (("strip_accents", (None, value)),
                                                           ("tokenize_chinese_chars", (True,)))
                 if key in config and config[key] not in ok]
  if unsupported:
    raise UserError(f"{config_file} asks for {', '.join(unsupported)}, which bertjax's "
                    "WordPieceTokenizer does not do (accents are stripped exactly when "
                    "lower-casing, CJK characters always split); remove those keys.")
  return value
