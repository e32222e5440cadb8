"""A pretraining data preparation as a whole: the plan, the vocabulary, the workers, info.json.

`prepare` (what `python -m bertjax.data.prepare` runs) cuts the input into text shards
(text_shards.py) and writes DATA/plan.json, copies the given vocabulary into DATA or trains a
sentencepiece model there on training sentences only, from text shards taken in a seeded order,
then runs shard_work.process_text_shard for every unfinished text shard in --workers local
processes or as an Apache Beam pipeline (beam.py), and last sums the shards' counts into
DATA/info.json. A rerun with the same flags resumes: finished text shards are kept. One run at a
time prepares a DATA: it holds DATA/.lock (bertjax.lock.Lock) from before it looks at DATA
until it ends, and a second run is refused naming the first, touching nothing.
"""
from __future__ import annotations

import glob
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

import numpy as np
from tqdm import tqdm

from bertjax import lock, tokenization
from bertjax.data.pretraining import layout, packing, shard_work, shards, text_shards
from bertjax.errors import UserError


def prepare(options: layout.Options, output_dir: str, workers: int = 0, runner: str = "",
            pipeline_args: Sequence[str] = (), progress: bool = True) -> dict:
  """Prepares (or finishes preparing) DATA = output_dir; returns its info.json.

  Args:
    options: the flags that decide the data.
    output_dir: a new or empty directory, or one this function was run on with the same options
      (finished text shards are kept; a finished one is returned as it is).
    workers: processes on this machine (0 = every core); ignored with a Beam runner.
    runner: "" for local processes, or a Beam runner name (DirectRunner, DataflowRunner, ...).
    pipeline_args: further Beam pipeline flags.
    progress: show a progress bar.

  Raises:
    UserError: a flag cannot work, output_dir holds something else, or another run is
      preparing it (DATA/.lock names that run; nothing is touched).
  """
  options.check()
  if runner:  # a wrong runner or flag is told before any work
    _beam().check(runner, pipeline_args)
  if os.path.isfile(os.path.join(output_dir, layout.INFO_FILE)):  # finished: read, not locked
    return _check_output_dir(output_dir, options)
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise UserError(f"--output_dir={output_dir} is a file; give a new or empty directory.")
  created = not os.path.exists(output_dir)
  data_lock = lock.Lock.take(output_dir, flag="--output_dir")
  try:
    existing = _check_output_dir(output_dir, options)  # another run may have finished it
    if existing is not None:
      return existing
    try:
      return _prepare(options, output_dir, workers, runner, pipeline_args, progress)
    except UserError:
      written = glob.glob(os.path.join(output_dir, "*", "*" + shards.SUFFIX))
      if created and not written:  # bad input before any work worth keeping: leave nothing
        _remove_all_but_the_lock(output_dir)
      raise
  finally:
    data_lock.release()  # and output_dir too, if this run created it and left it empty


def _beam():
  """bertjax.data.pretraining.beam, imported here only: it is imported by the runs that use
  Apache Beam (--runner), a heavy optional dependency the local runs do without."""
  from bertjax.data.pretraining import beam  # pylint: disable=import-outside-toplevel
  return beam


def _prepare(options: layout.Options, output_dir: str, workers: int, runner: str,
             pipeline_args: Sequence[str], progress: bool) -> dict:
  """prepare() on a checked output directory whose lock this run holds."""
  plan_path = os.path.join(output_dir, layout.PLAN_FILE)
  if not os.path.exists(plan_path):
    specs = text_shards.plan_text_shards(options)
    vocab_file = _vocabulary(options, specs, output_dir)
    layout.write_json(plan_path, {"format": layout.FORMAT, "flags": options.to_json(),
                                  "vocab_file": vocab_file, "text_shards": specs})
  with open(plan_path) as f:
    plan = json.load(f)
  _remove_partial_files(output_dir)
  todo = [i for i in range(len(plan["text_shards"]))
          if not os.path.exists(layout.done_path(output_dir, i))]
  if runner:
    _beam().run(output_dir, todo, runner, pipeline_args)
  else:
    _run_local(output_dir, todo, workers or os.cpu_count() or 1, plan, progress)
  return _write_info(output_dir, plan)


def _check_output_dir(output_dir: str, options: layout.Options) -> dict | None:
  """The info of a finished DATA made with `options`, None for a new or resumable one, or
  UserError for a directory holding something else."""
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise UserError(f"--output_dir={output_dir} is a file; give a new or empty directory.")
  if not os.path.isdir(output_dir):
    return None
  present = [name for name in os.listdir(output_dir) if not name.startswith(lock.LOCK_FILE)]
  if not present:
    return None
  for name, finished in ((layout.INFO_FILE, True), (layout.PLAN_FILE, False)):
    path = os.path.join(output_dir, name)
    if os.path.exists(path):
      with open(path) as f:
        saved = json.load(f)
      # Flags added since (e.g. max_sequences_per_row) at their defaults.
      flags = {**layout.Options(input="").to_json(), **saved.get("flags", {})}
      if flags != options.to_json():
        differ = [f"{k}={flags.get(k)!r} (now {v!r})"
                  for k, v in options.to_json().items() if flags.get(k) != v]
        raise UserError(f"{output_dir} holds data prepared with other flags: "
                        f"{', '.join(differ)}; give the same flags to reuse or resume it, or a "
                        "new --output_dir.")
      return saved if finished else None
  others = ", ".join(sorted(present)[:3])
  raise UserError(f"--output_dir={output_dir} holds other files ({others}, ...); give a new or "
                  "empty directory (nothing there is overwritten).")


def _vocabulary(options: layout.Options, specs: list[dict], output_dir: str) -> str:
  """Copies the given vocabulary into DATA, or trains a sentencepiece model there on training
  sentences; returns its file name in DATA."""
  if options.vocab:
    return os.path.basename(tokenization.load_tokenizer(options.vocab).save(output_dir))

  tokenization.load_or_train_sentencepiece(
      lambda: text_shards.training_sentences(options, specs),
      os.path.join(output_dir, tokenization.MODEL_FILE), options.vocab_size, seed=options.seed)
  return tokenization.MODEL_FILE


def _run_local(output_dir: str, todo: list[int], workers: int, plan: dict,
               progress: bool) -> None:
  """Processes text shards `todo` in `workers` processes (in this one if 1), with a bar."""
  sizes = [s["stop"] - s["start"] for s in plan["text_shards"]]
  unit = "MB" if "path" in plan["text_shards"][0] else "docs"
  scale = 2**20 if unit == "MB" else 1
  bar = tqdm(total=sum(sizes[i] for i in todo) / scale, unit=unit, disable=not progress,
             desc=f"preparing {len(todo)} shards", bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} "
             "{unit} [{elapsed}<{remaining}, {rate_fmt}]")
  with bar:
    if workers == 1 or len(todo) <= 1:
      for index in todo:
        shard_work.process_text_shard(output_dir, index)
        bar.update(sizes[index] / scale)
      return
    with multiprocessing.get_context("spawn").Pool(min(workers, len(todo))) as pool:
      for index in pool.imap_unordered(_process, [(output_dir, i) for i in todo]):
        bar.update(sizes[index] / scale)


def _process(args: tuple[str, int]) -> int:
  shard_work.process_text_shard(*args)
  return args[1]


def _write_info(output_dir: str, plan: dict) -> dict:
  """Sums the text shards' counts into DATA/info.json (written last, in one rename)."""
  options = layout.Options.from_json(plan["flags"])
  done = []
  for index in range(len(plan["text_shards"])):
    with open(layout.done_path(output_dir, index)) as f:
      done.append(json.load(f))
  totals = {key: sum(d[key] for d in done) for key in
            ("text_bytes", "documents", "heldout_documents", "sentences", "tokens")}
  totals["long_lines_skipped"] = sum(d.get("long_lines_skipped", 0) for d in done)
  if totals["long_lines_skipped"]:
    skipped = totals["long_lines_skipped"]
    print(f"prepare: warning: {tokenization.skipped_lines(skipped, totals['sentences'] + skipped)}.",
          file=sys.stderr)
  if not totals["documents"]:
    raise text_shards.no_text(options.input)
  files = {name: n for d in done for name, n in d["files"].items() if n}
  tok = tokenization.load_tokenizer(os.path.join(output_dir, plan["vocab_file"]))
  token_counts = np.zeros(tok.vocab_size, np.int64)  # [vocab_size] over training documents
  for d in done:
    for i, c in d["token_counts"].items():
      token_counts[int(i)] += c
  token_counts[sorted(tok.special_ids)] = 0

  def listing(kind, split):
    return [[name, n] for name, n in sorted(files.items()) if name.startswith(f"{kind}/{split}-")]

  def span_listing(length):
    spans = {split: listing(layout.spans_dir(length), split) for split in ("train", "heldout")}
    return {**spans, "examples": sum(n for _, n in spans["train"]),
            "heldout_examples": sum(n for _, n in spans["heldout"])}

  info = {
      "format": layout.FORMAT, "flags": plan["flags"],
      "vocab": {"file": plan["vocab_file"], "size": tok.vocab_size,
                "sha256": vocab_sha256(tok),
                "token_dtype": str(shards.token_dtype(tok.vocab_size))},
      "counts": totals, "most_common_token": int(np.argmax(token_counts)),
      "documents": {split: listing(layout.DOCUMENTS, split) for split in ("train", "heldout")},
      "phases": {str(length): {split: listing(layout.pairs_dir(length), split)
                               for split in ("train", "heldout")}
                 for length in options.max_seq_length}}
  if options.contiguous:  # the spans of each length, as the pairs' phases
    info[layout.CONTIGUOUS] = {str(length): span_listing(length)
                               for length in options.max_seq_length}
  packs = {name: value for d in done for name, value in d.get("packs", {}).items()}
  for length, phase in info["phases"].items():
    phase["examples"] = sum(n for _, n in phase["train"])
    phase["heldout_examples"] = sum(n for _, n in phase["heldout"])
    plans = [packing.plan_name(name) for name, _ in phase["train"]]
    if all(name in packs for name in plans):  # else prepared before packing plans existed
      tokens = sum(packs[name][1] for name in plans)
      phase["packs"] = [[name, packs[name][0]] for name in plans]
      phase["packed_rows"] = sum(packs[name][0] for name in plans)
      phase["unpacked_efficiency"] = packing.efficiency(tokens, phase["examples"], int(length))
      phase["packing_efficiency"] = packing.efficiency(tokens, phase["packed_rows"],
                                                       int(length))
  layout.write_json(os.path.join(output_dir, layout.INFO_FILE), info)
  return info


def packing_summary(length: int, phase: dict) -> str:
  """One line on the packing of a phase of info.json (that has plans)."""
  return (f"packing at {length}: {phase['examples']} training examples in "
          f"{phase['packed_rows']} rows ({phase['examples'] / max(1, phase['packed_rows']):.2f} "
          f"a row), real tokens / slots {phase['unpacked_efficiency']:.1%} unpacked, "
          f"{phase['packing_efficiency']:.1%} packed")


def vocab_sha256(tok) -> str:
  """The SHA-256 (hex) of the vocabulary file a tokenizer saves: equal for equal vocabularies,
  whatever file they were read from."""
  with tempfile.TemporaryDirectory() as directory:
    with open(tok.save(directory), "rb") as f:
      return hashlib.sha256(f.read()).hexdigest()


def _remove_partial_files(output_dir: str) -> None:
  """Deletes what a killed run left half-written (FILE.tmp-HOST-PID): this run holds the lock,
  so no other run is writing them."""
  for path in glob.glob(os.path.join(output_dir, "**", "*.tmp-*"), recursive=True):
    os.remove(path)


def _remove_all_but_the_lock(output_dir: str) -> None:
  """Empties a DATA this run created (the lock's release then removes it)."""
  for name in os.listdir(output_dir):
    path = os.path.join(output_dir, name)
    if name == lock.LOCK_FILE:
      continue
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      os.remove(path)
