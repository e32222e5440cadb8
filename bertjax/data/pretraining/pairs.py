"""NSP segment pairs and contiguous spans: tokenized documents -> (A, B) rows (sec. 3.1, 5.1).

Follows the rules of google-research/bert's create_pretraining_data.py:

* `create_segment_pairs` packs sentences into `[CLS] A [SEP] B [SEP]` pairs. A chunk of
  consecutive sentences is filled up to a target length (`max_seq_length - 3`, or with
  probability `short_seq_prob` a random shorter one); A is a random prefix of the chunk; B is the
  rest of the chunk (label 0, "is next") or, half of the time and always when the chunk has a
  single sentence, text from a random other document (label 1, "random next"), in which case
  the chunk's unused sentences are put back for the next chunk. The pair is then cut to fit by
  removing tokens one at a time from the longer side, at its front or its back at random.

For the paper's No NSP and left-to-right ablations (section 5.1), `iter_contiguous_spans` makes
examples of contiguous text instead: each a span of one document's text filling the whole
length, as RoBERTa's DOC-SENTENCES (Liu et al. 2019), cut into A and B at a sentence boundary
chosen as the original chooses a_end, so that the ablations keep BERT's input representation
and train both segment embeddings: `[CLS] A [SEP] B [SEP]`, segment ids 0 then 1, B always the
text that follows A (no NSP label is used). Data prepared before (layout.FORMAT 1) holds
single-segment spans `[CLS] span [SEP]`, stored and padded as pairs whose B is empty
(`pad_pairs`). masking.py masks the rows.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from absl import logging

from bertjax.data.pretraining.masking import SpecialTokens
from bertjax.errors import UserError

# Keys of an example set (and of a batch, see loader.py). Unmasked sets have these four.
PAIR_KEYS = ("input_ids", "segment_ids", "input_mask", "next_sentence_label")


# ----------------------------------------------------------------------------------------------
# Next sentence prediction: segment pairs.


def create_segment_pairs(documents: Sequence[Sequence[Sequence[int]]], max_seq_length: int,
                         short_seq_prob: float, rng: np.random.Generator, special: SpecialTokens,
                         dupe_factor: int = 1) -> dict[str, np.ndarray]:
  """Turns tokenized documents into unmasked `[CLS] A [SEP] B [SEP]` pairs, padded.

  Args: as `iter_segment_pairs`, plus special: the [CLS] / [SEP] / [PAD] ids.

  Returns:
    Example set with keys `input_ids`, `segment_ids`, `input_mask` [N, max_seq_length] int32
    (0 after the real tokens) and `next_sentence_label` [N] int32 (1 = B is random, 0 = B
    follows A), in document order.
  """
  return pad_pairs(list(iter_segment_pairs(documents, max_seq_length, short_seq_prob, rng,
                                           dupe_factor)), max_seq_length, special)


def iter_segment_pairs(documents: Sequence[Sequence[Sequence[int]]], max_seq_length: int,
                       short_seq_prob: float, rng: np.random.Generator, dupe_factor: int = 1
                       ) -> Iterator[tuple[np.ndarray, np.ndarray, bool]]:
  """Yields the NSP segment pairs of tokenized documents, one at a time (module docstring).

  Args:
    documents: documents -> sentences -> token ids (no special tokens). Empty sentences and
      documents are dropped. B is taken from another document when it is random, so a corpus
      needs two documents or more; with one, random B comes from the same document (warned).
    max_seq_length: length of each row, special tokens and padding included (>= 5).
    short_seq_prob: chance that a document pass targets a random shorter length.
    rng: the generator all choices are drawn from, in document order.
    dupe_factor: passes over the corpus (each pass pairs the sentences differently).

  Yields:
    (A token ids, B token ids, is_random_next), with len(A) + len(B) <= max_seq_length - 3.
  """
  if max_seq_length < 5:
    raise UserError(f"max_seq_length={max_seq_length} leaves no room for [CLS] A [SEP] B [SEP]; "
                    "use 5 or more (128 or 512 as in the paper).")
  if dupe_factor < 1:
    raise UserError(f"dupe_factor={dupe_factor}; use 1 or more.")
  docs = [[np.asarray(s, np.int32) for s in doc if len(s)] for doc in documents]
  docs = [d for d in docs if d]
  if not docs:
    raise UserError("the corpus has no tokens; give text files with one sentence per line and "
                    "a blank line between documents.")
  if len(docs) == 1:
    logging.warning("The corpus is a single document, so 'random next' segments come from the "
                    "same document; separate documents with blank lines for a real NSP task.")
  max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
  for _ in range(dupe_factor):
    for doc_index in range(len(docs)):
      yield from _pairs_from_document(docs, doc_index, max_num_tokens, short_seq_prob, rng)


def row_length(len_a: int, len_b: int) -> int:
  """Tokens of the row of a pair: `[CLS] A [SEP] B [SEP]`, or `[CLS] A [SEP]` when B is empty
  (a contiguous span of one token, or any span of data prepared before layout.FORMAT 2; NSP
  pairs never have an empty B)."""
  return len_a + len_b + (3 if len_b else 2)


def pad_pairs(pairs: Sequence[tuple[np.ndarray, np.ndarray, bool]], max_seq_length: int,
              special: SpecialTokens) -> dict[str, np.ndarray]:
  """(A, B, is_random_next) pairs -> the padded example set of `create_segment_pairs`; a pair
  with an empty B (a single-segment span, `row_length`) becomes `[CLS] A [SEP]`, segment ids all
  0."""
  n = len(pairs)
  input_ids = np.full((n, max_seq_length), special.pad, np.int32)
  segment_ids = np.zeros((n, max_seq_length), np.int32)
  input_mask = np.zeros((n, max_seq_length), np.int32)
  for row, (a, b, _) in enumerate(pairs):
    la, lb = len(a), len(b)
    input_ids[row, 0] = special.cls
    input_ids[row, 1:1 + la] = a
    input_ids[row, 1 + la] = special.sep
    if lb:
      input_ids[row, 2 + la:2 + la + lb] = b
      input_ids[row, 2 + la + lb] = special.sep
      segment_ids[row, 2 + la:3 + la + lb] = 1  # B and its [SEP]
    input_mask[row, :row_length(la, lb)] = 1
  labels = np.array([int(is_random) for _, _, is_random in pairs], np.int32)
  return {"input_ids": input_ids, "segment_ids": segment_ids, "input_mask": input_mask,
          "next_sentence_label": labels}


def _pairs_from_document(docs: list[list[np.ndarray]], doc_index: int, max_num_tokens: int,
                         short_seq_prob: float,
                         rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, bool]]:
  """One pass over one document: (A tokens, B tokens, is_random_next) per pair, cut to fit."""
  document = docs[doc_index]
  # Usually fill the whole sequence; sometimes aim shorter, to look more like fine-tuning inputs.
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = int(rng.integers(2, max_num_tokens, endpoint=True))

  pairs = []
  chunk: list[np.ndarray] = []
  chunk_length = 0
  i = 0
  while i < len(document):
    chunk.append(document[i])
    chunk_length += len(document[i])
    if i == len(document) - 1 or chunk_length >= target_seq_length:
      # How many of the chunk's sentences go into A.
      a_end = 1
      if len(chunk) >= 2:
        a_end = int(rng.integers(1, len(chunk) - 1, endpoint=True))
      tokens_a = np.concatenate(chunk[:a_end])
      if len(chunk) == 1 or rng.random() < 0.5:
        is_random_next = True
        target_b_length = target_seq_length - len(tokens_a)
        random_document = docs[_other_document(len(docs), doc_index, rng)]
        start = int(rng.integers(len(random_document)))
        pieces, b_length = [], 0
        for sentence in random_document[start:]:
          pieces.append(sentence)
          b_length += len(sentence)
          if b_length >= target_b_length:
            break
        tokens_b = np.concatenate(pieces)
        i -= len(chunk) - a_end  # put the unused sentences back
      else:
        is_random_next = False
        tokens_b = np.concatenate(chunk[a_end:])
      tokens_a, tokens_b = _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
      pairs.append((tokens_a, tokens_b, is_random_next))
      chunk, chunk_length = [], 0
    i += 1
  return pairs


def _other_document(num_docs: int, doc_index: int, rng: np.random.Generator) -> int:
  """A uniformly random document index other than doc_index (doc_index itself if it is alone)."""
  if num_docs == 1:
    return doc_index
  other = int(rng.integers(num_docs - 1))
  return other + (other >= doc_index)


def _truncate_pair(tokens_a: np.ndarray, tokens_b: np.ndarray, max_num_tokens: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """Removes tokens from the longer of A and B (B on a tie), at its front or back at random
  (one coin per token removed), until len(A) + len(B) <= max_num_tokens."""
  la, lb = len(tokens_a), len(tokens_b)
  excess = la + lb - max_num_tokens
  if excess <= 0:
    return tokens_a, tokens_b
  from_front = rng.random(excess) < 0.5  # [excess], one coin per removed token
  cut = {"a": [0, 0], "b": [0, 0]}  # side -> [front, back] tokens removed
  for coin in from_front:
    side = "a" if la > lb else "b"
    cut[side][0 if coin else 1] += 1
    if side == "a":
      la -= 1
    else:
      lb -= 1
  (af, ab), (bf, bb) = cut["a"], cut["b"]
  return tokens_a[af:len(tokens_a) - ab], tokens_b[bf:len(tokens_b) - bb]

# ----------------------------------------------------------------------------------------------
# No NSP and left-to-right LM: contiguous spans.


def iter_contiguous_spans(documents: Sequence[Sequence[Sequence[int]]], max_seq_length: int,
                          rng: np.random.Generator, dupe_factor: int = 1
                          ) -> Iterator[tuple[np.ndarray, np.ndarray, bool]]:
  """Yields the contiguous spans of tokenized documents, each cut into two segments: the
  examples `[CLS] A [SEP] B [SEP]` of the paper's No NSP and LTR models (section 5.1).

  Each document's sentences are joined into one stream of tokens and cut into spans of
  max_seq_length - 3 tokens (room for [CLS] and two [SEP]), the last span of a document shorter;
  no span crosses a document's end. Pass p of `dupe_factor` starts cutting at token
  p * (max_seq_length - 3) // dupe_factor (its first span is that short), so each pass cuts the
  text at other places, as each of the original's passes pairs it differently. Every token is
  in one span of each pass.

  A span is then cut into A and B at one of the sentence boundaries inside it, drawn uniformly
  as the original draws a_end among a chunk's sentences; a span inside one sentence is cut at a
  random token instead. A span of one token stays whole: (span, empty B), `[CLS] span [SEP]`.

  Args:
    documents: documents -> sentences -> token ids (no special tokens); empty ones dropped.
    max_seq_length: length of each row, [CLS] and two [SEP] included (>= 5).
    rng: the generator of the cuts into A and B, one draw a span (of two tokens or more), in
      document order.
    dupe_factor: passes over the documents.

  Yields:
    (A token ids, B token ids, False): [len_a] and [len_b] int32, the span's text in order,
    1 <= len_a + len_b <= max_seq_length - 3, len_b = 0 only for a span of one token.
  """
  if max_seq_length < 5:
    raise UserError(f"max_seq_length={max_seq_length} leaves no room for [CLS] A [SEP] B [SEP]; "
                    "use 5 or more (128 or 512 as in the paper).")
  if dupe_factor < 1:
    raise UserError(f"dupe_factor={dupe_factor}; use 1 or more.")
  span = max_seq_length - 3
  docs = [[np.asarray(s, np.int32) for s in doc if len(s)] for doc in documents]
  docs = [d for d in docs if d]
  streams = [np.concatenate(doc) for doc in docs]  # [tokens of a document]
  starts = [np.cumsum([len(s) for s in doc])[:-1] for doc in docs]  # where sentences 2.. start
  for dupe in range(dupe_factor):
    shift = dupe * span // dupe_factor  # where pass `dupe` first cuts
    for tokens, boundaries in zip(streams, starts):
      cuts = [0, *range(shift or span, len(tokens), span), len(tokens)]
      for start, stop in zip(cuts, cuts[1:]):
        if stop - start == 1:
          yield tokens[start:stop], tokens[stop:stop], False
        elif stop > start:
          inside = boundaries[(boundaries > start) & (boundaries < stop)]
          choices = inside if len(inside) else np.arange(start + 1, stop)
          cut = int(choices[rng.integers(len(choices))])
          yield tokens[start:cut], tokens[cut:stop], False
