"""Google's whole-word rule: which pieces are punctuation, and where words begin.

Whole-word masking (create_pretraining_data.py) masks a word's pieces together. A tokenizer
gives two per-id tables (`Tokenizer.word_boundary_tables`, built with `punctuation_table`), and
`word_starts` applies them to rows of token ids.
"""
from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np


def is_punctuation(char: str) -> bool:
  """Whether one character is punctuation by Google's BERT (tokenization.py `_is_punctuation`):
  ASCII 33-47, 58-64, 91-96 and 123-126 (so "$", "^", "`" count), or any Unicode category P*."""
  cp = ord(char)
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(char).startswith("P")


def punctuation_table(pieces: Sequence[str], mark: str, not_text: Iterable[int]) -> np.ndarray:
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
