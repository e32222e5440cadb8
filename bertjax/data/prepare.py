"""Pretraining data, prepared once: text -> vocabulary, tokenized documents, NSP pairs in shards.

  python -m bertjax.data.prepare --input='text/*.txt' --output_dir=DATA --vocab_size=30522 \\
      --max_seq_length=128,512 --dupe_factor=5 --workers=8

The input is text files (one sentence per line, a blank line between documents, as
google-research/bert takes) or `tfds:NAME[/CONFIG][:VERSION]:SPLIT`, a TFDS text dataset built
on local disk in array_record format (each example's --tfds_feature is one document). The work
is cut into text shards (text_shards.py: --shard_size_mb of a file, or
--tfds_documents_per_shard documents); each text shard independently becomes (shards.py has
the layout):

* its documents, split into training and held-out ones (a seeded `eval_fraction` of each
  shard's documents, at least 2 when it has 3 or more), tokenized: documents/{train,heldout};
* for each --max_seq_length, NSP pairs by google-research/bert's create_pretraining_data rules
  (pretraining_examples.py), `dupe_factor` passes for training and one for the held-out
  documents, a random next segment drawn from the same text shard as the original draws it
  from the same input file: seq{L}/{train,heldout}; with --static_masks, masked too;
* for each length, the plan that packs its training pairs into rows of at most
  --max_sequences_per_row pairs (packing.py): seq{L}/packs-train (held-out pairs stay unpacked);
* with --contiguous=true, for each length also contiguous single-segment examples
  `[CLS] span [SEP]` for the No NSP and left-to-right ablations (config.pretraining; the paper,
  section 5.1): each document's text cut into spans of L - 2 tokens, dupe_factor passes cut at
  other places (pretraining_examples.iter_contiguous_spans): contiguous{L}/{train,heldout}.

The vocabulary is the given one (--vocab: a sentencepiece .model or a WordPiece vocab.txt,
copied into DATA) or a sentencepiece model trained on training sentences only, from text shards
taken in a seeded order. Shards are processed by --workers processes (default: every core), or
by an Apache Beam pipeline (--runner=DirectRunner, DataflowRunner, FlinkRunner, SparkRunner,
with any further pipeline flags passed to Beam; DATA and the input must be at the same path on
every Beam worker, e.g. a mounted bucket). The result depends on the flags, not on the workers
or the runner. A rerun with the same flags resumes: finished text shards are kept.
DATA/info.json, written last, lists the flags, the counts, the vocabulary's hash and every
shard.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import sys
from collections.abc import Sequence

import numpy as np

from bertjax.data.pretraining import packing, shards, text_shards
from bertjax.errors import UserError

INFO_FILE = "info.json"
CONTIGUOUS = "contiguous"  # DATA/contiguous{L}/: the spans of --contiguous=true
PLAN_FILE = "plan.json"  # flags and text shards, written first: a rerun resumes only with these
DONE_DIR = "done"  # done/SSSSS.json: the counts of a finished text shard
_FORMAT = 1
_PAIRS, _MASKS, _SPAN_MASKS = 2, 3, 4  # kinds of seeded generator (text_shards: HELDOUT_SEED 1)
_MASK_CHUNK = 4096  # pairs masked at a time


@dataclasses.dataclass(frozen=True)
class Options:
  """The flags that decide what DATA holds (DATA/info.json "flags")."""
  input: str  # comma-separated globs, or tfds:NAME:SPLIT
  vocab: str = ""  # a sentencepiece .model or WordPiece vocab.txt ("" = train one)
  vocab_size: int = 30522  # of the sentencepiece model trained when no vocab is given
  max_seq_length: tuple[int, ...] = (128,)  # one set of NSP pairs per length (phase)
  max_predictions_per_seq: tuple[int, ...] = (20,)  # per length; used by static masks
  dupe_factor: int = 5
  short_seq_prob: float = 0.1
  eval_fraction: float = 0.01  # documents held out for evaluation
  static_masks: bool = False  # store masks (else the loader masks afresh every epoch)
  masked_lm_prob: float = 0.15
  whole_word_masking: bool = False
  seed: int = 0
  max_sequences_per_row: int = 3  # pairs in a packed row at most (packing plans)
  contiguous: bool = False  # also contiguous spans per length (No NSP / LTR pretraining)
  shard_size_mb: float = 64.0  # text per shard (files)
  tfds_feature: str = "text"
  tfds_data_dir: str = ""
  tfds_documents_per_shard: int = 20000

  def check(self) -> None:
    """UserError naming the first flag that cannot work."""
    if len(self.max_predictions_per_seq) != len(self.max_seq_length):
      raise UserError(f"--max_predictions_per_seq={_join(self.max_predictions_per_seq)} needs "
                      f"one value per --max_seq_length ({_join(self.max_seq_length)}).")
    for length, predictions in zip(self.max_seq_length, self.max_predictions_per_seq):
      if length < 5:
        raise UserError(f"--max_seq_length={length} leaves no room for [CLS] A [SEP] B [SEP]; "
                        "use 5 or more (128 or 512 as in the paper).")
      if not 1 <= predictions <= length:
        raise UserError(f"--max_predictions_per_seq={predictions} for length {length}; use 1 "
                        f"to {length} (the paper: 20 at 128, 80 at 512).")
    if len(set(self.max_seq_length)) != len(self.max_seq_length):
      raise UserError(f"--max_seq_length={_join(self.max_seq_length)} repeats a length.")
    for name in ("dupe_factor", "vocab_size", "tfds_documents_per_shard",
                 "max_sequences_per_row"):
      if getattr(self, name) < 1:
        raise UserError(f"--{name}={getattr(self, name)}; use 1 or more.")
    if not 0 <= self.eval_fraction < 1:
      raise UserError(f"--eval_fraction={self.eval_fraction}; use a value in [0, 1).")
    if not 0 < self.masked_lm_prob < 1:
      raise UserError(f"--masked_lm_prob={self.masked_lm_prob}; use a value in (0, 1).")
    if not 0 <= self.short_seq_prob <= 1:
      raise UserError(f"--short_seq_prob={self.short_seq_prob}; use a value in [0, 1].")
    if self.shard_size_mb <= 0:
      raise UserError(f"--shard_size_mb={self.shard_size_mb}; use a positive size.")

  def to_json(self) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}

  @classmethod
  def from_json(cls, flags: dict) -> Options:
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in flags.items()})


def _join(values) -> str:
  return ",".join(str(v) for v in values)


# ----------------------------------------------------------------------------------------------
# The work of one text shard.


def process_text_shard(output_dir: str, index: int) -> dict:
  """Turns text shard `index` of DATA/plan.json into its document and pair shards, and writes
  DATA/done/INDEX.json with its counts (returned). Needs only DATA (Beam workers call it)."""
  from bertjax import tokenization  # pylint: disable=import-outside-toplevel

  with open(os.path.join(output_dir, PLAN_FILE)) as f:
    plan = json.load(f)
  options, specs = Options.from_json(plan["flags"]), plan["text_shards"]
  count = len(specs)
  tok = tokenization.load_tokenizer(os.path.join(output_dir, plan["vocab_file"]))
  dtype = shards.token_dtype(tok.vocab_size)
  splits = shard_documents(options, specs, index, tok)
  documents = splits["train"] + splits["heldout"]
  done = {"text_bytes": specs[index]["stop"] - specs[index]["start"]
          if "path" in specs[index] else 0,
          "documents": len(splits["train"]), "heldout_documents": len(splits["heldout"]),
          "sentences": sum(len(d) for d in documents),
          "tokens": int(sum(len(s) for d in documents for s in d)), "files": {},
          "packs": {}}
  for split, docs in splits.items():
    if not docs:
      continue
    name = shards.shard_name("documents", split, index, count)
    done["files"][name] = shards.write_shard(
        os.path.join(output_dir, name), (shards.encode_document(d, dtype) for d in docs))
    for phase, length in enumerate(options.max_seq_length):
      name = shards.shard_name(f"seq{length}", split, index, count)
      lengths: list[int] = []  # [pairs] of the padded row each pair needs
      done["files"][name] = shards.write_shard(
          os.path.join(output_dir, name),
          _tapped(_pair_records(docs, split, index, phase, options, tok, dtype), lengths, dtype))
      if split == "train":
        packs = packing.plan_packs(np.array(lengths, np.int64), length,
                                   options.max_sequences_per_row)
        packing.write_plan(os.path.join(output_dir, packing.plan_name(name)), packs)
        done["packs"][packing.plan_name(name)] = [len(packs), int(sum(lengths))]
      if options.contiguous:
        name = shards.shard_name(f"{CONTIGUOUS}{length}", split, index, count)
        done["files"][name] = shards.write_shard(
            os.path.join(output_dir, name),
            _span_records(docs, split, index, phase, options, tok, dtype))
  counts = np.bincount(np.concatenate([s for d in splits["train"] for s in d] or [[]]).astype(
      np.int64), minlength=tok.vocab_size)
  done["token_counts"] = {int(i): int(c) for i, c in enumerate(counts) if c}
  _write_json(os.path.join(output_dir, DONE_DIR, f"{index:05d}.json"), done)
  return done


def _tapped(records, lengths: list[int], dtype: np.dtype):
  """`records` (pair records) as they are, appending each one's row length to `lengths`."""
  for record in records:
    lengths.append(packing.pair_length(record, dtype))
    yield record


def shard_documents(options: Options, specs: list[dict], index: int,
                    tok) -> dict[str, list[list[list[int]]]]:
  """{"train", "heldout"}: the tokenized documents of text shard `index`, each set shuffled as
  the original shuffles its documents."""
  rng = np.random.default_rng([options.seed, _PAIRS, index])
  texts = text_shards.read_text_shard(specs[index], options)
  held_out = text_shards.split_heldout(texts, options.eval_fraction, options.seed, index)
  splits = {}
  for split, docs in zip(("train", "heldout"), held_out):
    splits[split] = _tokenize(tok, [docs[i] for i in rng.permutation(len(docs))])
  return splits


def _pair_records(docs, split: str, index: int, phase: int, options: Options, tok, dtype):
  """The records of the NSP pairs (masked if static) of a text shard's `split` documents at the
  phase's length: dupe_factor passes for training, one for held-out documents."""
  from bertjax.data.pretraining import examples as pe  # pylint: disable=import-outside-toplevel

  length = options.max_seq_length[phase]
  rng = np.random.default_rng([options.seed, _PAIRS, index, phase, split == "heldout"])
  pairs = pe.iter_segment_pairs(docs, length, options.short_seq_prob, rng,
                                options.dupe_factor if split == "train" else 1)
  if not options.static_masks:
    return (shards.encode_pair(a, b, r, dtype) for a, b, r in pairs)
  return _masked_records(
      pairs, length, options.max_predictions_per_seq[phase], pe.SpecialTokens.from_tokenizer(tok),
      options, np.random.default_rng([options.seed, _MASKS, index, phase, split == "train"]),
      tok.word_boundary_tables() if options.whole_word_masking else None, dtype)


def _span_records(docs, split: str, index: int, phase: int, options: Options, tok, dtype):
  """The records of the contiguous spans (masked if static) of a text shard's `split`
  documents at the phase's length: pair records with an empty B (shards.py); dupe_factor passes
  for training, one for held-out documents."""
  from bertjax.data.pretraining import examples as pe  # pylint: disable=import-outside-toplevel

  length = options.max_seq_length[phase]
  spans = pe.iter_contiguous_spans(docs, length, options.dupe_factor if split == "train" else 1)
  empty = np.zeros(0, np.int32)
  if not options.static_masks:
    return (shards.encode_pair(span, empty, False, dtype) for span in spans)
  return _masked_records(
      ((span, empty, False) for span in spans), length, options.max_predictions_per_seq[phase],
      pe.SpecialTokens.from_tokenizer(tok), options,
      np.random.default_rng([options.seed, _SPAN_MASKS, index, phase, split == "train"]),
      tok.word_boundary_tables() if options.whole_word_masking else None, dtype)


def _tokenize(tok, texts: list[list[str]]) -> list[list[list[int]]]:
  """Documents of sentences -> documents of token-id lists (empty sentences dropped)."""
  flat = tok.encode_batch([s for doc in texts for s in doc])
  documents, start = [], 0
  for doc in texts:
    sentences = [s for s in flat[start:start + len(doc)] if s]
    start += len(doc)
    if sentences:
      documents.append(sentences)
  return documents


def _masked_records(pairs, length, predictions, special, options, rng, word_tables, dtype):
  """Static masks: pairs masked `_MASK_CHUNK` at a time, as records with their masks."""
  from bertjax import tokenization  # pylint: disable=import-outside-toplevel
  from bertjax.data.pretraining import examples as pe  # pylint: disable=import-outside-toplevel

  pairs = iter(pairs)
  while chunk := list(itertools.islice(pairs, _MASK_CHUNK)):
    padded = pe.pad_pairs(chunk, length, special)
    ids = padded["input_ids"]
    starts = None if word_tables is None else tokenization.word_starts(ids, *word_tables)
    masked = pe.mask_batch(ids, padded["input_mask"], rng, special, options.masked_lm_prob,
                           predictions, starts)
    for row, (a, b, is_random) in enumerate(chunk):
      tokens = masked["input_ids"][row]
      real = int(masked["masked_lm_weights"][row].sum())
      yield shards.encode_pair(tokens[1:1 + len(a)], tokens[2 + len(a):2 + len(a) + len(b)],
                               is_random, dtype, masked["masked_lm_positions"][row, :real],
                               masked["masked_lm_ids"][row, :real])


# ----------------------------------------------------------------------------------------------
# The whole preparation.


def prepare(options: Options, output_dir: str, workers: int = 0, runner: str = "",
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
  """
  options.check()
  if runner:  # a wrong runner or flag is told before any work
    from bertjax.data.pretraining import beam as prepare_beam  # pylint: disable=import-outside-toplevel
    prepare_beam.check(runner, pipeline_args)
  existing = _check_output_dir(output_dir, options)
  if existing is not None:
    return existing
  created = not os.path.exists(output_dir)
  try:
    return _prepare(options, output_dir, workers, runner, pipeline_args, progress)
  except UserError:
    written = glob.glob(os.path.join(output_dir, "*", "*" + shards.SUFFIX))
    if created and not written:  # bad input before any work worth keeping: leave nothing
      shutil.rmtree(output_dir, ignore_errors=True)
    raise


def _prepare(options: Options, output_dir: str, workers: int, runner: str,
             pipeline_args: Sequence[str], progress: bool) -> dict:
  """prepare() on a checked output directory."""
  os.makedirs(output_dir, exist_ok=True)
  plan_path = os.path.join(output_dir, PLAN_FILE)
  if not os.path.exists(plan_path):
    specs = text_shards.plan_text_shards(options)
    vocab_file = _vocabulary(options, specs, output_dir)
    _write_json(plan_path, {"format": _FORMAT, "flags": options.to_json(),
                            "vocab_file": vocab_file, "text_shards": specs})
  with open(plan_path) as f:
    plan = json.load(f)
  _remove_partial_files(output_dir)
  todo = [i for i in range(len(plan["text_shards"]))
          if not os.path.exists(_done_path(output_dir, i))]
  if runner:
    from bertjax.data.pretraining import beam as prepare_beam  # pylint: disable=import-outside-toplevel
    prepare_beam.run(output_dir, todo, runner, pipeline_args)
  else:
    _run_local(output_dir, todo, workers or os.cpu_count() or 1, plan, progress)
  return _write_info(output_dir, plan)


def _check_output_dir(output_dir: str, options: Options) -> dict | None:
  """The info of a finished DATA made with `options`, None for a new or resumable one, or
  UserError for a directory holding something else."""
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise UserError(f"--output_dir={output_dir} is a file; give a new or empty directory.")
  if not os.path.isdir(output_dir) or not os.listdir(output_dir):
    return None
  for name, finished in ((INFO_FILE, True), (PLAN_FILE, False)):
    path = os.path.join(output_dir, name)
    if os.path.exists(path):
      with open(path) as f:
        saved = json.load(f)
      # Flags added since (e.g. max_sequences_per_row) at their defaults.
      flags = {**Options(input="").to_json(), **saved.get("flags", {})}
      if flags != options.to_json():
        differ = [f"{k}={flags.get(k)!r} (now {v!r})"
                  for k, v in options.to_json().items() if flags.get(k) != v]
        raise UserError(f"{output_dir} holds data prepared with other flags: "
                        f"{', '.join(differ)}; give the same flags to reuse or resume it, or a "
                        "new --output_dir.")
      return saved if finished else None
  others = ", ".join(sorted(os.listdir(output_dir))[:3])
  raise UserError(f"--output_dir={output_dir} holds other files ({others}, ...); give a new or "
                  "empty directory (nothing there is overwritten).")


def _vocabulary(options: Options, specs: list[dict], output_dir: str) -> str:
  """Copies the given vocabulary into DATA, or trains a sentencepiece model there on training
  sentences; returns its file name in DATA."""
  from bertjax import tokenization  # pylint: disable=import-outside-toplevel

  if options.vocab:
    return os.path.basename(tokenization.load_tokenizer(options.vocab).save(output_dir))

  tokenization.load_or_train_sentencepiece(
      lambda: text_shards.training_sentences(options, specs),
      os.path.join(output_dir, tokenization.MODEL_FILE), options.vocab_size, seed=options.seed)
  return tokenization.MODEL_FILE


def _run_local(output_dir: str, todo: list[int], workers: int, plan: dict,
               progress: bool) -> None:
  """Processes text shards `todo` in `workers` processes (in this one if 1), with a bar."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel

  sizes = [s["stop"] - s["start"] for s in plan["text_shards"]]
  unit = "MB" if "path" in plan["text_shards"][0] else "docs"
  scale = 2**20 if unit == "MB" else 1
  bar = tqdm(total=sum(sizes[i] for i in todo) / scale, unit=unit, disable=not progress,
             desc=f"preparing {len(todo)} shards", bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} "
             "{unit} [{elapsed}<{remaining}, {rate_fmt}]")
  with bar:
    if workers == 1 or len(todo) <= 1:
      for index in todo:
        process_text_shard(output_dir, index)
        bar.update(sizes[index] / scale)
      return
    with multiprocessing.get_context("spawn").Pool(min(workers, len(todo))) as pool:
      for index in pool.imap_unordered(_process, [(output_dir, i) for i in todo]):
        bar.update(sizes[index] / scale)


def _process(args: tuple[str, int]) -> int:
  process_text_shard(*args)
  return args[1]


def _write_info(output_dir: str, plan: dict) -> dict:
  """Sums the text shards' counts into DATA/info.json (written last, in one rename)."""
  from bertjax import tokenization  # pylint: disable=import-outside-toplevel

  options = Options.from_json(plan["flags"])
  done = []
  for index in range(len(plan["text_shards"])):
    with open(_done_path(output_dir, index)) as f:
      done.append(json.load(f))
  totals = {key: sum(d[key] for d in done) for key in
            ("text_bytes", "documents", "heldout_documents", "sentences", "tokens")}
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
    spans = {split: listing(f"{CONTIGUOUS}{length}", split) for split in ("train", "heldout")}
    return {**spans, "examples": sum(n for _, n in spans["train"]),
            "heldout_examples": sum(n for _, n in spans["heldout"])}

  info = {
      "format": _FORMAT, "flags": plan["flags"],
      "vocab": {"file": plan["vocab_file"], "size": tok.vocab_size,
                "sha256": vocab_sha256(tok),
                "token_dtype": str(shards.token_dtype(tok.vocab_size))},
      "counts": totals, "most_common_token": int(np.argmax(token_counts)),
      "documents": {split: listing("documents", split) for split in ("train", "heldout")},
      "phases": {str(length): {split: listing(f"seq{length}", split)
                               for split in ("train", "heldout")}
                 for length in options.max_seq_length}}
  if options.contiguous:  # the spans of each length, as the pairs' phases
    info[CONTIGUOUS] = {str(length): span_listing(length)
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
  _write_json(os.path.join(output_dir, INFO_FILE), info)
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
  import tempfile  # pylint: disable=import-outside-toplevel

  with tempfile.TemporaryDirectory() as directory:
    with open(tok.save(directory), "rb") as f:
      return hashlib.sha256(f.read()).hexdigest()


def _done_path(output_dir: str, index: int) -> str:
  return os.path.join(output_dir, DONE_DIR, f"{index:05d}.json")


def _remove_partial_files(output_dir: str) -> None:
  """Deletes what a killed run left half-written (FILE.tmp-HOST-PID)."""
  for path in glob.glob(os.path.join(output_dir, "**", "*.tmp-*"), recursive=True):
    os.remove(path)


def _write_json(path: str, value: dict) -> None:
  """Writes JSON in one rename."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = shards.temporary_name(path)
  with open(tmp, "w") as f:
    json.dump(value, f, indent=1)
  os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# Command line.


def _ints(text: str) -> tuple[int, ...]:
  try:
    return tuple(int(v) for v in text.split(",") if v.strip())
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers")


def _bool(text: str) -> bool:
  if text.lower() in ("1", "true", "yes"):
    return True
  if text.lower() in ("0", "false", "no"):
    return False
  raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m bertjax.data.prepare",
                              description=__doc__.split("\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  defaults = Options(input="")
  types = {int: int, float: float, str: str, bool: _bool, tuple: _ints}
  helps = {
      "input": "text files (comma-separated globs) or tfds:NAME:SPLIT",
      "vocab": "sentencepiece .model or WordPiece vocab.txt; empty: train a sentencepiece one",
      "vocab_size": "size of the sentencepiece vocabulary trained when no --vocab is given",
      "max_seq_length": "comma-separated lengths, one set of NSP pairs (phase) each",
      "max_predictions_per_seq": "per length: masked positions at most (static masks); left "
                                 "at the default: 20 per 128 tokens at every length",
      "dupe_factor": "passes over the training documents, each pairing them differently",
      "short_seq_prob": "chance that a document pass aims at a shorter pair",
      "eval_fraction": "share of each text shard's documents held out for evaluation",
      "static_masks": "store one set of masks per pair (true/false); else masks are drawn "
                      "while training",
      "masked_lm_prob": "share of tokens masked (static masks)",
      "whole_word_masking": "mask whole words, punctuation apart (static masks; true/false)",
      "seed": "seed of every random choice",
      "max_sequences_per_row": "pairs in a row at most when training packs them "
                               "(--config.data.packing); a plan per shard and length",
      "contiguous": "also contiguous single-segment spans per length, for pretraining "
                    "without NSP or left-to-right (--config.pretraining.nsp=false or "
                    "objective=ltr; true/false)",
      "shard_size_mb": "text per shard: the unit of work of one worker",
      "tfds_feature": "the TFDS text feature that holds a document",
      "tfds_data_dir": "where the TFDS dataset was built; empty: TFDS's default",
      "tfds_documents_per_shard": "TFDS documents per shard"}
  for field in dataclasses.fields(Options):
    default = getattr(defaults, field.name)
    p.add_argument(f"--{field.name}", type=types[type(default)], default=default,
                   required=field.name == "input", help=helps[field.name])
  p.add_argument("--output_dir", required=True, help="new or empty directory (or one to resume)")
  p.add_argument("--workers", type=int, default=0, help="processes (0 = every core)")
  p.add_argument("--runner", default="", help="an Apache Beam runner instead of local processes")
  return p


def main(argv: Sequence[str] | None = None) -> int:
  args, pipeline_args = _parser().parse_known_args(argv)
  if pipeline_args and not args.runner:
    print(f"prepare: error: unknown flags {' '.join(pipeline_args)} (flags for Beam need "
          "--runner)", file=sys.stderr)
    return 2
  flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(Options)}
  if flags["max_predictions_per_seq"] == (20,) and len(flags["max_seq_length"]) > 1:
    # The paper's 20 at 128 tokens, in proportion at other lengths (80 at 512).
    flags["max_predictions_per_seq"] = tuple(max(1, round(n * 20 / 128))
                                             for n in flags["max_seq_length"])
  try:
    info = prepare(Options(**flags), args.output_dir, args.workers, args.runner, pipeline_args)
  except UserError as e:
    print(f"prepare: error: {e}", file=sys.stderr)
    return 2
  counts = info["counts"]
  phases = ", ".join(f"{n}: {p['examples']} + {p['heldout_examples']} held out"
                     for n, p in info["phases"].items())
  print(f"{args.output_dir}: {counts['documents']} + {counts['heldout_documents']} held-out "
        f"documents, {counts['tokens']} tokens, vocabulary {info['vocab']['size']}; "
        f"examples per length {phases}")
  for length, phase in info["phases"].items():
    if "packs" in phase:
      print(packing_summary(int(length), phase))
  for length, spans in info.get(CONTIGUOUS, {}).items():
    print(f"contiguous spans at {length}: {spans['examples']} + {spans['heldout_examples']} "
          "held out")
  return 0


if __name__ == "__main__":
  sys.exit(main())
