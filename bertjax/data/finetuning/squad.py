"""SQuAD v1.1 and v2.0: the JSON files and run_squad.py's features.

  dataset = read_dataset("dev-v1.1.json")             # the file's JSON (what metrics score against)
  examples = read_examples(dataset, is_training=False, version_2_with_negative=False)
  features = convert_examples_to_features(examples, tokenizer, max_seq_length=384,
                                          doc_stride=128, max_query_length=64, is_training=False)
  # then bertjax.tasks.squad_answers.postprocess(examples, features, start_logits, ...)

Each step follows google-research/bert's run_squad.py:
- reading: the context is split on whitespace into words (char -> word map); a training answer's
  character span becomes a word span, and a training question whose answer text cannot be found
  in its words is skipped (run_squad does so, with a warning); a training question has exactly one
  answer unless it is impossible (SQuAD 2.0's `is_impossible`, read only with
  version_2_with_negative).
- features: each word is tokenized on its own (`Tokenizer.encode_words`: byte-level BPE encodes
  " " + word, its pieces in running text; token -> word map); the answer's word span becomes
  a token span, narrowed to the tokens of the answer text where they occur inside it
  (`improve_answer_span`: "(1895-1943)." -> "1895"); the question is cut to max_query_length
  tokens; the context is cut into windows of max_seq_length - len(question) - 3 tokens that start
  doc_stride tokens apart, each a row [CLS] question [SEP] window [SEP] (segment 0, then 1) padded
  to max_seq_length. A training window that does not hold the whole answer, and every window of an
  impossible question, points at [CLS] (start = end = 0). A token in several windows has its
  "max context" in the one where min(left, right) context is largest (+ 0.01 * window length).
- postprocessing (logits -> answers): bertjax.tasks.squad_answers.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import logging

from bertjax.errors import UserError
from bertjax.tokenization import Tokenizer


# ----------------------------------------------------------------------------------------------
# Reading.


@dataclasses.dataclass(frozen=True)
class Example:
  """One question on one context, as run_squad's SquadExample.

  Attributes:
    qas_id: the question's id.
    question_text: the question.
    doc_tokens: the context's whitespace-separated words.
    orig_answer_text: the answer as written (training); "" otherwise.
    start_position, end_position: the first and last word of the answer (training, answerable);
      -1 otherwise.
    is_impossible: SQuAD 2.0: the context holds no answer (training with
      version_2_with_negative; False otherwise).
  """
  qas_id: str
  question_text: str
  doc_tokens: tuple[str, ...]
  orig_answer_text: str = ""
  start_position: int = -1
  end_position: int = -1
  is_impossible: bool = False


def read_dataset(path: str) -> dict[str, Any]:
  """The JSON object of a SQuAD file ({"version": ..., "data": [...]}).

  Raises:
    UserError: the file is missing, a directory, not UTF-8, not JSON, or not a JSON object with
      a "data" list.
  """
  path = os.fspath(path)
  if not path:
    raise UserError("no SQuAD file given; set --config.data.train_file and "
                    "--config.data.predict_file (e.g. train-v1.1.json and dev-v1.1.json).")
  if os.path.isdir(path):
    raise UserError(f"SQuAD file {path} is a directory; give the .json file (e.g. "
                    f"{os.path.join(path, 'train-v1.1.json')}).")
  if not os.path.isfile(path):
    raise UserError(f"SQuAD file {path} does not exist; give a SQuAD v1.1 or v2.0 .json file "
                    "(train-v1.1.json, dev-v1.1.json, train-v2.0.json, dev-v2.0.json).")
  with open(path, "rb") as f:
    raw = f.read()
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise UserError(f"{path} is not UTF-8 (byte {e.start}); SQuAD files are UTF-8 JSON, give "
                    "the file as published or convert it (iconv -t UTF-8).") from None
  try:
    dataset = json.loads(text)
  except ValueError as e:
    raise UserError(f"{path} is not valid JSON ({e}); give a SQuAD .json file as "
                    "published.") from None
  if not isinstance(dataset, dict) or not isinstance(dataset.get("data"), list):
    raise UserError(f"{path} is JSON but not SQuAD's format: it needs an object with a \"data\" "
                    "list of articles, each with \"paragraphs\" (context and qas).")
  return dataset


def _is_whitespace(c: str) -> bool:
  """run_squad's whitespace: space, tab, CR, LF and U+202F (narrow no-break space)."""
  return c in " \t\r\n" or ord(c) == 0x202F


def split_words(context: str) -> tuple[tuple[str, ...], list[int]]:
  """(words, char_to_word): the whitespace-separated words of `context` and, for each of its
  characters, the index of the word it belongs to (whitespace: the word before it, -1 first)."""
  words: list[str] = []
  char_to_word = []
  prev_is_whitespace = True
  for c in context:
    if _is_whitespace(c):
      prev_is_whitespace = True
    else:
      if prev_is_whitespace:
        words.append(c)
      else:
        words[-1] += c
      prev_is_whitespace = False
    char_to_word.append(len(words) - 1)
  return tuple(words), char_to_word


def _get(obj: Any, key: str, kind: type | tuple[type, ...], where: str, source: str) -> Any:
  """obj[key], checked to be of `kind`; UserError naming the place otherwise."""
  if not isinstance(obj, dict) or key not in obj:
    raise UserError(f"{source}: {where} lacks \"{key}\"; a SQuAD file has data[].paragraphs[] "
                    "with context and qas[] (id, question, answers[] of text and answer_start).")
  value = obj[key]
  if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
    kinds = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
    raise UserError(f"{source}: {where}.{key} is {type(value).__name__}, not {kinds}; fix the "
                    "file.")
  return value


def read_examples(dataset: dict[str, Any], *, is_training: bool, version_2_with_negative: bool,
                  source: str = "SQuAD file") -> list[Example]:
  """The questions of a SQuAD dataset (`read_dataset`) as Examples, as run_squad reads them.

  Args:
    dataset: the file's JSON object.
    is_training: take each question's answer (exactly one, unless impossible) as its label.
    version_2_with_negative: SQuAD 2.0: read `is_impossible` (training).
    source: the file's name, for messages.

  Returns:
    The examples in the file's order; training questions whose answer text is not found in the
    context's words are left out (a warning counts them).

  Raises:
    UserError: the file does not follow SQuAD's format, or a training question has no single
      answer inside its context.
  """
  examples = []
  skipped = 0
  for a, article in enumerate(dataset["data"]):
    for p, paragraph in enumerate(_get(article, "paragraphs", list, f"data[{a}]", source)):
      where_p = f"data[{a}].paragraphs[{p}]"
      context = _get(paragraph, "context", str, where_p, source)
      doc_tokens, char_to_word = split_words(context)
      for q, qa in enumerate(_get(paragraph, "qas", list, where_p, source)):
        where = f"{where_p}.qas[{q}]"
        qas_id = _get(qa, "id", str, where, source)
        question = _get(qa, "question", str, where, source)
        if not is_training:
          examples.append(Example(qas_id, question, doc_tokens))
          continue
        is_impossible = (bool(_get(qa, "is_impossible", (bool, int), where, source))
                         if version_2_with_negative and "is_impossible" in qa else False)
        if is_impossible:
          examples.append(Example(qas_id, question, doc_tokens, is_impossible=True))
          continue
        answers = _get(qa, "answers", list, where, source)
        if len(answers) != 1:
          hint = ("; for SQuAD 2.0 (unanswerable questions, is_impossible) set "
                  "--config.data.version_2_with_negative=True"
                  if not answers and not version_2_with_negative else "")
          raise UserError(f"{source}: training question {qas_id} ({where}) has {len(answers)} "
                          f"answers; each training question needs exactly one{hint}.")
        answer_text = _get(answers[0], "text", str, f"{where}.answers[0]", source)
        answer_start = _get(answers[0], "answer_start", int, f"{where}.answers[0]", source)
        answer_end = answer_start + len(answer_text) - 1
        if not answer_text or answer_start < 0 or answer_end >= len(context):
          raise UserError(f"{source}: the answer of question {qas_id} ({where}) spans characters "
                          f"[{answer_start}, {answer_end}], outside its context of "
                          f"{len(context)} characters (or is empty); fix answer_start.")
        start_position = char_to_word[answer_start]
        end_position = char_to_word[answer_end]
        # run_squad keeps only answers whose text can be found in the words they map to.
        actual_text = " ".join(doc_tokens[start_position:end_position + 1])
        if start_position < 0 or actual_text.find(" ".join(answer_text.split())) == -1:
          skipped += 1
          continue
        examples.append(Example(qas_id, question, doc_tokens, answer_text, start_position,
                                end_position))
  if skipped:
    logging.warning("%s: skipped %d training questions whose answer text is not found at its "
                    "answer_start (as run_squad does).", source, skipped)
  return examples


# ----------------------------------------------------------------------------------------------
# Features.


@dataclasses.dataclass(frozen=True)
class Features:
  """The windows of a list of examples, as run_squad's InputFeatures, in arrays.

  Attributes:
    input_ids, segment_ids, input_mask: [N, max_seq_length] int32: [CLS] question [SEP] window
      [SEP] and padding.
    start_position, end_position: [N] int32: the answer's first and last token in the row
      (training); 0 ([CLS]) when the window does not hold the whole answer, the question is
      impossible, or the features are not for training.
    example_index: [N] int32: the example (index into the examples) each window belongs to.
    doc_span_index: [N] int32: the window's number within its example.
    token_to_orig: [N, max_seq_length] int32: for each context token of the row, its word
      (index into the example's doc_tokens); -1 at [CLS], the question, [SEP] and padding.
    token_is_max_context: [N, max_seq_length] bool: whether this window gives the context token
      its maximum context (False outside the context).
  """
  input_ids: np.ndarray
  segment_ids: np.ndarray
  input_mask: np.ndarray
  start_position: np.ndarray
  end_position: np.ndarray
  example_index: np.ndarray
  doc_span_index: np.ndarray
  token_to_orig: np.ndarray
  token_is_max_context: np.ndarray

  def __len__(self) -> int:
    return len(self.input_ids)

  def model_inputs(self, *, with_labels: bool) -> dict[str, np.ndarray]:
    """The arrays a batch carries: input_ids, segment_ids, input_mask [N, seq], and
    start_position, end_position [N] (with_labels) or feature_index [N] int32 (the row's index
    here, so that predictions find their window)."""
    out = {"input_ids": self.input_ids, "segment_ids": self.segment_ids,
           "input_mask": self.input_mask}
    if with_labels:
      out.update(start_position=self.start_position, end_position=self.end_position)
    else:
      out["feature_index"] = np.arange(len(self), dtype=np.int32)
    return out


def doc_spans(num_tokens: int, max_tokens_for_doc: int,
              doc_stride: int) -> list[tuple[int, int]]:
  """The windows (start, length) over `num_tokens` context tokens: at most max_tokens_for_doc
  tokens each, starting doc_stride (or the window's length, if shorter) apart, the last one
  reaching the end. No tokens: no windows."""
  spans = []
  start = 0
  while start < num_tokens:
    length = min(num_tokens - start, max_tokens_for_doc)
    spans.append((start, length))
    if start + length == num_tokens:
      break
    start += min(length, doc_stride)
  return spans


def max_context(spans: Sequence[tuple[int, int]], num_tokens: int) -> np.ndarray:
  """[num_spans, num_tokens] bool: True where window s is token p's window of maximum context.

  A token's score in a window holding it is min(tokens left of it, tokens right of it) + 0.01 *
  the window's length; the first window with the highest score wins (run_squad's
  _check_is_max_context).
  """
  if not spans:
    return np.zeros((0, num_tokens), bool)
  position = np.arange(num_tokens)  # [num_tokens]
  scores = np.full((len(spans), num_tokens), -np.inf)
  for s, (start, length) in enumerate(spans):
    end = start + length - 1
    inside = (position >= start) & (position <= end)
    score = np.minimum(position - start, end - position) + 0.01 * length
    scores[s, inside] = score[inside]
  best = np.argmax(scores, axis=0)  # [num_tokens]: the first maximum
  return best[None, :] == np.arange(len(spans))[:, None]


def improve_answer_span(doc_ids: Sequence[int], start: int, end: int, tokenizer: Tokenizer,
                        answer_text: str) -> tuple[int, int]:
  """The token span [start, end] narrowed to the first sub-span (longest first for each start)
  whose tokens are exactly those of `answer_text`, or [start, end] itself if there is none
  (run_squad's _improve_answer_span: "(1895-1943)." holds the answer "1895").

  Without BERT's BasicTokenizer (sentencepiece, byte-level BPE: `Tokenizer.basic_tokenizer`),
  whose pieces inside a word carry no mark, "the same tokens" means the same text (`detokenize`):
  "(Zorbax)," is "▁(" "Zor" "bax" ")," but "Zorbax" alone "▁Zor" "bax" (BPE: "Ġ(" "Z" "or" "bax"
  against "ĠZ" "or" "bax").
  """
  answer_ids = list(tokenizer.encode(answer_text))
  if not tokenizer.basic_tokenizer:
    answer = detokenize(answer_ids, tokenizer)
    matches = lambda ids: detokenize(ids, tokenizer) == answer
  else:
    matches = lambda ids: list(ids) == answer_ids
  for new_start in range(start, end + 1):
    for new_end in range(end, new_start - 1, -1):
      if matches(doc_ids[new_start:new_end + 1]):
        return new_start, new_end
  return start, end


def _tokenize_words(words: Sequence[str], tokenizer: Tokenizer
                    ) -> tuple[list[int], np.ndarray, list[int]]:
  """(doc_ids, tok_to_orig [num_tokens], orig_to_tok [num_words]) of words tokenized one by one
  (`Tokenizer.encode_words`)."""
  pieces = tokenizer.encode_words(list(words)) if words else []
  orig_to_tok, doc_ids, tok_to_orig = [], [], []
  for i, ids in enumerate(pieces):
    orig_to_tok.append(len(doc_ids))
    doc_ids.extend(ids)
    tok_to_orig.extend([i] * len(ids))
  return doc_ids, np.asarray(tok_to_orig, np.int32), orig_to_tok


def convert_examples_to_features(examples: Sequence[Example], tokenizer: Tokenizer, *,
                                 max_seq_length: int, doc_stride: int, max_query_length: int,
                                 is_training: bool) -> Features:
  """The windows of every example (module docstring), in example order.

  Args:
    examples: from read_examples.
    tokenizer: a bertjax.tokenization.Tokenizer.
    max_seq_length: tokens in a row, > max_query_length + 3.
    doc_stride: tokens between the starts of consecutive windows, >= 1.
    max_query_length: the question is cut to this many tokens, >= 1.
    is_training: set start_position / end_position from the examples' answers.

  Returns:
    Features with one row per window.

  Raises:
    UserError: lengths that leave no room for the context, or doc_stride < 1.
  """
  if max_query_length < 1 or max_seq_length <= max_query_length + 3:
    raise UserError(f"data.max_seq_length={max_seq_length} must exceed data.max_query_length="
                    f"{max_query_length} + 3 ([CLS] question [SEP] context [SEP]) and "
                    "max_query_length must be >= 1; run_squad uses 384 and 64.")
  if doc_stride < 1:
    raise UserError(f"data.doc_stride={doc_stride}; use 1 or more (run_squad uses 128).")
  queries = tokenizer.encode_batch([e.question_text for e in examples]) if examples else []
  tokenized: dict[tuple[str, ...], tuple[list[int], np.ndarray, list[int]]] = {}
  rows: dict[str, list] = collections.defaultdict(list)
  for example_index, (example, query) in enumerate(zip(examples, queries)):
    query = query[:max_query_length]
    if example.doc_tokens not in tokenized:  # the questions of a context share its tokens
      tokenized[example.doc_tokens] = _tokenize_words(example.doc_tokens, tokenizer)
    doc_ids, tok_to_orig, orig_to_tok = tokenized[example.doc_tokens]
    tok_start = tok_end = -1
    if is_training and not example.is_impossible:
      tok_start = orig_to_tok[example.start_position]
      if example.end_position < len(example.doc_tokens) - 1:
        tok_end = orig_to_tok[example.end_position + 1] - 1
      else:
        tok_end = len(doc_ids) - 1
      tok_start, tok_end = improve_answer_span(doc_ids, tok_start, tok_end, tokenizer,
                                               example.orig_answer_text)
    spans = doc_spans(len(doc_ids), max_seq_length - len(query) - 3, doc_stride)
    is_max = max_context(spans, len(doc_ids))  # [num_spans, num_tokens]
    offset = len(query) + 2  # the first context token's position in a row
    for span_index, (start, length) in enumerate(spans):
      end = start + length  # one past the window's last token
      ids = np.full(max_seq_length, tokenizer.pad_id, np.int32)
      ids[:offset] = [tokenizer.cls_id, *query, tokenizer.sep_id]
      ids[offset:offset + length] = doc_ids[start:end]
      ids[offset + length] = tokenizer.sep_id
      segment = np.zeros(max_seq_length, np.int32)
      segment[offset:offset + length + 1] = 1
      mask = np.zeros(max_seq_length, np.int32)
      mask[:offset + length + 1] = 1
      to_orig = np.full(max_seq_length, -1, np.int32)
      to_orig[offset:offset + length] = tok_to_orig[start:end]
      max_ctx = np.zeros(max_seq_length, bool)
      max_ctx[offset:offset + length] = is_max[span_index, start:end]
      start_position = end_position = 0
      if tok_start >= 0 and tok_start >= start and tok_end < end:
        start_position, end_position = tok_start - start + offset, tok_end - start + offset
      for key, value in (("input_ids", ids), ("segment_ids", segment), ("input_mask", mask),
                         ("start_position", start_position), ("end_position", end_position),
                         ("example_index", example_index), ("doc_span_index", span_index),
                         ("token_to_orig", to_orig), ("token_is_max_context", max_ctx)):
        rows[key].append(value)
  if not rows:
    empty = np.zeros((0, max_seq_length), np.int32)
    return Features(empty, empty, empty, np.zeros(0, np.int32), np.zeros(0, np.int32),
                    np.zeros(0, np.int32), np.zeros(0, np.int32), empty,
                    np.zeros((0, max_seq_length), bool))
  stacked = {key: np.stack(value) if key in ("input_ids", "segment_ids", "input_mask",
                                             "token_to_orig", "token_is_max_context")
             else np.asarray(value, np.int32) for key, value in rows.items()}
  return Features(**stacked)


def detokenize(ids: Sequence[int], tokenizer: Tokenizer) -> str:
  """The text of token ids as run_squad rebuilds it (`Tokenizer.span_text`): pieces joined by
  spaces with "##" continuations glued on (sentencepiece: pieces joined, "▁" a space; byte-level
  BPE: the decoded text), whitespace collapsed."""
  return tokenizer.span_text(ids)
