"""GLUE's data: the tasks, their files (or TFDS), and BERT's features of their examples.

  examples = read_examples("mrpc", "train", "glue_data")      # download_glue_data.py's layout
  examples = read_tfds_examples("mrpc", "dev")                # or TFDS glue/mrpc, prepared
  features = encode_examples(examples, TASKS["mrpc"], tokenizer, max_seq_length=128)

The leaderboard files of predictions are task output: `bertjax.tasks.glue.write_submission`.

Files are read as google-research/bert's run_classifier.py and transformers' GLUE processors
read them: tab-separated, no quoting (csv.QUOTE_NONE), each file's own columns, a header row
skipped except in CoLA's train.tsv and dev.tsv (which have none). Labels are the strings in the
files ("0"/"1", "entailment", ...; STS-B's score as written, e.g. "3.800"); their index in
`GlueTask.labels` (the processors' get_labels() order) is the class a model predicts.

An example's guid is "<split>-<i>": on test splits i is the GLUE index (the file's index column,
TFDS's idx), the index a submission file names; on train and dev splits i counts the file's data
rows from 0 (TFDS's idx too), skipped QQP rows included.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import os
from collections.abc import Sequence

import numpy as np

from bertjax.data import sources
from bertjax.errors import UserError
from bertjax.tokenization import Tokenizer


@dataclasses.dataclass(frozen=True)
class GlueTask:
  """One GLUE task.

  Attributes:
    name: our name, e.g. "mrpc" (also its TFDS config: glue/mrpc).
    labels: label strings in class-index order; () for STS-B (regression).
    splits: the split names read_examples accepts.
  """
  name: str
  labels: tuple[str, ...]
  splits: tuple[str, ...]

  @property
  def is_regression(self) -> bool:
    return not self.labels

  @property
  def num_labels(self) -> int:
    """Outputs of the head: classes, or 1 for a regression score."""
    return len(self.labels) or 1


_SPLITS = ("train", "dev", "test")
_BINARY = ("0", "1")
_NLI = ("contradiction", "entailment", "neutral")  # google-research/bert's MnliProcessor order
_RTE = ("entailment", "not_entailment")
TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("cola", _BINARY, _SPLITS),
    GlueTask("sst2", _BINARY, _SPLITS),
    GlueTask("mrpc", _BINARY, _SPLITS),
    GlueTask("qqp", _BINARY, _SPLITS),
    GlueTask("stsb", (), _SPLITS),
    GlueTask("mnli", _NLI, ("train", "dev_matched", "dev_mismatched", "test_matched",
                            "test_mismatched")),
    GlueTask("qnli", _RTE, _SPLITS),
    GlueTask("rte", _RTE, _SPLITS),
    GlueTask("wnli", _BINARY, _SPLITS),
    GlueTask("ax", _NLI, ("test",)),  # the diagnostic set: MNLI's labels, test only
)}

@dataclasses.dataclass(frozen=True)
class Example:
  """One GLUE example.

  Attributes:
    guid: "<split>-<i>" (module docstring); on test splits i is the GLUE index.
    text_a: the first (or only) sentence.
    text_b: the second sentence; None for single-sentence tasks (CoLA, SST-2).
    label: the label string (STS-B: the score as written); None on test splits.
  """
  guid: str
  text_a: str
  text_b: str | None
  label: str | None


# ----------------------------------------------------------------------------------------------
# Files in download_glue_data.py's layout.


@dataclasses.dataclass(frozen=True)
class _Columns:
  """Where a file's fields are: column numbers (label -1: the last column; None: absent)."""
  header: bool
  text_a: int
  text_b: int | None = None
  label: int | None = None
  index: int | None = None  # the GLUE index (test files)


# (train/dev columns, test columns), as the processors of google-research/bert and transformers.
_PAIR = (_Columns(True, 1, 2, label=-1), _Columns(True, 1, 2, index=0))  # index s1 s2 (label)
_COLUMNS: dict[str, tuple[_Columns | None, _Columns]] = {
    # source, label, original label, sentence (no header) / index, sentence
    "cola": (_Columns(False, 3, label=1), _Columns(True, 1, index=0)),
    # sentence, label / index, sentence
    "sst2": (_Columns(True, 0, label=1), _Columns(True, 1, index=0)),
    # Quality, #1 ID, #2 ID, #1 String, #2 String / index, #1 ID, #2 ID, #1 String, #2 String
    "mrpc": (_Columns(True, 3, 4, label=0), _Columns(True, 3, 4, index=0)),
    # id, qid1, qid2, question1, question2, is_duplicate / id, question1, question2
    "qqp": (_Columns(True, 3, 4, label=5), _Columns(True, 1, 2, index=0)),
    # index, genre, filename, year, old_index, source1, source2, sentence1, sentence2, (score)
    "stsb": (_Columns(True, 7, 8, label=-1), _Columns(True, 7, 8, index=0)),
    # index, promptID, pairID, genre, 4 parses, sentence1, sentence2, (labels..., gold_label)
    "mnli": (_Columns(True, 8, 9, label=-1), _Columns(True, 8, 9, index=0)),
    "qnli": _PAIR,  # index, question, sentence, (label)
    "rte": _PAIR,
    "wnli": _PAIR,
    "ax": (None, _Columns(True, 1, 2, index=0)),  # index, sentence1, sentence2
}
_DIRS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B",
         "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI", "ax": "diagnostic"}
_HOW_TO_GET = ("get GLUE with download_glue_data.py (--data_dir=DIR writes DIR/CoLA/train.tsv, "
               "DIR/MNLI/dev_matched.tsv, DIR/diagnostic/diagnostic.tsv, ...) and give DIR, or "
               "read TFDS glue/<task> instead")


def get_task(task: str) -> GlueTask:
  """The GlueTask named `task`; UserError listing the tasks for an unknown name."""
  if task not in TASKS:
    raise UserError(f"unknown GLUE task {task!r}; use one of {', '.join(TASKS)}.")
  return TASKS[task]


def check_split(task: GlueTask, split: str) -> None:
  """UserError unless `task` has `split`, naming the splits it has."""
  if split not in task.splits:
    raise UserError(f"GLUE task {task.name!r} has no split {split!r}; use one of "
                    f"{', '.join(task.splits)}.")


def task_file(task: str, split: str, data_dir: str) -> str:
  """The path read_examples reads, e.g. DATA_DIR/MNLI/dev_matched.tsv."""
  glue_task = get_task(task)
  check_split(glue_task, split)
  name = "diagnostic.tsv" if task == "ax" else f"{split}.tsv"
  return os.path.join(os.fspath(data_dir), _DIRS[task], name)


def read_examples(task: str, split: str, data_dir: str) -> list[Example]:
  """Reads one split of a GLUE task from download_glue_data.py's layout.

  Args:
    task: a key of TASKS, e.g. "mrpc".
    split: one of TASKS[task].splits, e.g. "train", "dev", "test", "dev_matched".
    data_dir: the directory holding CoLA/, SST-2/, ..., diagnostic/.

  Returns:
    The examples in file order; labels are None on test splits. QQP rows lacking a field are
    skipped, as transformers' QqpProcessor does; blank lines are skipped in every file.

  Raises:
    UserError: unknown task or split; data_dir, the task's directory or the file is missing;
      the file is not UTF-8; a row has too few columns or a label the task does not know.
  """
  path = task_file(task, split, data_dir)
  glue_task = TASKS[task]
  if not os.path.exists(path):
    for missing in (data_dir, os.path.dirname(path), path):
      if not os.path.exists(missing):
        raise UserError(f"GLUE {task} {split} needs {path}, but {missing} does not exist; "
                        f"{_HOW_TO_GET}.")
  if os.path.isdir(path):
    raise UserError(f"{path} is a directory; GLUE {task} {split} must be a .tsv file there.")
  with open(path, "rb") as f:
    text = sources.decode_text(path, f.read())
  test = split.startswith("test") or task == "ax"
  columns = _COLUMNS[task][1 if test else 0]
  needed = max(c for c in (columns.text_a, columns.text_b, columns.label, columns.index)
               if c is not None) + 1
  if columns.label == -1:  # the last column, after the texts
    needed += 1
  reader = csv.reader(io.StringIO(text, newline=None), delimiter="\t", quoting=csv.QUOTE_NONE)
  examples, n, header = [], -1, columns.header
  for row in reader:
    if not row:
      continue
    if header:  # the first row
      header = False
      continue
    n += 1
    if len(row) < needed:
      if task == "qqp":
        continue  # as transformers' QqpProcessor: rows with a missing field are skipped
      raise UserError(f"{path}:{reader.line_num}: {len(row)} tab-separated columns, but GLUE "
                      f"{task} {split} rows have at least {needed}; the file is damaged or not "
                      f"GLUE's, {_HOW_TO_GET}.")
    label = None if test else row[columns.label]
    if label is not None:
      _label_index(glue_task, label, f"{path}:{reader.line_num}")
    i = row[columns.index] if test else n
    examples.append(Example(
        guid=f"{split}-{i}", text_a=row[columns.text_a],
        text_b=None if columns.text_b is None else row[columns.text_b], label=label))
  return examples


# ----------------------------------------------------------------------------------------------
# TFDS glue/<task>.

# Our split -> TFDS's.
_TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test",
                "dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched",
                "test_matched": "test_matched", "test_mismatched": "test_mismatched"}
# TFDS's text features (text_a, text_b).
_TFDS_TEXTS = {"cola": ("sentence", None), "sst2": ("sentence", None),
               "mrpc": ("sentence1", "sentence2"), "qqp": ("question1", "question2"),
               "stsb": ("sentence1", "sentence2"), "mnli": ("premise", "hypothesis"),
               "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"),
               "wnli": ("sentence1", "sentence2"), "ax": ("premise", "hypothesis")}
# TFDS's ClassLabel names -> our label strings (TFDS names GLUE's "0"/"1" classes).
_TFDS_LABELS = {
    "cola": {"unacceptable": "0", "acceptable": "1"},
    "sst2": {"negative": "0", "positive": "1"},
    "mrpc": {"not_equivalent": "0", "equivalent": "1"},
    "qqp": {"not_duplicate": "0", "duplicate": "1"},
    "wnli": {"not_entailment": "0", "entailment": "1"},
    "mnli": {n: n for n in _NLI}, "ax": {n: n for n in _NLI},
    "qnli": {n: n for n in _RTE}, "rte": {n: n for n in _RTE},
}


def read_tfds_examples(task: str, split: str, data_dir: str | None = None, *,
                       name: str | None = None) -> list[Example]:
  """Reads one split of a GLUE task from TFDS, prepared on local disk; never downloads.

  Args:
    task: a key of TASKS, e.g. "mrpc".
    split: one of TASKS[task].splits (ours: "dev" is TFDS's "validation", "dev_matched" its
      "validation_matched", ...).
    data_dir: where the dataset was prepared; None for TFDS's default (~/tensorflow_datasets).
    name: the TFDS dataset; None for "glue/<task>". Another builder with glue/<task>'s features
      works too (the tests use a tiny one).

  Returns:
    The examples in idx order (their order in GLUE's files); guids "<split>-<idx>"; labels None
    on test splits (TFDS's -1), STS-B's score as the shortest string of its float32 ("3.8", "5.0").

  Raises:
    UserError: unknown task or split; the dataset is unknown, not prepared in data_dir or lacks
      the split or glue/<task>'s features; its class names are not GLUE's.
  """
  glue_task = get_task(task)
  check_split(glue_task, split)
  name = name or f"glue/{task}"
  builder = sources.open_tfds_builder(name, data_dir,
                                      " (or read GLUE's .tsv files: --config.data.glue_dir)")
  tfds_split = _TFDS_SPLITS[split]
  if tfds_split not in builder.info.splits:
    raise UserError(f"TFDS dataset {name!r} has no split {tfds_split!r} (our {split!r}); its "
                    f"splits are {', '.join(builder.info.splits)}.")
  features = builder.info.features
  key_a, key_b = _TFDS_TEXTS[task]
  missing = [k for k in (key_a, key_b, "label", "idx") if k is not None and k not in features]
  if missing:
    raise UserError(f"TFDS dataset {name!r} lacks the feature(s) {', '.join(missing)} of "
                    f"glue/{task}; its features are {', '.join(sorted(features))}.")
  names = list(getattr(features["label"], "names", None) or [])  # a ClassLabel's
  if glue_task.is_regression:
    if names:
      raise UserError(f"TFDS dataset {name!r} has classes {names}, but glue/{task}'s label is "
                      "a score; give glue/stsb or a dataset like it.")
    names = None
  else:
    if sorted(names) != sorted(_TFDS_LABELS[task]):
      raise UserError(f"TFDS dataset {name!r} has classes {names}, not glue/{task}'s "
                      f"{sorted(_TFDS_LABELS[task])}; give glue/{task} or a dataset like it.")
    names = [_TFDS_LABELS[task][n] for n in names]  # TFDS class index -> our label string
  test = split.startswith("test") or task == "ax"
  rows = []  # (idx, example): TFDS stores examples shuffled; idx is their row in GLUE's file
  for ex in sources.tfds_examples(builder, tfds_split):
    label = None
    if not test:
      if names is None:
        label = np.format_float_positional(np.float32(ex["label"]), trim="0")  # "3.8", "5.0"
      else:
        label = names[int(ex["label"])]
    idx = int(ex["idx"])
    rows.append((idx, Example(guid=f"{split}-{idx}", text_a=_text(ex[key_a]),
                              text_b=None if key_b is None else _text(ex[key_b]), label=label)))
  return [example for _, example in sorted(rows, key=lambda row: row[0])]


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


# ----------------------------------------------------------------------------------------------
# Features.


def _label_index(task: GlueTask, label: str, where: str) -> int | float:
  """A label string -> its class index (a float score for STS-B); UserError if unknown."""
  if task.is_regression:
    try:
      return float(label)
    except ValueError:
      raise UserError(f"{where}: GLUE {task.name} label {label!r} is not a number (a similarity "
                      "score in [0, 5]); the data is damaged or not GLUE's.") from None
  try:
    return task.labels.index(label)
  except ValueError:
    raise UserError(f"{where}: GLUE {task.name} label {label!r} is not one of "
                    f"{', '.join(task.labels)}; the data is damaged or not GLUE's "
                    f"{task.name}.") from None


def truncated_lengths(len_a: int, len_b: int, max_length: int) -> tuple[int, int]:
  """Lengths google-research/bert's _truncate_seq_pair keeps of a pair, within max_length.

  It drops the last token of the longer sequence (of B when they tie) until the pair fits:
  the longer one shrinks to the shorter, then they shrink in turn, A keeping the odd token.
  """
  if len_a + len_b <= max_length:
    return len_a, len_b
  return (min(len_a, max(max_length - len_b, (max_length + 1) // 2)),
          min(len_b, max(max_length - len_a, max_length // 2)))


def encode_examples(examples: Sequence[Example], task: GlueTask, tokenizer: Tokenizer,
                    max_seq_length: int) -> dict[str, np.ndarray]:
  """BERT's features of examples, as google-research/bert's convert_single_example.

  [CLS] A [SEP] B [SEP] with segment 0 for [CLS] A [SEP] and 1 for B [SEP]; a pair is truncated
  longest-first to max_seq_length - 3 pieces (`truncated_lengths`), a single text (or one whose
  B has no pieces) to max_seq_length - 2 as [CLS] A [SEP]; the rest is padding (pad_id, mask 0,
  segment 0).

  Args:
    examples: N examples of `task`.
    task: the task, for its labels.
    tokenizer: a bertjax.tokenization.Tokenizer.
    max_seq_length: length of every row, >= 3.

  Returns:
    input_ids, segment_ids, input_mask: [N, max_seq_length] int32; and, when every example has
    a label, label: [N] int32 class index (float32 score for STS-B).

  Raises:
    UserError: max_seq_length < 3, or a label the task does not know.
  """
  if max_seq_length < 3:
    raise UserError(f"max_seq_length={max_seq_length} cannot hold [CLS] A [SEP] B [SEP]; use "
                    "128 (BERT's GLUE setting) or at least 3.")
  n = len(examples)
  pieces_a = tokenizer.encode_batch([e.text_a for e in examples])
  with_b = [i for i, e in enumerate(examples) if e.text_b]
  pieces_b = [[] for _ in examples]
  for i, ids in zip(with_b, tokenizer.encode_batch([examples[i].text_b for i in with_b])):
    pieces_b[i] = ids
  input_ids = np.full((n, max_seq_length), tokenizer.pad_id, np.int32)
  segment_ids = np.zeros((n, max_seq_length), np.int32)
  input_mask = np.zeros((n, max_seq_length), np.int32)
  cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
  for i, (a, b) in enumerate(zip(pieces_a, pieces_b)):
    if b:
      len_a, len_b = truncated_lengths(len(a), len(b), max_seq_length - 3)
      row = [cls_id, *a[:len_a], sep_id, *b[:len_b], sep_id]
      segment_ids[i, len_a + 2:len(row)] = 1
    else:
      row = [cls_id, *a[:max_seq_length - 2], sep_id]
    input_ids[i, :len(row)] = row
    input_mask[i, :len(row)] = 1
  features = {"input_ids": input_ids, "segment_ids": segment_ids, "input_mask": input_mask}
  if all(e.label is not None for e in examples):
    features["label"] = np.array(
        [_label_index(task, e.label, f"example {e.guid}") for e in examples],
        np.float32 if task.is_regression else np.int32).reshape(n)
  return features
