"""The `Tokenizer` contract: text <-> token ids with BERT's special tokens, and its file names.

The backends (`sentencepiece_model.SentencePieceTokenizer`, `wordpiece.WordPieceTokenizer`,
`byte_level_bpe.ByteLevelBPETokenizer`) implement it; everything past tokenization (data
preparation, the loader, the fine-tuning readers, the tasks) sees only this interface.

Special tokens: `[PAD]` is id 0 in sentencepiece and WordPiece vocabularies, where a byte-level
BPE tokenizer.json puts it otherwise (ModernBERT: 50283); `[UNK] [CLS] [SEP] [MASK]` are at the
ids the tokenizer reports (1, 2, 3, 4 in models trained here). Models trained here hold `[CLS] [SEP] [MASK]` as
control symbols: `token_to_id` finds them, but `encode` never produces them from text, so a user
who types "[MASK]" gets ordinary pieces, not a mask. (A model trained elsewhere with them as
user-defined symbols is accepted too; its `encode` does turn the text "[MASK]" into mask_id.)
"""
from __future__ import annotations

import abc
import functools
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from bertjax.errors import UserError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
MODEL_FILE = "vocab.model"  # the name `save` writes
VOCAB_FILE = "vocab.txt"  # the name WordPieceTokenizer.save writes (Google's and HF's name)
CONFIG_FILE = "tokenizer_config.json"  # beside vocab.txt: {"do_lower_case": ...} (HF's name)
HF_TOKENIZER_FILE = "tokenizer.json"  # Hugging Face's whole tokenizer (BPE, or beside vocab.txt)
GOOGLE_MAX_CHARS_PER_WORD = 200  # google-research/bert tokenization.py WordpieceTokenizer


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
    pad_id: id of [PAD]; 0 but in a byte-level BPE tokenizer.json (ModernBERT's: 50283).
    unk_id, cls_id, sep_id, mask_id: ids of [UNK], [CLS], [SEP], [MASK].
  """

  vocab_size: int
  pad_id: int = 0
  unk_id: int
  cls_id: int
  sep_id: int
  mask_id: int
  # What `encode_words` puts before a word: "" (sentencepiece and WordPiece mark a word's start
  # themselves); " " in byte-level BPE, whose pieces carry the space before a word ("Ġword").
  word_prefix: str = ""
  # Whether text goes through BERT's BasicTokenizer (clean, split CJK, casing, split at
  # whitespace and punctuation) before its pieces are made, as in WordPiece: a word's pieces are
  # then the same wherever it stands. False in sentencepiece and byte-level BPE, where a word's
  # first piece depends on what stands before it ("(Zorbax)," is "▁(" "Zor" "bax" "),", but
  # "Zorbax" alone "▁Zor" "bax"): SQuAD then compares spans by their text (`span_text`) and
  # aligns answers on whitespace-separated words.
  basic_tokenizer: bool = True

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

  def encode_words(self, words: Sequence[str]) -> list[list[int]]:
    """Each word encoded on its own, as fine-tuning readers that keep words apart (NER, SQuAD's
    context) encode them ([num_words][num_pieces]): the ids of `word_prefix` + word, so that a
    word gets the pieces it has in running text. In byte-level BPE every word, the first one
    included, is " " + word, as transformers' is_split_into_words with add_prefix_space=True."""
    return self.encode_batch([self.word_prefix + word for word in words])

  @abc.abstractmethod
  def decode(self, ids: Iterable[int]) -> str:
    """Ids -> text; [PAD] [CLS] [SEP] [MASK] are dropped."""

  def span_text(self, ids: Iterable[int]) -> str:
    """The text of a span of ids as run_squad.py rebuilds an answer, whitespace collapsed to
    single spaces and stripped. Here the decoded text (byte-level BPE: exact, its leading space
    stripped); WordPiece joins pieces with spaces and glues "##" continuations on, sentencepiece
    joins them with "▁" as a space."""
    return " ".join(self.decode(ids).split())

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
    """Per-id tables for Google's whole-word rule; give them to `whole_word.word_starts`.

    Returns:
      starts: [vocab_size] bool, the id begins a word (as `is_word_start` says).
      punctuation: [vocab_size] bool, the piece is punctuation: its text, less the word mark
        ("▁" in sentencepiece, "##" in WordPiece, leading whitespace in byte-level BPE), is
        non-empty and all punctuation by Google's BasicTokenizer (`whole_word.is_punctuation`);
        in byte-level BPE a piece of whitespace alone counts too (it separates words). Special
        ids are never punctuation.
    """

  @abc.abstractmethod
  def save(self, directory: str) -> str:
    """Writes the tokenizer's file(s) into `directory`; returns the path to load it from."""


class TokenizersTokenizer(Tokenizer):
  """A `Tokenizer` whose pieces come from a `tokenizers.Tokenizer` (`self._tok`, set by the
  subclass with its special ids): encoding and decoding through it, as the WordPiece and
  byte-level BPE backends share them."""

  _tok: Any  # tokenizers.Tokenizer

  @functools.cached_property
  def _dropped(self) -> frozenset[int]:
    """What `decode` leaves out: [PAD] [CLS] [SEP] [MASK]."""
    return frozenset({self.pad_id, self.cls_id, self.sep_id, self.mask_id})

  def pipeline(self) -> Any:
    """A copy of the `tokenizers.Tokenizer` that encodes (normalizer, pre-tokenizer, model,
    decoder), for a caller to extend without changing this tokenizer."""
    return type(self._tok).from_str(self._tok.to_str())

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


def write_atomically(path: str, data: bytes) -> None:
  """Writes `data` to a temporary file beside `path`, then renames it: no half-written file.

  Every tokenizer file (`Tokenizer.save`, a trained model) is written this way.
  """
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
