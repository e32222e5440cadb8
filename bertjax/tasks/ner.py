"""Named-entity recognition fine-tuning on CoNLL-2003 (the paper, section 5.3): a `finetuning.Spec`.

  python -m bertjax.main --config=configs/ner.py --workdir=DIR \
      --config.init_checkpoint=CKPT --config.data.data_dir=CONLL_DIR \
      --config.data.predict_file=test.txt

CKPT is a pretraining workdir or a converted model directory (its bert_config.json and
tokenizer are used; a cased model suits NER). CONLL_DIR holds CoNLL-2003's train.txt and
valid.txt (or dev.txt), read by bertjax.data.finetuning.ner.

The model is `heads.BertForTokenClassification`: each word's first sub-token -> dropout ->
Dense(num_labels); the loss is softmax cross-entropy averaged over first sub-tokens. The classes
are the sorted tags of the training file (and "O"), saved as WORKDIR/labels.json; a run on a
workdir that has one keeps its order, so a resumed run and its predictions use the same ids.
Each evaluation maps the dev predictions back to one tag per word and scores them with seqeval
(entity-level precision, recall and F1 in its default, conlleval-compatible mode; token
accuracy over words); WORKDIR/eval_results.json holds the last one. After the last step the dev
predictions go to WORKDIR/eval_predictions.txt, and those of `data.predict_file` (if set) to
WORKDIR/test_predictions.txt, in CoNLL format ("word gold predicted" a line); when that file has
tags its scores go to WORKDIR/test_results.json.

The feature-based approach (the paper, section 5.3, Table 7; configs/ner.py:feature_based): with
`model.feature_layers` set, the model is `feature_based.BertForFeatureBasedTagging` instead: the
encoder frozen (no dropout, no gradient; train.frozen_params="bert" keeps the optimizer off it),
the chosen combination of its layers read by a two-layer BiLSTM of
`model.feature_bilstm_units` a direction, then dropout -> Dense(num_labels) on each word's first
sub-token as above. Data, loss, scores and files are those of fine-tuning.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
import optax
from etils import epath

from bertjax import metrics, run_config, tokenization
from bertjax.data.finetuning import ner as ner_data
from bertjax.errors import UserError
from bertjax.models import feature_based, heads
from bertjax.models.config import BertConfig
from bertjax.workdir import LABELS_FILE
from bertjax.tasks import finetuning

EVAL_PREDICTIONS_FILE = "eval_predictions.txt"
TEST_PREDICTIONS_FILE = "test_predictions.txt"
TEST_RESULTS_FILE = "test_results.json"
_EVAL_FILES = ("valid.txt", "dev.txt")  # data.eval_file "": the first that exists


@dataclasses.dataclass(frozen=True)
class Context:
  """What the model, `score` and `write` take from a read (finetuning.Data.context).

  Attributes:
    sets: {set name: (sentences, their windows, the source file)} of the eval and predict sets.
    labels: the tag of each class id.
    feature_layers: model.feature_layers: "" fine-tunes; else the feature-based layer
      combination.
    feature_bilstm_units: model.feature_bilstm_units (feature-based only).
  """
  sets: dict[str, tuple[list[ner_data.Sentence], list[ner_data.Window], str]]
  labels: list[str]
  feature_layers: str = ""
  feature_bilstm_units: int = 768


def check_feature_based(config: run_config.NerRun) -> tuple[str, int]:
  """(model.feature_layers, model.feature_bilstm_units), checked; ("", 0) for fine-tuning.

  Raises:
    UserError: an unknown layer combination, units below 1, an encoder the optimizer would
      still change (train.frozen_params without "bert"), or bilstm_on_top as well.
  """
  layers = config.model.feature_layers
  if not layers:
    return "", 0
  units = config.model.feature_bilstm_units
  if layers not in feature_based.LAYER_COMBINATIONS:
    raise UserError(f"model.feature_layers={layers!r}; use one of "
                    f"{', '.join(feature_based.LAYER_COMBINATIONS)} (the paper's Table 7), or "
                    "\"\" to fine-tune the whole model.")
  if not isinstance(units, int) or units < 1:
    raise UserError(f"model.feature_bilstm_units={units!r}; give the BiLSTM's units a "
                    "direction, a positive integer (the paper: 768).")
  if "bert" not in config.train.frozen:
    raise UserError(f"model.feature_layers={layers} trains on frozen encoder activations, but "
                    f"train.frozen_params={config.train.frozen_params!r} lets the "
                    "optimizer change the encoder (weight decay); set "
                    "--config.train.frozen_params=bert (configs/ner.py:feature_based does).")
  if config.model.bilstm_on_top:
    raise UserError("model.bilstm_on_top with model.feature_layers: the feature-based tagger "
                    "has its own two-layer BiLSTM; set --config.model.bilstm_on_top=false.")
  return layers, units


def model(bert_config: BertConfig, data: finetuning.Data):
  """The tagger: BertForTokenClassification (fine-tuning), or the feature-based one when the
  read's Context has feature_layers.

  Raises:
    UserError: a combination that needs more layers than the pretrained model has.
  """
  context = data.context
  if not context.feature_layers:
    return heads.BertForTokenClassification(bert_config, data.num_labels)
  try:
    feature_based.layer_indices(context.feature_layers, bert_config.num_layers)
  except ValueError as e:
    raise UserError(f"model.feature_layers: {e} Choose another combination.") from None
  return feature_based.BertForFeatureBasedTagging(
      bert_config, data.num_labels, feature_layers=context.feature_layers,
      bilstm_units=context.feature_bilstm_units)


def score_sentences(sentences: list[ner_data.Sentence],
                    predicted: list[list[str] | None]) -> dict[str, float]:
  """entity_scores of the sentences that have a prediction (None: left out); {} if none has."""
  pairs = [(list(s.tags), tags) for s, tags in zip(sentences, predicted) if tags is not None]
  if not pairs:  # an evaluation cut short (train.eval_steps) before a sentence's last row
    return {}
  return metrics.entity_scores([g for g, _ in pairs], [p for _, p in pairs])


def data_path(config: run_config.NerRun, name: str) -> str:
  """A data file: `name` under data.data_dir (an absolute `name` stands alone)."""
  return os.path.join(config.data.data_dir, name)


def eval_path(config: run_config.NerRun) -> str:
  """data.eval_file, or by default valid.txt, else dev.txt, in data.data_dir."""
  if config.data.eval_file:
    return data_path(config, config.data.eval_file)
  for name in _EVAL_FILES:
    if os.path.isfile(data_path(config, name)):
      return data_path(config, name)
  raise UserError(f"no {' or '.join(_EVAL_FILES)} in {config.data.data_dir or '.'}; set "
                  "--config.data.data_dir to CoNLL-2003's directory or --config.data.eval_file "
                  "to the dev file (e.g. eng.testa).")


def labels_for(workdir: str, train_sentences: list[ner_data.Sentence], source: str) -> list[str]:
  """The classes: WORKDIR/labels.json if a run there saved them, else the training tags."""
  tags = ner_data.label_list(train_sentences)
  saved = os.path.join(workdir, LABELS_FILE)
  if not os.path.isfile(saved):
    return tags
  with open(saved, encoding="utf-8") as f:
    labels = json.load(f)
  if not isinstance(labels, list) or not all(isinstance(t, str) for t in labels):
    raise UserError(f"{saved} is not a JSON list of tags; delete it or use a fresh workdir.")
  try:
    ner_data.check_tags(train_sentences, labels, source)
  except UserError as e:
    raise UserError(f"{e} (The tags are those {saved} saved; a different training file needs "
                    "a fresh workdir.)") from None
  return labels


def read(config: run_config.NerRun, tokenizer: tokenization.Tokenizer,
         workdir: str) -> finetuning.Data:
  """Reads the CoNLL files and encodes them into first-sub-token-labelled windows."""
  feature_layers, feature_units = check_feature_based(config)
  data = config.data
  train_file, dev_file = data_path(config, data.train_file), eval_path(config)
  train_sentences = ner_data.read_conll(train_file, data.label_column)
  labels = labels_for(workdir, train_sentences, train_file)
  eval_sentences = ner_data.read_conll(dev_file, data.label_column)
  if eval_sentences[0].tags is None:
    raise UserError(f"{dev_file} has no tags; data.eval_file must be a tagged dev file.")
  predict_file = data_path(config, data.predict_file) if data.predict_file else ""
  sets = {"eval": (eval_sentences, dev_file)}
  if predict_file:
    sets["test"] = (ner_data.read_conll(predict_file, data.label_column), predict_file)

  def encode(sentences, source):
    return ner_data.encode_sentences(sentences, labels, tokenizer, data.max_seq_length, source)

  train_features, _ = encode(train_sentences, train_file)
  encoded = {name: encode(*sentences_and_source) for name, sentences_and_source in sets.items()}
  context = Context({name: (sets[name][0], encoded[name][1], sets[name][1]) for name in sets},
                    labels, feature_layers, feature_units)
  return finetuning.Data(
      train=train_features, eval=encoded["eval"][0],
      predict={name: features for name, (features, _) in encoded.items() if name != "eval"},
      num_labels=len(labels), files={LABELS_FILE: json.dumps(labels) + "\n"}, context=context,
      summary=f"ner: {len(train_sentences)} training sentences "
              f"({len(train_features['input_ids'])} rows), {len(eval_sentences)} dev sentences, "
              f"{len(labels)} labels: {' '.join(labels)}" + (
                  f"; feature-based: {feature_layers} of the frozen encoder -> BiLSTM "
                  f"2 x {feature_units} a direction" if feature_layers else ""))


def terms(logits, batch):
  """Cross-entropy and accuracy over each word's first sub-token (label_weights [batch, seq]);
  logits [batch, seq, num_labels]."""
  weights = batch["label_weights"]
  return {"loss": (optax.softmax_cross_entropy_with_integer_labels(logits, batch["label_ids"]),
                   weights),
          "accuracy": (jnp.argmax(logits, -1) == batch["label_ids"], weights)}


def predict(logits, batch):
  """Each token's predicted class id and which tokens carry a word's tag (both [batch, seq])."""
  return {"prediction": jnp.argmax(logits, -1).astype(jnp.int32),
          "label_weights": batch["label_weights"]}


def tags_of_words(windows: Sequence[ner_data.Window], sentences: Sequence[ner_data.Sentence],
                  predictions: np.ndarray, label_weights: np.ndarray,
                  labels: Sequence[str]) -> list[list[str] | None]:
  """Per-row predictions back to one tag per word of each sentence.

  Args:
    windows: the windows of `ner_data.encode_sentences`, row r holding windows[r]'s words.
    sentences: the S sentences they were made from.
    predictions: [R, seq] predicted class ids, R <= len(windows) (the first R rows, as an
      evaluation cut short by train.eval_steps gives).
    label_weights: [R, seq], > 0 at each word's first sub-token.
    labels: the classes.

  Returns:
    [S] for each sentence its predicted tags ([num_words] str), or None where a row of it is
    missing (among the rows beyond R).

  Raises:
    ValueError: a row's first sub-tokens do not match its window's words.
  """
  out: list[list[str | None]] = [[None] * len(s.words) for s in sentences]
  for r, (row, weights) in enumerate(zip(predictions, label_weights)):
    window = windows[r]
    ids = np.asarray(row)[np.asarray(weights) > 0]
    if len(ids) != window.end - window.start:
      raise ValueError(f"row {r} has {len(ids)} first sub-tokens but its window holds "
                       f"{window.end - window.start} words; rows are out of order.")
    out[window.sentence][window.start:window.end] = [labels[int(i)] for i in ids]
  return [None if None in tags else tags for tags in out]


def write_conll(sentences: Sequence[ner_data.Sentence],
                predicted: Sequence[Sequence[str] | None], path: str) -> None:
  """Writes predictions in CoNLL format, as conlleval reads them: "word gold predicted" a line
  ("word predicted" for sentences without tags), a blank line after each sentence. Sentences
  whose prediction is None are left out. Written atomically."""
  lines = []
  for sentence, tags in zip(sentences, predicted):
    if tags is None:
      continue
    golds = sentence.tags or [None] * len(sentence.words)
    for word, gold, tag in zip(sentence.words, golds, tags):
      lines.append(f"{word} {tag}\n" if gold is None else f"{word} {gold} {tag}\n")
    lines.append("\n")
  path = os.fspath(path)
  with open(f"{path}.tmp", "w", encoding="utf-8") as f:
    f.writelines(lines)
  os.replace(f"{path}.tmp", path)


def _word_tags(data: finetuning.Data, name: str, predictions: dict[str, np.ndarray]):
  """(sentences, one predicted tag per word of each) of set `name`."""
  (sentences, windows, _), labels = data.context.sets[name], data.context.labels
  return sentences, tags_of_words(windows, sentences, predictions["prediction"],
                                  predictions["label_weights"], labels)


def score(data: finetuning.Data, predictions: dict[str, np.ndarray]) -> dict[str, float]:
  """seqeval's entity precision, recall, F1 and token accuracy over the dev words."""
  return score_sentences(*_word_tags(data, "eval", predictions))


def write(data: finetuning.Data, name: str, predictions: dict[str, np.ndarray],
          directory: epath.Path) -> None:
  """CoNLL "word gold predicted" lines; a tagged test file's scores to test_results.json."""
  sentences, predicted = _word_tags(data, name, predictions)
  if name == "eval":
    write_conll(sentences, predicted, str(directory / EVAL_PREDICTIONS_FILE))
    return
  write_conll(sentences, predicted, str(directory / TEST_PREDICTIONS_FILE))
  if sentences[0].tags is not None:
    scores = score_sentences(sentences, predicted)
    (directory / TEST_RESULTS_FILE).write_text(json.dumps(scores, indent=2) + "\n")
    print(f"{data.context.sets[name][2]}: " + ", ".join(f"{k}={v:.4f}" for k, v in scores.items()))


SPEC = finetuning.Spec(
    name="NER fine-tuning (a cased model suits NER)", read=read,
    model=model,
    terms=terms, predict=predict, score=score, write=write, padding_invariant=True,
    main_metric=lambda config: "f1",  # entity-level F1 (seqeval), as the paper's Table 7
    schema=run_config.NerRun)
