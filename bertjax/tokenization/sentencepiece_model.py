"""The sentencepiece backend: a `Tokenizer` over a sentencepiece .model file (unigram or BPE).

A piece that begins a word starts with "▁" (sentencepiece's mark); the model must hold pad id 0,
an unknown piece and [CLS] [SEP] [MASK], as the models `vocab_training.train_sentencepiece`
writes do (see `tokenizer` for the special tokens).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from bertjax.errors import UserError
from bertjax.tokenization.whole_word import punctuation_table
from bertjax.tokenization.tokenizer import (CLS, MASK, MODEL_FILE, PAD, SEP, Tokenizer,
                                            UnreadableVocabulary, write_atomically)

_WORD_START = "\u2581"  # "▁": sentencepiece's mark of a piece that begins a word


class SentencePieceTokenizer(Tokenizer):
  """A `Tokenizer` over a sentencepiece model file (unigram or BPE).

  Args:
    model_file: path of a .model file with the pieces [CLS] [SEP] [MASK], pad id 0 and an
      unknown piece, e.g. one written by `vocab_training.train_sentencepiece`.

  Raises:
    UserError: the file is missing or not a sentencepiece model, or the model lacks BERT's
      special pieces.
  """

  basic_tokenizer = False  # pieces are made from raw text: "(Zorbax)," is "▁(" "Zor" "bax" "),"

  def __init__(self, model_file: str):
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

  @property
  def model_proto(self) -> bytes:
    """The .model file's bytes (its pieces, scores and normalizer)."""
    return self._proto

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self._sp.encode(list(texts), out_type=int)  # sentencepiece's threads

  def decode(self, ids: Iterable[int]) -> str:
    return self._sp.decode([int(i) for i in ids])

  def span_text(self, ids: Iterable[int]) -> str:
    """The pieces joined, "▁" a space (run_squad's rule for "##" does not apply)."""
    text = "".join(map(self.id_to_token, ids)).replace(_WORD_START, " ")
    return " ".join(text.split())

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
    return self._word_start.copy(), punctuation_table(pieces, _WORD_START, not_text)

  def save(self, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, MODEL_FILE)
    write_atomically(path, self._proto)
    return path
