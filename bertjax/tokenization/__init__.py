"""Tokenizers: one interface (`Tokenizer`) over sentencepiece models and WordPiece vocab.txt.

  tok = load_or_train_sentencepiece(lambda: sentences, "workdir/vocab.model", 8000)
  ids = tok.encode("It is a truth universally acknowledged.")   # [num_pieces] ids
  tok.decode(ids)                                                # the text again
  tok = load_tokenizer("uncased_L-12_H-768_A-12/vocab.txt")     # Google's BERT: WordPiece

WordPiece (`WordPieceTokenizer`) follows BERT's rules through the `tokenizers` library: clean
the text, split CJK characters, lower-case and strip accents (uncased) or neither (cased), split
on whitespace and punctuation, then greedy longest-match pieces with "##" marking a piece that
continues a word; a word the vocabulary cannot spell, or one longer than the vocabulary's origin
allows, is [UNK]: 200 characters for a bare vocab.txt (Google's tokenization.py), a Hugging Face
tokenizer.json's own max_input_chars_per_word (100 in transformers) when one sits beside it.

Special tokens: `[PAD]` is always id 0; `[UNK] [CLS] [SEP] [MASK]` are at the ids the tokenizer
reports (1, 2, 3, 4 in models trained here). Models trained here hold `[CLS] [SEP] [MASK]` as
control symbols: `token_to_id` finds them, but `encode` never produces them from text, so a user
who types "[MASK]" gets ordinary pieces, not a mask. (A model trained elsewhere with them as
user-defined symbols is accepted too; its `encode` does turn the text "[MASK]" into mask_id.)
"""
from __future__ import annotations

import abc
import io
import json
import os
import unicodedata
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from bertjax.errors import UserError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
MODEL_FILE = "vocab.model"  # the name `save` writes
VOCAB_FILE = "vocab.txt"  # the name WordPieceTokenizer.save writes (Google's and HF's name)
CONFIG_FILE = "tokenizer_config.json"  # beside vocab.txt: {"do_lower_case": ...} (HF's name)
HF_TOKENIZER_FILE = "tokenizer.json"  # Hugging Face's whole tokenizer, beside its vocab.txt
GOOGLE_MAX_CHARS_PER_WORD = 200  # google-research/bert tokenization.py WordpieceTokenizer
MIN_VOCAB_SIZE = 64  # smaller cannot hold a corpus's characters and the special pieces
_WORD_START = "\u2581"  # "▁": sentencepiece's mark of a piece that begins a word


class UnreadableVocabulary(UserError):
  """A vocabulary file that cannot be read at all (empty, corrupt). `problem` says what is wrong
  without the fix, for a caller that knows a better fix for its own copy of the file."""

  def __init__(self, path: str, problem: str, fix: str):
    super().__init__(f"{path} {problem}; {fix}")
    self.path, self.problem = path, problem


class Tokenizer(abc.ABC):
  """Text <-> token ids, with BERT's special tokens.

  Attributes:
    vocab_size: number of ids; every id is in [0, vocab_size).
    pad_id: id of [PAD]; always 0.
    unk_id, cls_id, sep_id, mask_id: ids of [UNK], [CLS], [SEP], [MASK].
  """

  vocab_size: int
  pad_id: int = 0
  unk_id: int
  cls_id: int
  sep_id: int
  mask_id: int

  @property
  def special_ids(self) -> frozenset[int]:
    """The ids of [PAD] [UNK] [CLS] [SEP] [MASK]."""
    return frozenset({self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id})

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """One text -> its ids ([num_pieces]); never special ids other than unk_id."""

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Texts -> their ids ([num_texts][num_pieces]); subclasses may do this faster."""
    return [self.encode(text) for text in texts]

  @abc.abstractmethod
  def decode(self, ids: Iterable[int]) -> str:
    """Ids -> text; [PAD] [CLS] [SEP] [MASK] are dropped."""

  @abc.abstractmethod
  def id_to_token(self, i: int) -> str:
    """The piece of id `i` (IndexError outside [0, vocab_size))."""

  @abc.abstractmethod
  def token_to_id(self, token: str) -> int:
    """The id of a piece; unk_id for a piece not in the vocabulary."""

  @abc.abstractmethod
  def is_word_start(self, ids: np.ndarray) -> np.ndarray:
    """Whether each id's piece begins a new word (special tokens do), for whole-word masking.

    Args:
      ids: int array of any shape.

    Returns:
      bool array of the same shape.
    """

  @abc.abstractmethod
  def word_boundary_tables(self) -> tuple[np.ndarray, np.ndarray]:
    """Per-id tables for Google's whole-word rule; give them to `word_starts`.

    Returns:
      starts: [vocab_size] bool, the id begins a word (as `is_word_start` says).
      punctuation: [vocab_size] bool, the piece is punctuation: its text, less the word mark
        ("▁" in sentencepiece, "##" in WordPiece), is non-empty and all punctuation by
        Google's BasicTokenizer (`is_punctuation`). Special ids are never punctuation.
    """

  @abc.abstractmethod
  def save(self, directory: str) -> str:
    """Writes the tokenizer's file(s) into `directory`; returns the path to load it from."""


class SentencePieceTokenizer(Tokenizer):
  """A `Tokenizer` over a sentencepiece model file (unigram or BPE).

  Args:
    model_file: path of a .model file with the pieces [CLS] [SEP] [MASK], pad id 0 and an
      unknown piece, e.g. one written by `train_sentencepiece`.

  Raises:
    UserError: the file is missing or not a sentencepiece model, or the model lacks BERT's
      special pieces.
  """

  def __init__(self, model_file: str):
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel

    model_file = os.fspath(model_file)
    if os.path.isdir(model_file):
      raise UserError(f"sentencepiece model {model_file} is a directory; give the .model file "
                      f"in it, e.g. {os.path.join(model_file, MODEL_FILE)}.")
    if not os.path.isfile(model_file):
      raise UserError(f"sentencepiece model {model_file} does not exist; give a .model file, or "
                      "train one with bertjax.tokenization.train_sentencepiece.")
    fix = ("give a .model file written by sentencepiece or "
           "bertjax.tokenization.train_sentencepiece.")
    try:
      with open(model_file, "rb") as f:
        self._proto = f.read()
    except OSError as e:
      raise UserError(f"cannot read {model_file} ({e.strerror}); {fix}") from None
    if not self._proto:  # sentencepiece would "load" it: 0 pieces, an IndexError further on
      raise UnreadableVocabulary(model_file, "is empty (0 bytes), not a sentencepiece model", fix)
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
    except RuntimeError:
      raise UnreadableVocabulary(model_file, "is not a sentencepiece model (its bytes do not "
                                 "parse as one: corrupt or another kind of file)", fix) from None
    if not self._sp.get_piece_size():
      raise UnreadableVocabulary(model_file, "holds no pieces, not a sentencepiece model", fix)
    self.model_file = model_file
    self.vocab_size = self._sp.get_piece_size()
    self.pad_id, self.unk_id = self._sp.pad_id(), self._sp.unk_id()
    found = {piece: self._sp.piece_to_id(piece) for piece in (CLS, SEP, MASK)}
    missing = [p for p, i in found.items() if i == self.unk_id or self._sp.id_to_piece(i) != p]
    if self.pad_id != 0:
      missing.insert(0, f"{PAD} at id 0 (pad id is {self.pad_id})")
    if missing:
      raise UserError(f"{model_file} was not trained by bertjax: it lacks {', '.join(missing)}; "
                      "retrain it with bertjax.tokenization.train_sentencepiece (or delete it "
                      "and let the pretraining run train one).")
    self.cls_id, self.sep_id, self.mask_id = found[CLS], found[SEP], found[MASK]
    table = np.array([self._sp.id_to_piece(i).startswith(_WORD_START)
                      for i in range(self.vocab_size)], bool)
    table[list(self.special_ids)] = True
    self._word_start = table  # [vocab_size]

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self._sp.encode(list(texts), out_type=int)  # sentencepiece's threads

  def decode(self, ids: Iterable[int]) -> str:
    return self._sp.decode([int(i) for i in ids])

  def id_to_token(self, i: int) -> str:
    if not 0 <= int(i) < self.vocab_size:
      raise IndexError(f"id {i} is outside the vocabulary [0, {self.vocab_size})")
    return self._sp.id_to_piece(int(i))

  def token_to_id(self, token: str) -> int:
    return self._sp.piece_to_id(token)

  def is_word_start(self, ids: np.ndarray) -> np.ndarray:
    return self._word_start[np.asarray(ids)]

  def word_boundary_tables(self) -> tuple[np.ndarray, np.ndarray]:
    not_text = set(self.special_ids) | {i for i in range(self.vocab_size)
                                        if self._sp.is_control(i) or self._sp.is_unknown(i)}
    pieces = [self._sp.id_to_piece(i) for i in range(self.vocab_size)]
    return self._word_start.copy(), _punctuation_table(pieces, _WORD_START, not_text)

  def save(self, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, MODEL_FILE)
    _write_atomically(path, self._proto)
    return path


class WordPieceTokenizer(Tokenizer):
  """A `Tokenizer` over a BERT vocab.txt (one piece a line, the id is the line's index).

  Pieces come from the `tokenizers` library with BERT's rules (BertNormalizer, BertPreTokenizer,
  WordPiece with "##"; a word over max_input_chars_per_word characters is [UNK]). Text never
  yields [CLS] [SEP] [MASK]: the text "[MASK]" is the pieces of "[", "mask", "]", as in Google's
  BERT; add special ids yourself. Text that differs only by Unicode composition (NFC "é" vs
  "e" + U+0301) gives different pieces when cased, as in Google's BERT (uncased strips the
  accent either way).

  Args:
    vocab_file: path of a vocab.txt holding [PAD] (at line 1, id 0), [UNK], [CLS], [SEP] and
      [MASK], e.g. Google's (ids 0, 100, 101, 102, 103).
    lowercase: True for uncased models (lower-case and strip accents), False for cased ones
      (neither).
    max_input_chars_per_word: the longest word (in characters, after normalization) split into
      pieces; a longer one is [UNK]. Google's tokenization.py: 200; Hugging Face's: 100.

  Raises:
    UserError: the file is missing, empty, not UTF-8, repeats a piece or lacks a special piece.
  """

  def __init__(self, vocab_file: str, *, lowercase: bool = True,
               max_input_chars_per_word: int = GOOGLE_MAX_CHARS_PER_WORD):
    # pylint: disable=import-outside-toplevel
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    vocab_file = os.fspath(vocab_file)
    self._tokens = _read_vocab(vocab_file)  # [vocab_size] pieces
    self.vocab_file, self.lowercase = vocab_file, bool(lowercase)
    self.max_input_chars_per_word = int(max_input_chars_per_word)
    self.vocab_size = len(self._tokens)
    self._ids = {token: i for i, token in enumerate(self._tokens)}
    missing = [t for t in (PAD, UNK, CLS, SEP, MASK) if t not in self._ids]
    if missing:
      raise UserError(f"{vocab_file} lacks {', '.join(missing)}; give a BERT vocab.txt holding "
                      f"{PAD} {UNK} {CLS} {SEP} {MASK}, one piece a line.")
    if self._ids[PAD] != 0:
      raise UserError(f"{vocab_file} has {PAD} on line {self._ids[PAD] + 1}; it must be the first "
                      "line (id 0), as in Google's vocab.txt.")
    self.pad_id, self.unk_id = self._ids[PAD], self._ids[UNK]
    self.cls_id, self.sep_id, self.mask_id = self._ids[CLS], self._ids[SEP], self._ids[MASK]
    tok = HFTokenizer(models.WordPiece(self._ids, unk_token=UNK, continuing_subword_prefix="##",
                                       max_input_chars_per_word=self.max_input_chars_per_word))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=self.lowercase,
        lowercase=self.lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    self._tok = tok
    # [vocab_size]; [PAD] [UNK] [CLS] [SEP] [MASK] do not start with "##": word starts
    self._word_start = np.array([not t.startswith("##") for t in self._tokens], bool)
    self._dropped = frozenset({self.pad_id, self.cls_id, self.sep_id, self.mask_id})

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)  # Rust threads
    return [e.ids for e in encodings]

  def decode(self, ids: Iterable[int]) -> str:
    kept = []
    for i in ids:
      i = int(i)
      if not 0 <= i < self.vocab_size:
        raise IndexError(f"id {i} is outside the vocabulary [0, {self.vocab_size})")
      if i not in self._dropped:
        kept.append(i)
    return self._tok.decode(kept, skip_special_tokens=False)

  def id_to_token(self, i: int) -> str:
    if not 0 <= int(i) < self.vocab_size:
      raise IndexError(f"id {i} is outside the vocabulary [0, {self.vocab_size})")
    return self._tokens[int(i)]

  def token_to_id(self, token: str) -> int:
    return self._ids.get(token, self.unk_id)

  def is_word_start(self, ids: np.ndarray) -> np.ndarray:
    return self._word_start[np.asarray(ids)]

  def word_boundary_tables(self) -> tuple[np.ndarray, np.ndarray]:
    return self._word_start.copy(), _punctuation_table(self._tokens, "##", self.special_ids)

  def save(self, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, VOCAB_FILE)
    _write_atomically(path, "".join(t + "\n" for t in self._tokens).encode("utf-8"))
    config = {"do_lower_case": self.lowercase, "strip_accents": None,
              "tokenize_chinese_chars": True, "tokenizer_class": "BertTokenizer",
              "max_input_chars_per_word": self.max_input_chars_per_word}
    _write_atomically(os.path.join(directory, CONFIG_FILE),
                      (json.dumps(config, indent=2) + "\n").encode("utf-8"))
    return path


def is_punctuation(char: str) -> bool:
  """Whether one character is punctuation by Google's BERT (tokenization.py `_is_punctuation`):
  ASCII 33-47, 58-64, 91-96 and 123-126 (so "$", "^", "`" count), or any Unicode category P*."""
  cp = ord(char)
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(char).startswith("P")


def _punctuation_table(pieces: Sequence[str], mark: str, not_text: Iterable[int]) -> np.ndarray:
  """[vocab_size] pieces -> [vocab_size] bool: the piece, less a leading `mark`, is non-empty
  and all punctuation; False at the ids in `not_text` (special and control pieces)."""
  table = np.zeros(len(pieces), bool)
  for i, piece in enumerate(pieces):
    text = piece.removeprefix(mark)
    table[i] = bool(text) and all(map(is_punctuation, text))
  table[list(not_text)] = False
  return table


def word_starts(input_ids: np.ndarray, starts: np.ndarray, punctuation: np.ndarray) -> np.ndarray:
  """Where words begin, by Google's whole-word rule (create_pretraining_data.py).

  Google's BasicTokenizer splits punctuation off as words of their own, and whole-word masking
  groups a word's first piece with the pieces that continue it. So a token starts a word if its
  piece starts one (`starts`), if it is punctuation, or if the token before it in the same row
  is punctuation: with sentencepiece the pieces '▁"', 'Well', ',' are three words, not one.

  Args:
    input_ids: [..., seq] int token ids, each in [0, vocab_size).
    starts: [vocab_size] bool, from `Tokenizer.word_boundary_tables`.
    punctuation: [vocab_size] bool, from `Tokenizer.word_boundary_tables`.

  Returns:
    [..., seq] bool, True where a token starts a word.
  """
  input_ids = np.asarray(input_ids)
  if input_ids.ndim < 1:
    raise ValueError(f"input_ids must be [..., seq], got a scalar {input_ids!r}")
  is_punctuation_id = np.asarray(punctuation, bool)[input_ids]
  result = np.asarray(starts, bool)[input_ids] | is_punctuation_id
  result[..., 1:] |= is_punctuation_id[..., :-1]
  return result


def _read_vocab(vocab_file: str) -> list[str]:
  """A vocab.txt -> its pieces, the id of each its line's index; UserError for a bad file."""
  if os.path.isdir(vocab_file):
    raise UserError(f"vocab file {vocab_file} is a directory; give the vocab.txt in it, e.g. "
                    f"{os.path.join(vocab_file, VOCAB_FILE)}.")
  if not os.path.isfile(vocab_file):
    raise UserError(f"vocab file {vocab_file} does not exist; give a BERT vocab.txt (one piece "
                    "a line), e.g. the one beside a Google checkpoint.")
  with open(vocab_file, "rb") as f:
    data = f.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise UnreadableVocabulary(vocab_file, f"is not UTF-8 (line {line})", "give a BERT vocab.txt, "
                               "which is UTF-8, or convert it (iconv -t UTF-8).") from None
  tokens = [line.rstrip("\r") for line in text.split("\n")]  # not splitlines: no "\x85" splits
  if tokens and not tokens[-1]:
    tokens.pop()  # the newline ending the last line
  if not tokens:
    raise UnreadableVocabulary(vocab_file, "is empty", "give a BERT vocab.txt (one piece a line).")
  first = {}
  for i, token in enumerate(tokens):
    if token in first:
      raise UserError(f"{vocab_file} repeats the piece {token!r} (lines {first[token] + 1} and "
                      f"{i + 1}); give a vocab.txt with each piece once.")
    first[token] = i
  return tokens


def load_tokenizer(path: str, *, lowercase: bool | None = None) -> Tokenizer:
  """The tokenizer at `path`, by what `path` is.

  - a .model file (or a directory holding vocab.model): `SentencePieceTokenizer`;
  - a vocab.txt (any .txt file), a directory holding vocab.txt, or a Hugging Face tokenizer.json
    with vocab.txt beside it: `WordPieceTokenizer`, cased or uncased as `lowercase` says, else
    as do_lower_case in tokenizer_config.json beside it, else as the vocabulary suggests (cased
    if over 1% of its pieces hold an upper-case letter; Google's uncased vocab.txt holds none
    outside [PAD]-like special pieces). Its longest word is `max_chars_per_word`'s.

  Args:
    path: file or directory, as above.
    lowercase: for WordPiece, True (uncased) or False (cased); None to decide as above.

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
    else:
      raise UserError(f"{path} holds neither {VOCAB_FILE} (WordPiece) nor {MODEL_FILE} "
                      "(sentencepiece); give the tokenizer's file or the directory holding it.")
  elif not os.path.exists(path):
    raise UserError(f"tokenizer {path} does not exist; give a {VOCAB_FILE} (WordPiece), a .model "
                    "file (sentencepiece) or a directory holding one.")
  elif os.path.basename(path) == HF_TOKENIZER_FILE:
    path = os.path.join(os.path.dirname(path), VOCAB_FILE)
    if not os.path.isfile(path):
      raise UserError(f"no {VOCAB_FILE} beside {HF_TOKENIZER_FILE} in {os.path.dirname(path)}; "
                      f"bertjax reads WordPiece pieces from {VOCAB_FILE}: save it there (a Hugging "
                      "Face tokenizer's save_pretrained writes both).")
  if path.endswith(".model"):
    return SentencePieceTokenizer(path)
  if not path.endswith(".txt"):
    raise UserError(f"cannot tell what tokenizer {path} is; give a {VOCAB_FILE} (WordPiece), a "
                    ".model file (sentencepiece) or a directory holding one.")
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


def _write_atomically(path: str, data: bytes) -> None:
  """Writes `data` to a temporary file beside `path`, then renames it: no half-written file."""
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def train_sentencepiece(sentences: Iterable[str], model_prefix: str, vocab_size: int, *,
                        seed: int = 0, model_type: str = "unigram",
                        character_coverage: float = 0.9999,
                        input_sentence_size: int = 1_000_000) -> SentencePieceTokenizer:
  """Trains a sentencepiece model with BERT's special pieces and writes MODEL_PREFIX.model.

  Pieces 0-4 are [PAD] [UNK] [CLS] [SEP] [MASK] ([CLS] [SEP] [MASK] as control symbols, never
  produced from text). The vocabulary limit is soft: a corpus too small for `vocab_size` gets
  a smaller vocabulary (the tokenizer's `vocab_size` says how large). Training uses every core,
  at most `input_sentence_size` sentences (a seeded shuffle picks them), and the same seed and
  text give the same model.

  Args:
    sentences: the text, one sentence (or line) per item; read once.
    model_prefix: the model is written to MODEL_PREFIX.model (atomically).
    vocab_size: the vocabulary size wanted, >= MIN_VOCAB_SIZE.
    seed: seed of sentencepiece's random choices (sampling and shuffling sentences).
    model_type: "unigram" (default) or "bpe".
    character_coverage: fraction of characters covered by pieces; the rest become [UNK].
    input_sentence_size: most sentences used for training.

  Returns:
    The trained tokenizer.

  Raises:
    UserError: vocab_size too small, or no text.
  """
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel

  if vocab_size < MIN_VOCAB_SIZE:
    raise UserError(f"vocab_size={vocab_size} is too small; use {MIN_VOCAB_SIZE} or more "
                    "(BERT uses 30522, the tiny config a few thousand).")
  count, failure = [0], []

  def counted():  # counts the sentences, and keeps an error of `sentences` to raise it again
    try:
      for sentence in sentences:
        if sentence.strip():
          count[0] += 1
          yield sentence
    except GeneratorExit:  # closed early: not an error of `sentences`
      raise
    except BaseException as e:  # pylint: disable=broad-except  (sentencepiece would hide it)
      failure.append(e)

  model = io.BytesIO()
  spm.set_random_generator_seed(seed)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=counted(), model_writer=model, vocab_size=vocab_size,
        model_type=model_type, character_coverage=character_coverage,
        input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
        num_threads=os.cpu_count() or 1, hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=-1,
        eos_id=-1, pad_piece=PAD, unk_piece=UNK, control_symbols=[CLS, SEP, MASK],
        minloglevel=2)
  except RuntimeError as e:
    if failure:
      raise failure[0]
    if not count[0]:
      raise UserError("no text to train the sentencepiece model on; give a corpus with some "
                      "sentences.") from None
    message = str(e).strip().splitlines()[-1]
    raise UserError(f"sentencepiece training failed: {message.split('] ')[-1]}; give more text "
                    "or a larger vocab_size.") from None
  if failure:
    raise failure[0]
  path = f"{model_prefix}.model"
  _write_atomically(path, model.getvalue())
  return SentencePieceTokenizer(path)


def load_or_train_sentencepiece(sentences_fn: Callable[[], Iterable[str]], path: str,
                                vocab_size: int, **train_kwargs) -> SentencePieceTokenizer:
  """Loads the sentencepiece model at `path`, or trains one there if there is none.

  An existing file is loaded as it is (whatever vocab_size it was trained with). Otherwise a
  model is trained (see `train_sentencepiece`) and moved into `path` in one rename, so a run
  killed while training leaves no model, never half of one.

  Args:
    sentences_fn: called (only when training) for an iterable of sentences.
    path: the .model file.
    vocab_size: the vocabulary size wanted if a model is trained.
    **train_kwargs: passed on to `train_sentencepiece` (seed, model_type, ...).

  Returns:
    The tokenizer.
  """
  path = os.fspath(path)
  if os.path.exists(path):
    return SentencePieceTokenizer(path)
  prefix = f"{path}.training-{os.getpid()}"
  try:
    train_sentencepiece(sentences_fn(), prefix, vocab_size, **train_kwargs)
    os.replace(f"{prefix}.model", path)
  finally:
    if os.path.exists(f"{prefix}.model"):
      os.remove(f"{prefix}.model")
  return SentencePieceTokenizer(path)
