"""The benchmark's rows: real ones (the bundled corpus prepared at a row's shape, with its
recipe's masking and packing, and the first batch of the training stream, as the trainer reads
it) or synthetic ones (`bench_batch.make_batch`), and what a batch holds (`layout`).

`real_batch(config, rows_dir)` runs the trainer's own data path, `bertjax.tasks.pretraining.
make_task` (which prepares the text with `bertjax.data.prepare`'s library and streams batches
with `bertjax.data.pretraining.loader`), on the bundled corpus (or its first `documents`
documents, chapters), and returns the first global batch of its training stream: packed NSP
pairs for configs/base.py:fast (up to 3 a row, the prediction slots a packed row can fill), one
padded pair a row for configs/base.py, contiguous spans for ModernBERT (one document's text a
row at most, so at 8,192 tokens the corpus's chapters fill under half of it). The preparation
is kept in ROWS_DIR/seq{L}-HASH (HASH of its flags), so only the first row of a shape prepares
it.

What differs from a training run, and why the step's cost does not: the vocabulary is a
sentencepiece one of ROWS_VOCAB_SIZE (8,000) pieces trained on those documents, whatever the
model's (30,522 for BERT, 50,368 for ModernBERT), so the ids use only the first rows of the
model's table; the cost of a step depends on the layout (the sequences' lengths, the packing, the
real tokens and prediction slots), not on the ids. The text is turned into pairs once
(dupe_factor 1). A smaller vocabulary cuts words into a few more pieces than 30,522 would.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from typing import Any, NamedTuple

import ml_collections
import numpy as np

from bertjax import run_config
from bertjax.data import sources
from bertjax.errors import UserError
from bertjax.tasks import pretraining, pretraining_data
from bertjax.tools.bench_batch import make_batch
from bertjax.training import flops, train
from bertjax.workdir import DATA_DIR

ROWS_VOCAB_SIZE = 8000
DOCUMENTS = 0  # of the bundled corpus's 269 chapters, 0 = all (3 s to prepare at 128 tokens, 6 s
# at 1,024, on 2 CPU cores)


def default_rows_dir() -> str:
  """Where the real rows are prepared by default: $XDG_CACHE_HOME/bertjax/bench_rows (else
  ~/.cache/bertjax/bench_rows)."""
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "bertjax", "bench_rows")


def corpus_documents(rows_dir: str, documents: int) -> str:
  """The text file of the bundled corpus's first `documents` documents (0 = the corpus
  itself), written once into rows_dir as the corpus has them (a blank line between documents)."""
  if documents < 0:
    raise UserError(f"--rows_documents={documents}; use 0 (all 269 documents) or more.")
  if not documents:
    return sources.BUNDLED_CORPUS
  path = os.path.join(rows_dir, f"bundled_corpus_first{documents}.txt")
  if not os.path.exists(path):
    with open(sources.BUNDLED_CORPUS, encoding="utf-8") as f:
      parts = [p for p in re.split(r"\n\s*\n", f.read()) if p.strip()]
    os.makedirs(rows_dir, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write("\n\n".join(parts[:documents]) + "\n")
    os.replace(tmp, path)
  return path


def rows_run_config(config: ml_collections.ConfigDict, rows_dir: str,
                    documents: int = DOCUMENTS) -> run_config.PretrainingRun:
  """`config` (a row's, `bench_recipe.row_config`) with the real rows' text and vocabulary
  (module docstring), typed."""
  config = ml_collections.ConfigDict(config.to_dict())  # a copy
  data = config.data
  data.input_files = corpus_documents(rows_dir, documents)
  data.tfds_name = data.prepared = data.vocab_model = ""
  data.vocab_size = ROWS_VOCAB_SIZE
  data.dupe_factor = 1
  config.init_checkpoint = ""
  return run_config.typed(config, run_config.PretrainingRun)


def data_dir(config: run_config.PretrainingRun, rows_dir: str) -> str:
  """The workdir a rows config is prepared in (into its data/): ROWS_DIR/seq{L}-HASH (HASH: its
  prepare flags)."""
  flags = json.dumps(pretraining_data.prepare_options(config).to_json(), sort_keys=True)
  digest = hashlib.sha256(flags.encode()).hexdigest()[:12]
  return os.path.join(rows_dir, f"seq{config.data.max_seq_length}-{digest}")


class RealRows(NamedTuple):
  """A real batch and where it came from."""
  batch: dict[str, np.ndarray]  # the trainer's keys (real_batch)
  directory: str  # the prepared data it was read from (bertjax.data.prepare's DATA)
  vocab_size: int  # of its vocabulary: the model needs at least as many rows


def real_batch(config: ml_collections.ConfigDict, rows_dir: str, documents: int = DOCUMENTS
               ) -> RealRows:
  """The first global batch of the trainer's stream for a row's config, on real text.

  Args:
    config: the row's config (`bench_recipe.row_config`): its data.max_seq_length,
      max_predictions_per_seq, masked_lm_prob, packing and max_sequences_per_row, its objective
      (NSP pairs, or ModernBERT's spans) and train.batch_size rows are the batch's.
    rows_dir: where the preparations are kept (created if absent).
    documents: the bundled corpus's first documents to prepare (0 = all 269).
  Returns:
    RealRows. Its batch has the trainer's keys (`loader.BATCH_KEYS`: input_ids, segment_ids,
    input_mask [batch, seq] int32, masked_lm_* [batch, predictions], next_sentence_label and
    example_weight [batch]; packed rows `loader.PACKED_BATCH_KEYS`, with position_ids,
    sequence_ids [batch, seq], cls_positions and the per-pair keys [batch, k]).
  Raises:
    UserError: the config cannot run (its checks, e.g. an attention path this backend lacks,
      before any text is prepared), or the text has fewer rows than the batch.
  """
  typed = rows_run_config(config, rows_dir, documents)
  workdir = data_dir(typed, rows_dir)
  with contextlib.redirect_stdout(sys.stderr):  # the task's one line on its data
    task = pretraining.make_task(typed, workdir, train.run_context(typed))
  stream = task.batches.train(None)
  try:
    batch, _ = next(stream)
  except UserError as e:  # fewer rows than the batch, said in the trainer's words
    raise UserError(f"{str(e).rstrip('.')}; for the benchmark, more documents (--rows_documents, "
                    f"now {documents}; 0 = all 269) or a smaller --batch_size.") from None
  finally:
    stream.close()
  return RealRows({key: np.asarray(value) for key, value in batch.items()},
                  os.path.join(workdir, DATA_DIR), task.model.config.vocab_size)


def row_batch(config: ml_collections.ConfigDict, rows: str, vocab_size: int, rows_dir: str,
              documents: int, packing: int = 0) -> tuple[dict[str, np.ndarray], str]:
  """A benchmark row's batch and where it came from ("" for synthetic rows).

  Args:
    config: the row's config (`bench_recipe.row_config`).
    rows: "real" (`real_batch`, in rows_dir, "" = `default_rows_dir()`) or "synthetic"
      (`make_batch` of the config's shapes, `packing` equal sequences a row).
    vocab_size: the model's; real rows need no more ids than it has rows.
  """
  data = config.data
  if rows == "synthetic":
    return make_batch(vocab_size, config.train.batch_size, data.max_seq_length,
                      data.max_predictions_per_seq, packing=packing), ""
  real = real_batch(config, rows_dir or default_rows_dir(), documents)
  if real.vocab_size > vocab_size:
    raise UserError(f"--vocab_size={vocab_size} is smaller than the real rows' vocabulary "
                    f"({real.vocab_size} pieces); use {ROWS_VOCAB_SIZE} or more, or "
                    "--rows=synthetic.")
  return real.batch, real.directory


def layout(batch: dict[str, np.ndarray], work: flops.Work) -> dict[str, Any]:
  """What a batch holds, as the benchmark reports it: packing (sequences a row at most, 0
  unpacked), sequences, tokens (real), fill (real tokens / slots), predictions (real) and
  prediction_slots (a row's); `work` is its `flops.work_of`."""
  return dict(packing=int(batch["cls_positions"].shape[1]) if "cls_positions" in batch else 0,
              sequences=work.sequences, tokens=work.tokens,
              fill=work.tokens / batch["input_ids"].size, predictions=work.predictions,
              prediction_slots=int(batch["masked_lm_positions"].shape[1]))
