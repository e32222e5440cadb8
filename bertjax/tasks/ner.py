"""Named-entity recognition fine-tuning on CoNLL-2003 (the paper, section 5.3): a `finetuning.Spec`.

  python -m bertjax.main --config=configs/ner.py --workdir=DIR \
      --config.init_checkpoint=CKPT --config.data.data_dir=CONLL_DIR \
      --config.data.predict_file=test.txt

CKPT is a pretraining workdir or a converted model directory (its bert_config.json and
tokenizer are used; a cased model suits NER). CONLL_DIR holds CoNLL-2003's train.txt and
valid.txt (or dev.txt), read by bertjax.data.ner.

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
"""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from etils import epath

from bertjax import metrics, tokenization
from bertjax.data import ner as ner_data
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import finetuning

LABELS_FILE = "labels.json"
EVAL_PREDICTIONS_FILE = "eval_predictions.txt"
TEST_PREDICTIONS_FILE = "test_predictions.txt"
TEST_RESULTS_FILE = "test_results.json"
_EVAL_FILES = ("valid.txt", "dev.txt")  # data.eval_file "": the first that exists


def score_sentences(sentences: list[ner_data.Sentence],
                    predicted: list[list[str] | None]) -> dict[str, float]:
  """entity_scores of the sentences that have a prediction (None: left out); {} if none has."""
  pairs = [(list(s.tags), tags) for s, tags in zip(sentences, predicted) if tags is not None]
  if not pairs:  # an evaluation cut short (train.eval_steps) before a sentence's last row
    return {}
  return metrics.entity_scores([g for g, _ in pairs], [p for _, p in pairs])


def data_path(config: ml_collections.ConfigDict, name: str) -> str:
  """A data file: `name` under data.data_dir (an absolute `name` stands alone)."""
  return os.path.join(config.data.data_dir, name)


def eval_path(config: ml_collections.ConfigDict) -> str:
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


def read(config: ml_collections.ConfigDict, tokenizer: tokenization.Tokenizer,
         workdir: str) -> finetuning.Data:
  """Reads the CoNLL files and encodes them into first-sub-token-labelled windows."""
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
  # context: {set name: (sentences, windows, source)} and the labels, for scoring and writing
  context = ({name: (sets[name][0], encoded[name][1], sets[name][1]) for name in sets}, labels)
  return finetuning.Data(
      train=train_features, eval=encoded["eval"][0],
      predict={name: features for name, (features, _) in encoded.items() if name != "eval"},
      num_labels=len(labels), files={LABELS_FILE: json.dumps(labels) + "\n"}, context=context,
      summary=f"ner: {len(train_sentences)} training sentences "
              f"({len(train_features['input_ids'])} rows), {len(eval_sentences)} dev sentences, "
              f"{len(labels)} labels: {' '.join(labels)}")


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


def _word_tags(data: finetuning.Data, name: str, predictions: dict[str, np.ndarray]):
  """(sentences, one predicted tag per word of each) of set `name`."""
  (sentences, windows, _), labels = data.context[0][name], data.context[1]
  return sentences, ner_data.tags_of_words(windows, sentences, predictions["prediction"],
                                           predictions["label_weights"], labels)


def score(data: finetuning.Data, predictions: dict[str, np.ndarray]) -> dict[str, float]:
  """seqeval's entity precision, recall, F1 and token accuracy over the dev words."""
  return score_sentences(*_word_tags(data, "eval", predictions))


def write(data: finetuning.Data, name: str, predictions: dict[str, np.ndarray],
          directory: epath.Path) -> None:
  """CoNLL "word gold predicted" lines; a tagged test file's scores to test_results.json."""
  sentences, predicted = _word_tags(data, name, predictions)
  if name == "eval":
    ner_data.write_conll(sentences, predicted, str(directory / EVAL_PREDICTIONS_FILE))
    return
  ner_data.write_conll(sentences, predicted, str(directory / TEST_PREDICTIONS_FILE))
  if sentences[0].tags is not None:
    scores = score_sentences(sentences, predicted)
    (directory / TEST_RESULTS_FILE).write_text(json.dumps(scores, indent=2) + "\n")
    print(f"{data.context[0][name][2]}: " + ", ".join(f"{k}={v:.4f}" for k, v in scores.items()))


SPEC = finetuning.Spec(
    name="NER fine-tuning (a cased model suits NER)", read=read,
    model=lambda bert_config, data: heads.BertForTokenClassification(bert_config,
                                                                     data.num_labels),
    terms=terms, predict=predict, score=score, write=write, padding_invariant=True,
    main_metric=lambda config: "f1")  # entity-level F1 (seqeval), as the paper's Table 7
