"""Training a sentencepiece vocabulary on a corpus, with BERT's special pieces.

  tok = load_or_train_sentencepiece(lambda: sentences, "workdir/vocab.model", 8000)

The corpus format is one sentence per line. sentencepiece reads at most MAX_SENTENCE_BYTES of a
line; a longer one (a whole document or file on one line) is skipped, and the user is told how
many were (or, if nothing is left to train on, gets one UserError saying so).
"""
from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable

import sentencepiece as spm
from absl import logging

from bertjax.errors import UserError
from bertjax.tokenization.sentencepiece_model import SentencePieceTokenizer
from bertjax.tokenization.tokenizer import CLS, MASK, PAD, SEP, UNK, write_atomically

MIN_VOCAB_SIZE = 64  # smaller cannot hold a corpus's characters and the special pieces
MAX_SENTENCE_BYTES = 4192  # sentencepiece's max_sentence_length (its default), in UTF-8 bytes


def too_long(sentence: str) -> bool:
  """Whether sentencepiece would skip `sentence`: over MAX_SENTENCE_BYTES in UTF-8, less the
  line breaks ending it (sentencepiece drops those before it measures)."""
  if len(sentence) <= MAX_SENTENCE_BYTES // 4:  # a character is at most 4 bytes
    return False
  return len(sentence.rstrip("\r\n").encode("utf-8", "surrogatepass")) > MAX_SENTENCE_BYTES


def skipped_lines(count: int, total: int) -> str:
  """What the user is told of the `count` lines of `total` that were skipped as too long."""
  return (f"{count} of {total} lines of the text are longer than sentencepiece's limit of "
          f"{MAX_SENTENCE_BYTES} bytes and were skipped; the corpus format is one sentence per "
          "line (a blank line between documents), so split such lines into sentences")


def train_sentencepiece(sentences: Iterable[str], model_prefix: str, vocab_size: int, *,
                        seed: int = 0, model_type: str = "unigram",
                        character_coverage: float = 0.9999,
                        input_sentence_size: int = 1_000_000) -> SentencePieceTokenizer:
  """Trains a sentencepiece model with BERT's special pieces and writes MODEL_PREFIX.model.

  Pieces 0-4 are [PAD] [UNK] [CLS] [SEP] [MASK] ([CLS] [SEP] [MASK] as control symbols, never
  produced from text). The vocabulary limit is soft: a corpus too small for `vocab_size` gets
  a smaller vocabulary (the tokenizer's `vocab_size` says how large). Training uses every core,
  at most `input_sentence_size` sentences (a seeded shuffle picks them), and the same seed and
  text give the same model. A sentence over MAX_SENTENCE_BYTES (UTF-8) is skipped, with a
  warning that says how many were.

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
    UserError: vocab_size too small, no text, or no sentence within MAX_SENTENCE_BYTES.
  """
  if vocab_size < MIN_VOCAB_SIZE:
    raise UserError(f"vocab_size={vocab_size} is too small; use {MIN_VOCAB_SIZE} or more "
                    "(BERT uses 30522, the tiny config a few thousand).")
  count, skipped, failure = [0], [0], []

  def counted():  # counts the sentences, and keeps an error of `sentences` to raise it again
    try:
      for sentence in sentences:
        if not sentence.strip():
          continue
        if too_long(sentence):  # skipped here, so the count is ours, not sentencepiece's
          skipped[0] += 1
          continue
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
        max_sentence_length=MAX_SENTENCE_BYTES,
        num_threads=os.cpu_count() or 1, hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=-1,
        eos_id=-1, pad_piece=PAD, unk_piece=UNK, control_symbols=[CLS, SEP, MASK],
        minloglevel=2)
  except RuntimeError as e:
    if failure:
      raise failure[0]
    if not count[0] and skipped[0]:
      raise UserError(f"no sentence to train the sentencepiece model on: each line of the text "
                      f"is longer than sentencepiece's limit of {MAX_SENTENCE_BYTES} bytes "
                      f"({skipped[0]} skipped); the corpus format is one sentence per line (a "
                      "blank line between documents): split the text into sentences.") from None
    if not count[0]:
      raise UserError("no text to train the sentencepiece model on; give a corpus with some "
                      "sentences.") from None
    message = str(e).strip().splitlines()[-1]
    note = f" ({skipped_lines(skipped[0], skipped[0] + count[0])})" if skipped[0] else ""
    raise UserError(f"sentencepiece training failed: {message.split('] ')[-1]}; give more text "
                    f"or a larger vocab_size{note}.") from None
  if failure:
    raise failure[0]
  if skipped[0]:
    logging.warning("sentencepiece vocabulary: %s.", skipped_lines(skipped[0],
                                                                    skipped[0] + count[0]))
  path = f"{model_prefix}.model"
  write_atomically(path, model.getvalue())
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
