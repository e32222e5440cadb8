"""The prepared data of a pretraining run: its vocabulary, where the text is prepared (or found),
and the checks that prepared data can serve the config.

A run takes `data.prepared` (a directory made by `python -m bertjax.data.prepare`) or prepares
its text into WORKDIR/data on first use and reuses it after. The vocabulary is
`data.vocab_model`, else `init_checkpoint`'s (continued pretraining keeps the vocabulary its
embeddings were trained with), else one trained on the text. Every check raises a UserError
naming the fix before any step.
"""
from __future__ import annotations

import os

from absl import logging
import jax
from jax.experimental import multihost_utils

from bertjax import run_config, tokenization
from bertjax.data import sources
from bertjax.data.pretraining import layout, loader, preparation
from bertjax.errors import UserError
from bertjax.modeldir import model_files, saved_params
from bertjax.workdir import DATA_DIR


def checkpoint_vocabulary(config: run_config.PretrainingRun) -> str:
  """The vocabulary file (vocab.model, vocab.txt or, with neither, a byte-level BPE
  tokenizer.json: ModernBERT's) of init_checkpoint's model directory, the one its embeddings were
  trained with; "" without an init_checkpoint, or without such a file when data.vocab_model is
  given.

  Raises:
    UserError: no such file and no data.vocab_model: embeddings without their vocabulary mean
      nothing.
  """
  if not config.init_checkpoint:
    return ""
  try:
    directory = model_files.find_model_dir(config.init_checkpoint)
  except UserError:  # no bert_config.json: look beside the checkpoint itself
    directory = os.path.abspath(config.init_checkpoint)
  for name in (tokenization.MODEL_FILE, tokenization.VOCAB_FILE, tokenization.HF_TOKENIZER_FILE):
    if os.path.isfile(os.path.join(directory, name)):
      return os.path.join(directory, name)
  if config.data.vocab_model:
    return ""
  raise UserError(f"init_checkpoint {config.init_checkpoint} has no vocabulary: no "
                  f"{tokenization.MODEL_FILE}, {tokenization.VOCAB_FILE} or "
                  f"{tokenization.HF_TOKENIZER_FILE} in {directory}, and its "
                  "embeddings mean nothing without the vocabulary they were trained with; pass "
                  "that vocabulary as --config.data.vocab_model=FILE.")


def vocabulary(config: run_config.PretrainingRun) -> str:
  """The vocabulary file the text is prepared with: data.vocab_model, else init_checkpoint's,
  else "" (a sentencepiece model is trained on the text)."""
  return config.data.vocab_model or checkpoint_vocabulary(config)


def check_vocabulary(config: run_config.PretrainingRun) -> None:
  """Before anything is written: UserError if init_checkpoint is missing, has no vocabulary
  (and data.vocab_model is not given), or data.vocab_model has another size than its
  vocabulary; a warning if data.vocab_model is another vocabulary of the same size (each row of
  the embeddings then stands for another piece)."""
  if not config.init_checkpoint:
    return
  saved_params.find_step_dir(config.init_checkpoint)  # a missing or empty path, named now
  given, theirs = config.data.vocab_model, checkpoint_vocabulary(config)
  if not given or not theirs:
    return
  mine, its = tokenization.load_tokenizer(given), tokenization.load_tokenizer(theirs)
  if mine.vocab_size != its.vocab_size:
    raise UserError(f"data.vocab_model={given} has {mine.vocab_size} pieces, but the embeddings "
                    f"of init_checkpoint are rows of its vocabulary {theirs}, {its.vocab_size} "
                    f"pieces; drop data.vocab_model to continue with {theirs}, or drop "
                    "init_checkpoint to pretrain from scratch on the other vocabulary.")
  if preparation.vocab_sha256(mine) != preparation.vocab_sha256(its):
    logging.warning(
        "data.vocab_model=%s is another vocabulary than %s, the one init_checkpoint's "
        "embeddings were trained with (both %d pieces): each embedding row now stands for "
        "another piece. Continuing as asked; drop data.vocab_model to keep %s.",
        given, theirs, its.vocab_size, theirs)


def prepare_options(config: run_config.PretrainingRun) -> layout.Options:
  """The bertjax.data.prepare flags of the text a config names (default: the bundled corpus)."""
  data = config.data
  lengths = [data.max_seq_length] + ([data.long_seq_length] if data.long_seq_length else [])
  predictions = [data.max_predictions_per_seq] + (
      [data.long_max_predictions_per_seq] if data.long_seq_length else [])
  source = data.input_files or sources.BUNDLED_CORPUS
  if data.tfds_name:
    source = f"tfds:{data.tfds_name}:{data.tfds_split}"
  return layout.Options(
      input=source, vocab=vocabulary(config), vocab_size=data.vocab_size,
      max_seq_length=tuple(lengths), max_predictions_per_seq=tuple(predictions),
      dupe_factor=data.dupe_factor, short_seq_prob=data.short_seq_prob,
      eval_fraction=data.eval_fraction, static_masks=not data.dynamic_masking,
      masked_lm_prob=data.masked_lm_prob, whole_word_masking=data.whole_word_masking,
      seed=config.seed, max_sequences_per_row=data.max_sequences_per_row,
      tfds_feature=data.tfds_feature, tfds_data_dir=data.tfds_data_dir,
      contiguous=not config.pretraining.uses_nsp)


def prepared_data(config: run_config.PretrainingRun, workdir: str) -> loader.PreparedData:
  """`data.prepared`, or the config's text prepared into WORKDIR/data (by host 0; the others
  wait for it, so WORKDIR must be shared) on first use and reused after."""
  if config.data.prepared:
    return loader.PreparedData(config.data.prepared)
  directory = os.path.join(workdir, DATA_DIR)
  if jax.process_index() == 0:
    preparation.prepare(prepare_options(config), directory, workers=config.data.prepare_workers)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("bertjax: pretraining data prepared")
    if not os.path.isfile(os.path.join(directory, layout.INFO_FILE)):
      raise UserError(f"host {jax.process_index()} does not see {directory}, which host 0 "
                      "prepared: the workdir is not shared. Prepare the data once with "
                      "python -m bertjax.data.prepare into a directory every host reads, and "
                      "pass --config.data.prepared=DIR.")
  return loader.PreparedData(directory)


def data_tokenizer(data: loader.PreparedData, workdir: str) -> tokenization.Tokenizer:
  """The tokenizer of prepared data; UserError naming the fix for its own copy of the vocabulary
  if that file is damaged (empty or corrupt): the workdir's copy, or preparing the text again."""
  try:
    return data.tokenizer()
  except tokenization.UnreadableVocabulary as e:
    copy = os.path.join(workdir, os.path.basename(e.path))
    restore = f"copy {copy} (the run's copy of it) over it, or " if _same_vocabulary(
        copy, data.info["vocab"]["sha256"]) else ""
    again = ("and rerun: the text is prepared again" if data.directory == os.path.join(
        workdir, DATA_DIR) else "and prepare the text again (python -m bertjax.data.prepare)")
    raise UserError(f"{e.path} {e.problem}; it is the vocabulary of the data prepared in "
                    f"{data.directory}: {restore}delete {data.directory} {again}.") from None


def _same_vocabulary(path: str, sha256: str) -> bool:
  """Whether `path` is a readable vocabulary file with this vocab_sha256."""
  if not os.path.isfile(path):
    return False
  try:
    return preparation.vocab_sha256(tokenization.load_tokenizer(path)) == sha256
  except UserError:
    return False


def check_prepared(data: loader.PreparedData, config: run_config.PretrainingRun) -> None:
  """UserError, before any step, if prepared data cannot serve the run: another vocabulary,
  no pairs at a sequence length a phase needs, stored masks of another kind, or (packing) no
  packing plans or plans of another max_sequences_per_row."""
  given = vocabulary(config)
  if given:
    given_tok = tokenization.load_tokenizer(given)
    if preparation.vocab_sha256(given_tok) != data.info["vocab"]["sha256"]:
      if config.data.vocab_model:
        raise UserError(f"{data.directory} was prepared with another vocabulary than "
                        f"data.vocab_model={given}; drop data.vocab_model (the data's own, "
                        f"{data.info['vocab']['file']}, is used) or prepare the text again with "
                        "it.")
      raise UserError(f"{data.directory} was prepared with another vocabulary than {given}, the "
                      "one init_checkpoint's embeddings were trained with; prepare the text "
                      f"again with it (--vocab={given}), or set data.vocab_model to the data's "
                      "own to use it anyway.")
  for length, field in ((config.data.max_seq_length, "max_seq_length"),
                        (config.data.long_seq_length, "long_seq_length")):
    if length and length not in data.lengths:
      raise UserError(f"{data.directory} holds pairs of {', '.join(map(str, data.lengths))} "
                      f"tokens, not the {length} of data.{field}; prepare it with "
                      f"--max_seq_length={','.join(map(str, sorted({*data.lengths, length})))}, "
                      f"or set data.{field} to a length it holds.")
  if data.flags["whole_word_masking"] != config.data.whole_word_masking and \
      data.flags["static_masks"]:
    raise UserError(f"{data.directory} stores masks made with whole_word_masking="
                    f"{data.flags['whole_word_masking']}; set data.whole_word_masking to match.")
  if config.data.packing:
    _check_packs(data, config)
  if not config.pretraining.uses_nsp:
    _check_spans(data, config)


def _check_spans(data: loader.PreparedData, config: run_config.PretrainingRun) -> None:
  """UserError unless every phase's length has contiguous spans (prepare --contiguous=true)."""
  for length in (config.data.max_seq_length, config.data.long_seq_length):
    if length and not data.has_contiguous(length):
      which = ("pretraining.objective=ltr" if config.pretraining.left_to_right
               else "pretraining.nsp=false")
      raise UserError(f"{which} trains on contiguous spans, which {data.directory} lacks at "
                      f"{length} tokens; prepare the text with --contiguous=true (python -m "
                      "bertjax.data.prepare, into a new directory, with the other flags of its "
                      f"{layout.INFO_FILE}), or drop data.prepared to prepare it into the "
                      "workdir.")


def _check_packs(data: loader.PreparedData, config: run_config.PretrainingRun) -> None:
  """UserError unless every phase's pairs have packing plans of data.max_sequences_per_row."""
  again = (f"prepare it again (python -m bertjax.data.prepare into a new directory, "
           f"--max_sequences_per_row={config.data.max_sequences_per_row})"
           if config.data.prepared else f"delete {data.directory} and rerun: the text is "
           "prepared again")
  for length in (config.data.max_seq_length, config.data.long_seq_length):
    if length and not data.has_packs(length):
      raise UserError(f"data.packing=true needs packing plans, which {data.directory} lacks at "
                      f"{length} tokens (it was prepared by an older bertjax); {again}, or set "
                      "data.packing=false.")
  if data.max_sequences_per_row() != config.data.max_sequences_per_row:
    raise UserError(f"{data.directory} plans packs of at most {data.max_sequences_per_row()} "
                    f"pairs, not the {config.data.max_sequences_per_row} of "
                    "data.max_sequences_per_row; set data.max_sequences_per_row="
                    f"{data.max_sequences_per_row()}, or {again}.")
