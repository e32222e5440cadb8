"""SQuAD fine-tuning: answer spans in a paragraph on a pretrained BERT (paper 4.2 and 4.3), a
`finetuning.Spec`.

  python -m bertjax.main --config=configs/squad.py --workdir=DIR --config.init_checkpoint=CKPT \
      --config.data.train_file=train-v1.1.json --config.data.predict_file=dev-v1.1.json

(configs/squad.py:v2.0 for SQuAD 2.0.) CKPT is a pretraining workdir or a converted model
directory (its bert_config.json and tokenizer are used). The files are SQuAD's JSON; questions
become windows of [CLS] question [SEP] context [SEP] as google-research/bert's run_squad.py makes
them (bertjax.data.finetuning.squad).

The model is `heads.BertForQuestionAnswering`: a Dense(2) on every token's final hidden state
gives start and end logits; the loss is the mean of the start and the end cross-entropy, each a
softmax over all max_seq_length positions of the row (padding included, as run_squad), against
the answer's first and last token ([CLS] where the window holds no answer). Training runs
int(training questions / batch_size * num_train_epochs) steps (`finetuning.schedule`: epochs
counted in questions, not windows, as run_squad counts its steps), with warmup over
`train.warmup_proportion` of them.

Each evaluation predicts every window of data.predict_file, turns the logits into answers as
run_squad's write_predictions does and scores them by the official scripts' rules
(bertjax.metrics.squad_metrics): v1.1 gives exact_match and f1; v2.0 gives evaluate-v2.0.py's
exact, f1, HasAns_*, NoAns_* and, from null_odds, best_exact / best_f1 and their thresholds.
WORKDIR/eval_results.json holds the last evaluation; after the last step WORKDIR holds
run_squad's predictions.json, nbest_predictions.json and (v2.0) null_odds.json, which the
official evaluate-v1.1.py / evaluate-v2.0.py read.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from etils import epath

from bertjax import metrics, run_config, tokenization
from bertjax.data.finetuning import squad as squad_data
from bertjax.tasks import squad_answers
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import finetuning


def read(config: run_config.SquadRun, tokenizer: tokenization.Tokenizer,
         workdir: str) -> finetuning.Data:
  """Reads the SQuAD files and cuts their questions into run_squad's windows."""
  del workdir  # nothing of SQuAD is kept there
  data = config.data
  version_2 = data.version_2_with_negative
  if not data.train_file or not data.predict_file:
    raise UserError("SQuAD fine-tuning needs --config.data.train_file and "
                    "--config.data.predict_file (e.g. train-v1.1.json and dev-v1.1.json).")
  if data.n_best_size < 1 or data.max_answer_length < 1:
    raise UserError(f"data.n_best_size={data.n_best_size} and data.max_answer_length="
                    f"{data.max_answer_length} must be >= 1 (run_squad: 20 and 30).")

  train_examples = squad_data.read_examples(
      squad_data.read_dataset(data.train_file), is_training=True,
      version_2_with_negative=version_2, source=data.train_file)
  eval_dataset = squad_data.read_dataset(data.predict_file)
  eval_examples = squad_data.read_examples(eval_dataset, is_training=False,
                                           version_2_with_negative=version_2,
                                           source=data.predict_file)
  unanswerable = [qa["id"] for qa in metrics.squad_questions(eval_dataset["data"])
                  if not qa.get("answers")]
  if unanswerable and not version_2:
    raise UserError(f"{data.predict_file} has {len(unanswerable)} questions without answers "
                    f"(e.g. {unanswerable[0]}): for SQuAD 2.0 set "
                    "--config.data.version_2_with_negative=True (configs/squad.py:v2.0); a "
                    "file without answers (a test set) cannot be scored.")
  for path, examples in ((data.train_file, train_examples), (data.predict_file, eval_examples)):
    if not examples:
      raise UserError(f"{path} holds no usable questions; give a SQuAD file with questions.")

  def features_of(examples, is_training):
    return squad_data.convert_examples_to_features(
        examples, tokenizer, max_seq_length=data.max_seq_length, doc_stride=data.doc_stride,
        max_query_length=data.max_query_length, is_training=is_training)

  train_features = features_of(train_examples, True)
  eval_features = features_of(eval_examples, False)
  return finetuning.Data(
      train=train_features.model_inputs(with_labels=True),
      eval=eval_features.model_inputs(with_labels=False),
      # Epochs are counted in questions, not windows, as run_squad counts its steps.
      examples_per_epoch=len(train_examples),
      context=(config.data, tokenizer, eval_dataset, eval_examples, eval_features),
      summary=f"squad{' v2.0' if version_2 else ''}: {len(train_examples)} training questions "
              f"({len(train_features)} windows), {len(eval_examples)} questions to predict "
              f"({len(eval_features)} windows)")


def terms(outputs, batch):
  """The mean of the start and the end cross-entropy, each a softmax over every position of the
  window (padding included, as run_squad), and their accuracies; {} for windows without
  answers (the eval windows). outputs: start and end logits, each [batch, seq]."""
  if "start_position" not in batch:
    return {}
  start_logits, end_logits = outputs
  start, end, weight = batch["start_position"], batch["end_position"], batch["example_weight"]
  ce = optax.softmax_cross_entropy_with_integer_labels
  return {"loss": ((ce(start_logits, start) + ce(end_logits, end)) / 2, weight),
          "start_accuracy": (jnp.argmax(start_logits, -1) == start, weight),
          "end_accuracy": (jnp.argmax(end_logits, -1) == end, weight)}


def predict(outputs, batch):
  """Each window's start and end logits and its index among the features."""
  start_logits, end_logits = outputs
  return {"start_logits": start_logits, "end_logits": end_logits,
          "feature_index": batch["feature_index"]}


def _only_questions(data: list, qids: set[str]) -> list:
  """SQuAD's data list reduced to the questions `qids`."""
  return [{"paragraphs": [{"qas": [qa for qa in p["qas"] if qa["id"] in qids]}
                          for p in article["paragraphs"]]} for article in data]


def answers(data: finetuning.Data,
            predictions: dict[str, np.ndarray]) -> squad_answers.Predictions:
  """run_squad's answers (best spans, n-best lists, null odds) from the windows' logits."""
  config_data, tokenizer, _, eval_examples, eval_features = data.context
  return squad_answers.postprocess(
      eval_examples, eval_features, predictions["start_logits"], predictions["end_logits"],
      tokenizer, feature_index=predictions["feature_index"],
      n_best_size=config_data.n_best_size, max_answer_length=config_data.max_answer_length,
      version_2_with_negative=config_data.version_2_with_negative,
      null_score_diff_threshold=config_data.null_score_diff_threshold)


def score(data: finetuning.Data, predictions: dict[str, np.ndarray]) -> dict[str, float]:
  """The official evaluation script's scores (v1.1: exact_match, f1; v2.0: evaluate-v2.0.py's)."""
  config_data, _, eval_dataset, eval_examples, _ = data.context
  result = answers(data, predictions)
  if not result.predictions:
    return {}
  scored = eval_dataset["data"]
  if len(result.predictions) < len(eval_examples):  # eval_steps cut the set short
    scored = _only_questions(scored, set(result.predictions))
  version_2 = config_data.version_2_with_negative
  return metrics.squad_metrics(scored, result.predictions,
                               na_probs=result.null_odds if version_2 else None,
                               version_2=version_2)


def write(data: finetuning.Data, name: str, predictions: dict[str, np.ndarray],
          directory: epath.Path) -> None:
  """run_squad's predictions.json, nbest_predictions.json and (v2.0) null_odds.json."""
  if name == "eval":
    squad_answers.write_prediction_files(directory, answers(data, predictions))


SPEC = finetuning.Spec(
    name="SQuAD fine-tuning", read=read,
    model=lambda bert_config, data: heads.BertForQuestionAnswering(bert_config),
    terms=terms, predict=predict, score=score, write=write,
    main_metric=lambda config: "f1",  # the paper's Tables 2 and 3 report F1 (and EM)
    schema=run_config.SquadRun)
