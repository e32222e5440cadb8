"""SQuAD answers from start/end logits, as google-research/bert's run_squad.py writes them.

  result = postprocess(examples, features, start_logits, end_logits, tokenizer)
  write_prediction_files("out", result)  # predictions.json, nbest_predictions.json, null_odds.json

The n_best_size best starts and ends of each window form candidate spans
(start and end on context tokens, start at a max-context token, end >= start, at most
max_answer_length tokens); the best scores (start logit + end logit) over all windows of a
question give its n-best answers, each mapped back to the original text (`get_final_text`). For
SQuAD 2.0 the null answer scores the smallest [CLS] start + end logit over the windows; the
answer is "" when that null score minus the best non-null score exceeds
null_score_diff_threshold, and that difference is the question's entry in null_odds.json.

Where run_squad uses BERT's BasicTokenizer (in get_final_text), this module uses the same rules
(clean text, split CJK characters, lower-case and strip accents when the WordPiece tokenizer is
uncased, split on whitespace and punctuation) through the `tokenizers` library; with a
sentencepiece or byte-level BPE tokenizer (no BasicTokenizer: `Tokenizer.basic_tokenizer`) the
text is only split on whitespace, and a span's text is its pieces joined at "▁" or decoded
(`Tokenizer.span_text`).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from etils import epath

from bertjax.data.finetuning.squad import Example, Features, detokenize
from bertjax.tokenization import Tokenizer

PREDICTIONS_FILE = "predictions.json"
NBEST_FILE = "nbest_predictions.json"
NULL_ODDS_FILE = "null_odds.json"


def basic_tokenize(text: str, tokenizer: Tokenizer) -> list[str]:
  """`text` split as BERT's BasicTokenizer splits it for `tokenizer`'s casing (WordPiece), or on
  whitespace (sentencepiece, byte-level BPE: no BasicTokenizer)."""
  if not tokenizer.basic_tokenizer:
    return text.split()
  normalizer, pre_tokenizer = _bert_basic(getattr(tokenizer, "lowercase", True))
  return [piece for piece, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]


@functools.cache
def _bert_basic(lowercase: bool):
  """(normalizer, pre-tokenizer) of BERT's BasicTokenizer from the `tokenizers` library."""
  from tokenizers import normalizers, pre_tokenizers  # pylint: disable=import-outside-toplevel
  return (normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                     strip_accents=lowercase, lowercase=lowercase),
          pre_tokenizers.BertPreTokenizer())


def _strip_spaces(text: str) -> tuple[str, dict[int, int]]:
  """(text without spaces, its character positions -> positions in `text`)."""
  chars, positions = [], {}
  for i, c in enumerate(text):
    if c != " ":
      positions[len(chars)] = i
      chars.append(c)
  return "".join(chars), positions


def get_final_text(pred_text: str, orig_text: str, tokenizer: Tokenizer) -> str:
  """The part of `orig_text` (the original words a prediction spans) that the predicted tokens'
  text `pred_text` covers, as run_squad's get_final_text.

  orig_text is split as the tokenizer splits text (`basic_tokenize`: for uncased WordPiece
  lower-cased and accents stripped); pred_text is found in that, and the characters of both,
  spaces removed, are aligned one to one. So "steve smith" in "Steve Smith's" gives "Steve
  Smith". When pred_text is not found or the alignment fails (the normalized text has another
  length than the original), the whole of orig_text is returned.
  """
  tok_text = " ".join(basic_tokenize(orig_text, tokenizer))
  start = tok_text.find(pred_text)
  if start == -1:
    return orig_text
  end = start + len(pred_text) - 1
  orig_ns_text, orig_ns_to_s = _strip_spaces(orig_text)
  tok_ns_text, tok_ns_to_s = _strip_spaces(tok_text)
  if len(orig_ns_text) != len(tok_ns_text):
    return orig_text
  tok_s_to_ns = {s: ns for ns, s in tok_ns_to_s.items()}
  if start not in tok_s_to_ns or end not in tok_s_to_ns:
    return orig_text
  return orig_text[orig_ns_to_s[tok_s_to_ns[start]]:orig_ns_to_s[tok_s_to_ns[end]] + 1]


def _softmax(scores: Sequence[float]) -> list[float]:
  if not scores:
    return []
  top = max(scores)
  exp = [math.exp(s - top) for s in scores]
  total = sum(exp)
  return [e / total for e in exp]


@dataclasses.dataclass(frozen=True)
class Predictions:
  """What run_squad's write_predictions writes.

  Attributes:
    predictions: {qid: answer text} ("" = no answer, SQuAD 2.0): predictions.json.
    nbest: {qid: [{text, probability, start_logit, end_logit}, ...]}, best first:
      nbest_predictions.json.
    null_odds: {qid: null score - best non-null score} (SQuAD 2.0; empty otherwise):
      null_odds.json, the na_probs of the official evaluate-v2.0.py.
    version_2_with_negative: whether these are SQuAD 2.0 predictions.
  """
  predictions: dict[str, str]
  nbest: dict[str, list[dict[str, Any]]]
  null_odds: dict[str, float]
  version_2_with_negative: bool = False


def postprocess(examples: Sequence[Example], features: Features, start_logits: np.ndarray,
                end_logits: np.ndarray, tokenizer: Tokenizer, *,
                feature_index: np.ndarray | None = None, n_best_size: int = 20,
                max_answer_length: int = 30, version_2_with_negative: bool = False,
                null_score_diff_threshold: float = 0.0) -> Predictions:
  """Each question's answer from its windows' logits, as run_squad's write_predictions.

  Args:
    examples, features: as given to the model (convert_examples_to_features).
    start_logits, end_logits: [M, max_seq_length] logits of M windows.
    tokenizer: the features' tokenizer.
    feature_index: [M] the window (row of `features`) of each logits row; None: all, in order.
      Questions with a window that has no logits are left out.
    n_best_size: best starts and ends per window, and answers kept per question.
    max_answer_length: the longest answer, in tokens.
    version_2_with_negative: SQuAD 2.0: consider the null answer.
    null_score_diff_threshold: SQuAD 2.0: answer "" when null score - best non-null score
      exceeds this.

  Returns:
    Predictions, in example order.
  """
  if feature_index is None:
    feature_index = np.arange(len(features))
  logits_of = {int(f): (np.asarray(s, np.float64), np.asarray(e, np.float64))
               for f, s, e in zip(feature_index, start_logits, end_logits)}
  windows = collections.defaultdict(list)
  for f, example_index in enumerate(features.example_index):
    windows[int(example_index)].append(f)
  predictions, nbest_of, null_odds = {}, {}, {}
  for example_index, example in enumerate(examples):
    feature_ids = windows[example_index]
    if not all(f in logits_of for f in feature_ids):
      continue
    # (window, start, end, start logit, end logit), in run_squad's order before its stable sort.
    prelim = []
    score_null, null_window, null_start, null_end = 1000000.0, 0, 0.0, 0.0
    for window, f in enumerate(feature_ids):
      start_logit, end_logit = logits_of[f]
      if version_2_with_negative and start_logit[0] + end_logit[0] < score_null:
        score_null = start_logit[0] + end_logit[0]
        null_window, null_start, null_end = window, start_logit[0], end_logit[0]
      starts = np.argsort(-start_logit, kind="stable")[:n_best_size]  # [n] best first
      ends = np.argsort(-end_logit, kind="stable")[:n_best_size]
      in_context = features.token_to_orig[f] >= 0  # [seq]
      length = ends[None, :] - starts[:, None] + 1  # [n, n]
      valid = (in_context[starts] & features.token_is_max_context[f, starts])[:, None] & (
          in_context[ends][None, :]) & (length >= 1) & (length <= max_answer_length)
      for i, j in zip(*np.nonzero(valid)):  # start-major, as run_squad's loops
        prelim.append((window, int(starts[i]), int(ends[j]), float(start_logit[starts[i]]),
                       float(end_logit[ends[j]])))
    if version_2_with_negative:
      prelim.append((null_window, 0, 0, float(null_start), float(null_end)))
    prelim.sort(key=lambda p: p[3] + p[4], reverse=True)  # stable, as run_squad's sorted

    seen, nbest = set(), []
    for window, start, end, start_logit, end_logit in prelim:
      if len(nbest) >= n_best_size:
        break
      if start > 0:  # a span; 0 is [CLS], the null answer
        f = feature_ids[window]
        pred_text = detokenize(features.input_ids[f, start:end + 1], tokenizer)
        words = example.doc_tokens[features.token_to_orig[f, start]:
                                   features.token_to_orig[f, end] + 1]
        text = get_final_text(pred_text, " ".join(words), tokenizer)
        if text in seen:
          continue
      else:
        text = ""
      seen.add(text)
      nbest.append((text, start_logit, end_logit))
    if version_2_with_negative and "" not in seen:
      nbest.append(("", float(null_start), float(null_end)))
    if not nbest:  # no valid span at all (run_squad's nonce answer)
      nbest.append(("empty", 0.0, 0.0))
    probabilities = _softmax([s + e for _, s, e in nbest])
    nbest_of[example.qas_id] = [
        {"text": text, "probability": p, "start_logit": s, "end_logit": e}
        for (text, s, e), p in zip(nbest, probabilities)]
    if not version_2_with_negative:
      predictions[example.qas_id] = nbest[0][0]
      continue
    best_non_null = next((entry for entry in nbest if entry[0]), None)
    if best_non_null is None:  # only the null answer (run_squad would fail here)
      predictions[example.qas_id], null_odds[example.qas_id] = "", float(score_null)
      continue
    score_diff = float(score_null - best_non_null[1] - best_non_null[2])
    null_odds[example.qas_id] = score_diff
    predictions[example.qas_id] = "" if score_diff > null_score_diff_threshold else (
        best_non_null[0])
  return Predictions(predictions, nbest_of, null_odds, version_2_with_negative)


def write_prediction_files(directory: str | os.PathLike, result: Predictions) -> list[str]:
  """Writes predictions.json, nbest_predictions.json and (SQuAD 2.0) null_odds.json into
  `directory` as run_squad does (JSON, indent 4); returns the paths written."""
  files = [(PREDICTIONS_FILE, result.predictions), (NBEST_FILE, result.nbest)]
  if result.version_2_with_negative:
    files.append((NULL_ODDS_FILE, result.null_odds))
  paths = []
  for name, content in files:
    path = epath.Path(directory) / name
    path.write_text(json.dumps(content, indent=4) + "\n")
    paths.append(str(path))
  return paths
