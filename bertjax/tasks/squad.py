"""SQuAD fine-tuning: answer spans in a paragraph on a pretrained BERT (paper 4.2 and 4.3).

  python -m bertjax.main --config=configs/squad.py --workdir=DIR --config.init_checkpoint=CKPT \
      --config.data.train_file=train-v1.1.json --config.data.predict_file=dev-v1.1.json

(configs/squad.py:v2.0 for SQuAD 2.0.) CKPT is a pretraining workdir or a converted model
directory (its bert_config.json and tokenizer are used). The files are SQuAD's JSON; questions
become windows of [CLS] question [SEP] context [SEP] as google-research/bert's run_squad.py makes
them (bertjax.data.squad).

The model is `heads.BertForQuestionAnswering`: a Dense(2) on every token's final hidden state
gives start and end logits; the loss is the mean of the start and the end cross-entropy, each a
softmax over all max_seq_length positions of the row (padding included, as run_squad), against
the answer's first and last token ([CLS] where the window holds no answer). Training runs
num_train_epochs * (training questions // batch_size) steps (epochs counted in questions, not
windows, as run_squad counts its steps), with warmup over `train.warmup_proportion` of them.

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
import ml_collections
import numpy as np
import optax
from etils import epath

from bertjax import metrics, train
from bertjax.data import squad as squad_data
from bertjax.data import squad_answers
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.tasks import finetuning


def make_loss_fn(model: heads.BertForQuestionAnswering):
  """(params, batch, rng) -> ((start CE + end CE) / 2, {start_accuracy, end_accuracy})."""

  def loss_fn(params, batch, rng):
    start_logits, end_logits = model.apply(
        {"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
        deterministic=False, rngs={"dropout": rng})  # each [batch, seq]
    # run_squad's softmax runs over every position, padding included.
    start_loss = optax.softmax_cross_entropy_with_integer_labels(start_logits,
                                                                 batch["start_position"])
    end_loss = optax.softmax_cross_entropy_with_integer_labels(end_logits, batch["end_position"])
    loss = (start_loss.mean() + end_loss.mean()) / 2
    return loss, {
        "start_accuracy": jnp.mean(jnp.argmax(start_logits, -1) == batch["start_position"]),
        "end_accuracy": jnp.mean(jnp.argmax(end_logits, -1) == batch["end_position"])}

  return loss_fn


def make_eval_fns(model: heads.BertForQuestionAnswering):
  """(eval_fn: the number of real windows, predict_fn: each window's start and end logits)."""

  def eval_fn(params, batch):
    del params  # the scores come from the predictions
    return {"windows": jnp.sum(batch["example_weight"])}

  def predict_fn(params, batch):
    start_logits, end_logits = model.apply(
        {"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
        deterministic=True)  # each [batch, seq]
    return {"start_logits": start_logits, "end_logits": end_logits,
            "feature_index": batch["feature_index"]}

  return eval_fn, predict_fn


def _only_questions(data: list, qids: set[str]) -> list:
  """SQuAD's data list reduced to the questions `qids`."""
  return [{"paragraphs": [{"qas": [qa for qa in p["qas"] if qa["id"] in qids]}
                          for p in article["paragraphs"]]} for article in data]


def make_task(config: ml_collections.ConfigDict, workdir: str) -> train.Task:
  """Reads the SQuAD files, builds their windows and the fine-tuning Task; sets the run's
  num_train_steps, warmup_steps and (if -1) eval/checkpoint intervals in `config`."""
  del workdir  # the trainer writes there
  finetuning.check_batch_sizes(config)
  pretrained = finetuning.load_pretrained(config, "SQuAD fine-tuning")
  tok = pretrained.tokenizer
  data, tr = config.data, config.train
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
        examples, tok, max_seq_length=data.max_seq_length, doc_stride=data.doc_stride,
        max_query_length=data.max_query_length, is_training=is_training)

  train_features = features_of(train_examples, True)
  eval_features = features_of(eval_examples, False)

  train_batches = finetuning.feature_batches(
      config, train_features.model_inputs(with_labels=True), training=True)
  eval_batches = finetuning.feature_batches(
      config, eval_features.model_inputs(with_labels=False), training=False)
  # Epochs are counted in questions, not windows, as run_squad counts its steps.
  finetuning.set_schedule(config, max(1, len(train_examples) // tr.batch_size))

  model = heads.BertForQuestionAnswering(pretrained.bert_config)
  eval_fn, predict_fn = make_eval_fns(model)

  def init_params(rng, batch):
    return model.init({"params": rng}, batch["input_ids"], batch["segment_ids"],
                      batch["input_mask"], deterministic=True)["params"]

  def answers(predictions: dict[str, np.ndarray]) -> squad_answers.Predictions:
    return squad_answers.postprocess(
        eval_examples, eval_features, predictions["start_logits"], predictions["end_logits"],
        tok, feature_index=predictions["feature_index"], n_best_size=data.n_best_size,
        max_answer_length=data.max_answer_length, version_2_with_negative=version_2,
        null_score_diff_threshold=data.null_score_diff_threshold)

  def score_predictions(predictions: dict[str, np.ndarray]) -> dict[str, float]:
    result = answers(predictions)
    if not result.predictions:
      return {}
    scored = eval_dataset["data"]
    if len(result.predictions) < len(eval_examples):  # eval_steps cut the set short
      scored = _only_questions(scored, set(result.predictions))
    return metrics.squad_metrics(scored, result.predictions,
                                 na_probs=result.null_odds if version_2 else None,
                                 version_2=version_2)

  def write_predictions(split: str, predictions: dict[str, np.ndarray],
                        directory: epath.Path) -> None:
    if split == "eval":
      squad_answers.write_prediction_files(directory, answers(predictions))

  print(f"squad{' v2.0' if version_2 else ''}: {len(train_examples)} training questions "
        f"({len(train_features)} windows, {tr.num_train_steps} steps), {len(eval_examples)} "
        f"questions to predict ({len(eval_features)} windows)")
  return train.Task(
      init_params=init_params, loss_fn=make_loss_fn(model), eval_fn=eval_fn,
      summarize_eval=lambda sums: {}, train_batches=train_batches.iterate,
      eval_batches=eval_batches.eval_batches, init_batch=next(train_batches.iterate(None))[0],
      files=pretrained.files,
      predict_fn=predict_fn, score_predictions=score_predictions,
      write_predictions=write_predictions, head="span")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Fine-tunes on SQuAD; returns the last evaluation of data.predict_file."""
  train.make_checked_mesh(config)
  return train.train_and_evaluate(config, workdir, make_task(config, workdir))
