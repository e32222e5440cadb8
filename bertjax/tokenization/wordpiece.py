"""The WordPiece backend: a `Tokenizer` over a BERT vocab.txt, with BERT's rules.

WordPiece (`WordPieceTokenizer`) follows BERT's rules through the `tokenizers` library: clean
the text, split CJK characters, lower-case and strip accents (uncased) or neither (cased), split
on whitespace and punctuation, then greedy longest-match pieces with "##" marking a piece that
continues a word; a word the vocabulary cannot spell, or one longer than the vocabulary's origin
allows, is [UNK]: 200 characters for a bare vocab.txt (Google's tokenization.py), a Hugging Face
tokenizer.json's own max_input_chars_per_word (100 in transformers) when one sits beside it
(`bertjax.tokenization.max_chars_per_word` reads which).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from bertjax.errors import UserError
from bertjax.tokenization.whole_word import punctuation_table
from bertjax.tokenization.tokenizer import (CLS, CONFIG_FILE, GOOGLE_MAX_CHARS_PER_WORD, MASK, PAD,
                                            SEP, UNK, VOCAB_FILE, TokenizersTokenizer,
                                            UnreadableVocabulary, write_atomically)


class WordPieceTokenizer(TokenizersTokenizer):
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

  basic_tokenizer = True  # BERT's rules split words before the pieces (the contract's default)

  def __init__(self, vocab_file: str, *, lowercase: bool = True,
               max_input_chars_per_word: int = GOOGLE_MAX_CHARS_PER_WORD):
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

  def span_text(self, ids: Iterable[int]) -> str:
    """run_squad's rule: the pieces joined by spaces, "##" continuations glued on."""
    text = " ".join(map(self.id_to_token, ids)).replace(" ##", "").replace("##", "")
    return " ".join(text.split())

  def id_to_token(self, i: int) -> str:
    if not 0 <= int(i) < self.vocab_size:
      raise IndexError(f"id {i} is outside the vocabulary [0, {self.vocab_size})")
    return self._tokens[int(i)]

  def token_to_id(self, token: str) -> int:
    return self._ids.get(token, self.unk_id)

  def is_word_start(self, ids: np.ndarray) -> np.ndarray:
    return self._word_start[np.asarray(ids)]

  def word_boundary_tables(self) -> tuple[np.ndarray, np.ndarray]:
    return self._word_start.copy(), punctuation_table(self._tokens, "##", self.special_ids)

  def save(self, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, VOCAB_FILE)
    write_atomically(path, "".join(t + "\n" for t in self._tokens).encode("utf-8"))
    config = {"do_lower_case": self.lowercase, "strip_accents": None,
              "tokenize_chinese_chars": True, "tokenizer_class": "BertTokenizer",
              "max_input_chars_per_word": self.max_input_chars_per_word}
    write_atomically(os.path.join(directory, CONFIG_FILE),
                     (json.dumps(config, indent=2) + "\n").encode("utf-8"))
    return path


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
