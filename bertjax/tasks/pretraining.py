"""Pretraining: masked LM + next-sentence prediction on the user's text (the paper, section 3.1).

Text (the bundled corpus, the user's files or a TFDS dataset) is prepared once by
`bertjax.data.prepare` into shards: a vocabulary, tokenized documents split into training and
held-out ones, NSP pairs per sequence length. A run takes `data.prepared` (a directory made by
that command) or prepares its text into WORKDIR/data on first use and reuses it after. The
vocabulary is `data.vocab_model`, else `init_checkpoint`'s (continued pretraining keeps the
vocabulary its embeddings were trained with), else one trained on the text
(`bertjax.tasks.pretraining_data`). Batches stream from the shards
(`bertjax.data.pretraining.loader`) into `BertForPreTraining` and the trainer.

Sequence-length phases: as in the paper, a run can train the first steps at
`data.max_seq_length` (128) and the rest at `data.long_seq_length` (512), from step
`train.long_seq_from_step`; each phase reads its own pairs. The data position stored with each
checkpoint records the phase and the global stream position, so a resumed run continues in it,
on any number of hosts.

Packing (`data.packing`, Krell et al. 2021): each training row holds up to
`data.max_sequences_per_row` pairs, grouped by the plans made at preparation, attention kept
within each pair (sequence_ids), positions restarting per pair, an NSP label and its own masks
per pair; the loss and the metrics are the same per example, and batch_size counts rows.
Evaluation is not packed.

The pretraining-task ablations of the paper (section 5.1, Table 5), by `config.pretraining`:
`nsp=false` is "No NSP": the masked LM alone (no NSP head, pooler, loss or metrics) on
contiguous spans `[CLS] A [SEP] B [SEP]`, each span as long as the sequence allows from one
document, cut into two segments at a sentence boundary so that both segment embeddings train
(prepared with --contiguous=true; `bertjax.data.pretraining.pairs.iter_contiguous_spans`).
`objective=ltr` is "LTR & No NSP": a left-to-right LM on the same spans, a causal encoder
(BertConfig.causal, recorded in bert_config.json, so fine-tuning from it keeps the causal mask),
no [MASK] corruption, and each real position's next token scored by the tied MLM head
(`loader.NextTokens`): next_token_loss, next_token_accuracy, and the perplexity in
evaluations. Neither is packed (the spans fill their rows; `pretraining_config.check_config`).
The config's checks, the objective's predicates and the model's BertConfig are
`bertjax.tasks.pretraining_config`.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import jax.numpy as jnp
import numpy as np
import optax

from bertjax import run_config
from bertjax.data.pretraining import loader, masking
from bertjax.errors import UserError
from bertjax.modeldir import model_files
from bertjax.models import heads
from bertjax.tasks import pretraining_config, pretraining_data
from bertjax.training import task as task_lib
from bertjax.training import train

# ----------------------------------------------------------------------------------------------
# Loss and metrics.


def make_terms(baseline_token: int, nsp: bool = True, left_to_right: bool = False,
               second_masking: str = ""):
  """(outputs, batch) -> the terms of pretraining (`task.Terms`): the paper's objective is the
  sum of the MLM mean (cross-entropy over the real masked positions, masked_lm_weights) and the
  NSP mean (over the examples), with their accuracies and the MLM accuracy of always guessing
  `baseline_token` (the frequency baseline). Packed batches give the same terms per example:
  their predictions are [batch, W] (`packing.predictions_per_row`) and their examples
  [batch, k].

  Without `nsp` (No NSP, and the left-to-right LM) there are no NSP terms. `left_to_right` names
  the LM terms next_token_* (the batch's masked_lm_* are then every position's next token,
  `loader.NextTokens`): next_token_loss is the mean cross-entropy of each real token given
  those before it.

  Held-out batches masked at a second rate (data.eval_masked_lm_prob) carry "eval_masking"
  ([batch], 1 for them; `_at_two_rates`): the MLM terms of those rows are scored apart, named
  mlm_loss`second_masking` and mlm_accuracy`second_masking` (e.g. "_at_15pct"), and their
  NSP terms left out (the same pairs are scored at the first rate)."""
  lm = "next_token" if left_to_right else "mlm"

  def terms(outputs, batch):
    # [batch, predictions, vocab], [batch, 2] ([batch, k, 2] packed; None without NSP); float32
    mlm_logits, nsp_logits = outputs
    ids = batch["masked_lm_ids"]
    mlm_weight = batch["masked_lm_weights"]  # [batch, predictions]
    example_weight = batch["example_weight"]  # [batch] ([batch, k] packed; 0: empty slot)
    loss = optax.softmax_cross_entropy_with_integer_labels(mlm_logits, ids)
    correct = jnp.argmax(mlm_logits, -1) == ids
    second = {}
    if "eval_masking" in batch:  # held-out rows at two rates: [batch], 1 at the second
      at_second = batch["eval_masking"].astype(mlm_weight.dtype)
      second = {f"{lm}_loss{second_masking}": (loss, mlm_weight * at_second[:, None]),
                f"{lm}_accuracy{second_masking}": (correct, mlm_weight * at_second[:, None])}
      mlm_weight = mlm_weight * (1 - at_second)[:, None]
      example_weight = example_weight * (1 - at_second)
    lm_terms = {
        f"{lm}_loss": (loss, mlm_weight),
        f"{lm}_accuracy": (correct, mlm_weight),
        f"frequency_baseline_{lm}_accuracy": (ids == baseline_token, mlm_weight)}
    if not nsp:
      return {**lm_terms, **second}
    labels = batch["next_sentence_label"]
    return {
        "mlm_loss": lm_terms["mlm_loss"],
        "nsp_loss": (optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels),
                     example_weight),
        "mlm_accuracy": lm_terms["mlm_accuracy"],
        "nsp_accuracy": (jnp.argmax(nsp_logits, -1) == labels, example_weight),
        "frequency_baseline_mlm_accuracy": lm_terms["frequency_baseline_mlm_accuracy"],
        **second}

  return terms


def score(totals: dict[str, Any], predictions: None) -> dict[str, float]:
  """Evaluation totals -> the means (loss = MLM + NSP, or the one LM loss without NSP), the LM's
  perplexity (mlm_perplexity or next_token_perplexity), and the number of held-out examples
  (with NSP) or of scored tokens, `predictions` (without)."""
  del predictions  # pretraining is scored by its sums alone
  metrics = task_lib.means(totals)
  lm = "next_token" if "next_token_loss" in metrics else "mlm"
  metrics[f"{lm}_perplexity"] = float(np.exp(min(metrics[f"{lm}_loss"], 50.0)))
  if "nsp_loss" in totals:
    metrics["examples"] = float(totals["nsp_loss"].count)
  else:
    metrics["predictions"] = float(totals[f"{lm}_loss"].count)
  return metrics


# ----------------------------------------------------------------------------------------------
# The task.


class _Phases:
  """Training batches over the sequence-length phases, with a position that records the phase.

  Position: {"phase": 0 or 1, "batches": batches served so far, "examples": the global stream
  position in the current phase (loader.PairBatches.iterate), "packed": whether the stream is
  of packed rows (absent in checkpoints from before packing: False)}.
  """

  def __init__(self, phases: list[loader.PairBatches], switch_step: int, packed: bool):
    self.phases = phases
    self._switch_step = switch_step  # 0 = one phase
    self._packed = packed

  def _parse(self, position: dict | None) -> tuple[int, int, int]:
    """(phase, batches served, examples) of `position` (None: the start), checked."""
    position = position or {"phase": 0, "batches": 0, "examples": 0, "packed": self._packed}
    if bool(position.get("packed", False)) != self._packed:
      was = bool(position.get("packed", False))
      raise UserError(f"the checkpoint was trained with data.packing={was} and this run asks "
                      f"for data.packing={self._packed}: its data position counts "
                      f"{'packed rows' if was else 'unpacked examples'}, so switching would not "
                      f"continue the same data. Resume with --config.data.packing={was}, or "
                      "start a fresh workdir (init_checkpoint=the old one) to switch.")
    try:
      phase, served, examples = (int(position[k]) for k in ("phase", "batches", "examples"))
      if phase >= len(self.phases):
        raise ValueError(phase)
    except (KeyError, TypeError, ValueError) as e:
      raise UserError(f"data position {position!r} is not {{'phase', 'batches', 'examples'}} of "
                      "this data: the checkpoint comes from another data pipeline. Start from a "
                      "fresh workdir.") from e
    return phase, served, examples

  def _switching(self, phase: int, served: int) -> bool:
    """Whether the step after `served` ones is the long phase's first."""
    return phase == 0 and bool(self._switch_step) and served == self._switch_step

  def iterate(self, position: dict | None) -> Iterator[tuple[dict, dict]]:
    phase, served, examples = self._parse(position)
    inner = self.phases[phase].iterate(examples)
    while True:
      if self._switching(phase, served):
        phase, inner = 1, self.phases[1].iterate(0)
        rows = self.phases[1].batch_size * self.phases[1].process_count
        print(f"after {served} steps (train.long_seq_from_step): sequences of "
              f"{self.phases[1].length} tokens (data.long_seq_length) from here, {rows} rows a "
              "batch", flush=True)
      batch, examples = next(inner)
      served += 1
      yield batch, {"phase": phase, "batches": served, "examples": examples,
                    "packed": self._packed}

  def skip(self, position: dict | None, count: int) -> dict:
    """The position `count` batches further on in the stream of the phase the next step trains
    in, its steps served unchanged, so that the long phase still starts at its step (a rollback
    of the divergence guard)."""
    phase, served, examples = self._parse(position)
    if self._switching(phase, served):
      phase, examples = 1, 0
    inner = self.phases[phase].iterate(examples)
    for _ in range(count):
      _, examples = next(inner)
    return {"phase": phase, "batches": served, "examples": examples, "packed": self._packed}


def second_masking(data: run_config.PretrainingData) -> str:
  """The suffix of the held-out MLM metrics at data.eval_masked_lm_prob ("_at_15pct" for 0.15),
  or "" when it is unset."""
  return f"_at_{data.eval_masked_lm_prob * 100:g}pct" if data.eval_masked_lm_prob else ""


def _at_two_rates(first: Callable[[], Iterator[dict]], second: Callable[[], Iterator[dict]]
                  ) -> Callable[[], Iterator[dict]]:
  """() -> the held-out batches of `first` and `second` (the same rows masked at two rates),
  each pair as one batch of twice the rows, marked by "eval_masking" ([rows] int32: 0 for
  `first`'s, 1 for `second`'s) for `make_terms`; train.eval_steps still counts the pairs."""

  def batches():
    for at_first, at_second in zip(first(), second(), strict=True):
      rows = len(at_first["input_ids"])
      masking = np.repeat(np.arange(2, dtype=np.int32), rows)
      yield {**{k: np.concatenate([v, at_second[k]]) for k, v in at_first.items()},
             "eval_masking": masking}

  return batches


def make_task(config: run_config.PretrainingRun, workdir: str,
              context: task_lib.RunContext) -> task_lib.Task:
  """Prepares the text if needed (WORKDIR/data) and builds the pretraining Task, this host's
  share of each batch as `context` says."""
  pretraining_config.check_config(config)
  pretraining_data.check_vocabulary(config)
  data, tr = config.data, config.train
  prepared = pretraining_data.prepared_data(config, workdir)
  tok = pretraining_data.data_tokenizer(prepared, workdir)
  pretraining_data.check_prepared(prepared, config)
  special = masking.SpecialTokens.from_tokenizer(tok)
  word_tables = tok.word_boundary_tables() if data.whole_word_masking else None
  nsp = config.pretraining.uses_nsp
  left_to_right = config.pretraining.left_to_right

  def batches(length: int, max_predictions: int, batch_size: int, packing: bool = False,
              masked_lm_prob: float = data.masked_lm_prob) -> loader.PairBatches:
    if left_to_right:
      targets = loader.NextTokens(special, config.seed)
    else:
      targets = loader.Masking(special, masked_lm_prob, max_predictions,
                               data.dynamic_masking, config.seed, word_tables)
    return loader.PairBatches(prepared, length, targets,
                              batch_size=batch_size // context.process_count,
                              process_index=context.process_index,
                              process_count=context.process_count, threads=data.loader_threads,
                              packing=packing, contiguous=not nsp)

  phases = [batches(data.max_seq_length, data.max_predictions_per_seq, tr.batch_size,
                    data.packing)]
  if data.long_seq_length:
    long_rows = tr.long_batch_size or tr.batch_size
    if long_rows % context.row_multiple:
      raise UserError(f"train.long_batch_size={long_rows} must be a multiple of "
                      f"{context.row_multiple} (the devices a batch splits over, times "
                      "train.grad_accum_steps, and the hosts), as train.batch_size is.")
    phases.append(batches(data.long_seq_length, data.long_max_predictions_per_seq, long_rows,
                          data.packing))
  for phase in phases:  # opens every phase's shards (and plans): a damaged one is named now
    phase.num_examples()
    phase.num_rows()

  def held_out(length: int, max_predictions: int):
    """() -> the held-out batches at this length, at both masking rates when a second is set."""
    first = batches(length, max_predictions, tr.eval_batch_size).eval_batches
    if not data.eval_masked_lm_prob:
      return first
    return _at_two_rates(first, batches(length, max_predictions, tr.eval_batch_size,
                                        masked_lm_prob=data.eval_masked_lm_prob).eval_batches)

  eval_batches = batches(data.max_seq_length, data.max_predictions_per_seq, tr.eval_batch_size)
  num_eval = eval_batches.num_examples("heldout")
  baseline_token = int(prepared.info["most_common_token"])
  bert_config = pretraining_config.model_config(config, tok.vocab_size)
  # ModernBERT's context extension: the long phase runs its own global rotary base (a model of
  # its own for batches of its length, the same parameters) and evaluates at its length; the
  # run's model files describe the model it ends with.
  long_config = pretraining_config.long_phase_config(config, bert_config)
  long_models, long_eval = {}, None
  if long_config is not None:
    long_models = {data.long_seq_length: heads.BertForPreTraining(long_config,
                                                                  next_sentence=nsp)}
    long_eval = held_out(data.long_seq_length, data.long_max_predictions_per_seq)
  rows = phases[0].num_rows()
  packed = (f" in {rows} packed rows ({phases[0].num_examples() / rows:.2f} a row)"
            if data.packing else "")
  objective = ("a left-to-right LM on contiguous spans" if left_to_right else
               "MLM + NSP on segment pairs" if nsp else "MLM on contiguous spans (No NSP)")
  if bert_config.is_modernbert:
    objective = f"ModernBERT, {objective}"
  print(f"pretraining ({objective}) on {prepared.directory}: {phases[0].num_examples()} "
        f"training examples{packed} ({rows // tr.batch_size} steps per epoch), {num_eval} "
        f"held-out examples, vocabulary {tok.vocab_size}, frequency baseline token "
        f"{tok.id_to_token(baseline_token)!r}")
  stream = _Phases(phases, tr.long_seq_from_step if data.long_seq_length else 0,
                   bool(data.packing))
  return task_lib.Task(
      model=heads.BertForPreTraining(bert_config, next_sentence=nsp),
      terms=make_terms(baseline_token, nsp, left_to_right, second_masking(data)),
      batches=task_lib.Batches(
          train=stream.iterate, skip=stream.skip,
          eval=(held_out(data.max_seq_length, data.max_predictions_per_seq) if num_eval
                else None),
          long_eval=long_eval if num_eval else None, long_eval_after_step=tr.long_seq_from_step),
      schedule=task_lib.Schedule.of(tr),
      score=score,  # main_metric: on the held-out documents
      main_metric="next_token_accuracy" if left_to_right else "mlm_accuracy",
      files={model_files.BERT_CONFIG_FILE: model_files.bert_config_json(long_config
                                                                         or bert_config),
             **model_files.tokenizer_file_contents(prepared.directory)},  # the vocabulary
      models_by_length=long_models)


def run(config: run_config.PretrainingRun, workdir: str) -> dict[str, float]:
  """Pretrains as the config says; returns the last held-out evaluation."""
  context = train.run_context(config)  # the mesh, once: bad batch sizes fail before any data
  return train.train_and_evaluate(config, workdir, make_task(config, workdir, context), context)
