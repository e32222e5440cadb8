"""A pretraining config's checks and the BertConfig of its model.

`config.pretraining` chooses the paper's MLM + NSP, "No NSP" (`nsp=false`) or "LTR & No NSP"
(`objective=ltr`; `run_config.Objective.uses_nsp` and `.left_to_right` say which);
`bertjax.tasks.pretraining`'s docstring says what each trains on.
"""
from __future__ import annotations

import dataclasses

from bertjax import run_config
from bertjax.errors import UserError
from bertjax.models import config as bert_configs
from bertjax.modeldir import model_options

OBJECTIVES = ("mlm", "ltr")  # config.pretraining.objective: masked LM, left-to-right LM
# config.model fields only architecture=modernbert reads (bertjax.models.config.BertConfig).
MODERNBERT_FIELDS = ("local_attention", "global_attention_every", "rope_theta_global",
                     "rope_theta_local")


def check_config(config: run_config.PretrainingRun) -> None:
  """Raises UserError naming the first field of the pretraining config that cannot work."""
  data, tr = config.data, config.train
  chosen = [name for name in ("input_files", "tfds_name", "prepared") if getattr(data, name)]
  if len(chosen) > 1:
    raise UserError(f"data.{' and data.'.join(chosen)} are all set; give one source of text.")
  if not 0 < data.masked_lm_prob < 1:
    raise UserError(f"data.masked_lm_prob={data.masked_lm_prob}; use a value in (0, 1), e.g. "
                    "0.15.")
  if data.eval_masked_lm_prob and (not 0 < data.eval_masked_lm_prob < 1 or
                                   data.eval_masked_lm_prob == data.masked_lm_prob):
    raise UserError(f"data.eval_masked_lm_prob={data.eval_masked_lm_prob}: a second masking rate "
                    f"for the held-out MLM must lie in (0, 1) and differ from data.masked_lm_prob="
                    f"{data.masked_lm_prob} (ModernBERT: 0.15 beside 0.3), or be 0 (none).")
  if data.eval_masked_lm_prob and config.pretraining.left_to_right:
    raise UserError(f"data.eval_masked_lm_prob={data.eval_masked_lm_prob} masks the held-out "
                    "text at a second rate, but pretraining.objective=ltr masks nothing; set it "
                    "to 0.")
  if not 0 <= data.eval_fraction < 1:
    raise UserError(f"data.eval_fraction={data.eval_fraction}; use a value in [0, 1), e.g. 0.05.")
  for name in ("max_seq_length", "max_predictions_per_seq", "dupe_factor", "vocab_size",
               "max_sequences_per_row"):
    if getattr(data, name) < 1:
      raise UserError(f"data.{name}={getattr(data, name)}; use 1 or more.")
  for length, name in ((data.max_seq_length, "max_predictions_per_seq"),
                       (data.long_seq_length, "long_max_predictions_per_seq")):
    if length and getattr(data, name) > length:
      raise UserError(f"data.{name}={getattr(data, name)} is more than the {length} tokens of a "
                      f"sequence; use at most {length} (the paper: 20 at 128, 80 at 512).")
  longest = max(data.max_seq_length, data.long_seq_length)
  if longest > config.model.max_position_embeddings:
    raise UserError(f"sequences of {longest} tokens need model.max_position_embeddings >= "
                    f"{longest} (it is {config.model.max_position_embeddings}).")
  if data.long_seq_length and data.long_seq_length <= data.max_seq_length:
    raise UserError(f"data.long_seq_length={data.long_seq_length} is not longer than "
                    f"data.max_seq_length={data.max_seq_length}: the long phase must be longer "
                    "(the paper: 512 after 128); raise it, or set data.long_seq_length=0 for "
                    "one phase.")
  if data.long_seq_length and not 1 <= tr.long_seq_from_step < tr.num_train_steps:
    raise UserError(f"data.long_seq_length={data.long_seq_length} needs "
                    f"train.long_seq_from_step within the run, from 1 to train.num_train_steps - 1 "
                    f"({tr.num_train_steps - 1}; the paper: 90% of the steps); it is "
                    f"{tr.long_seq_from_step}. Set it, or data.long_seq_length=0 for one phase.")
  _check_long_phase_and_restart(data, tr)
  for name in ("num_train_steps", "batch_size", "eval_batch_size", "log_every_steps",
               "eval_every_steps", "checkpoint_every_steps", "keep_checkpoints"):
    if getattr(tr, name) < 1:
      raise UserError(f"train.{name}={getattr(tr, name)}; use 1 or more.")
  if not 0 <= tr.warmup_steps <= tr.num_train_steps:
    raise UserError(f"train.warmup_steps={tr.warmup_steps}; use 0 to train.num_train_steps "
                    f"({tr.num_train_steps}).")
  if tr.learning_rate <= 0:
    raise UserError(f"train.learning_rate={tr.learning_rate}; use a positive rate.")
  if config.pretraining.objective not in OBJECTIVES:
    raise UserError(f"pretraining.objective={config.pretraining.objective!r}; use mlm (the "
                    "masked LM) or ltr (a left-to-right LM, the paper's LTR & No NSP).")
  if data.packing and not config.pretraining.uses_nsp:
    which = ("pretraining.objective=ltr" if config.pretraining.left_to_right
             else "pretraining.nsp=false")
    raise UserError(f"data.packing=true packs NSP pairs, but {which} trains on contiguous "
                    "spans, which fill their rows already (each is as long as the sequence "
                    "allows) and are not packed; set data.packing=false.")
  _check_modernbert(config)
  model_config(config, data.vocab_size)  # the model fields, before any text is prepared


def _check_long_phase_and_restart(data: run_config.PretrainingData,
                                  tr: run_config.PretrainingTrain) -> None:
  """The long phase's own rows, rate and weight decay need a long phase; a restart's decay
  needs a restart (the schedule checks where the plateaus fall: `schedules.wsd_schedule`)."""
  own = [f"train.{name}={getattr(tr, name)}" for name, unset in (
      ("long_batch_size", 0), ("long_learning_rate", 0.0), ("long_weight_decay", -1.0))
         if getattr(tr, name) != unset]
  if own and not data.long_seq_length:
    raise UserError(f"{' and '.join(own)} set the long phase, but data.long_seq_length=0 (one "
                    "phase); set data.long_seq_length and train.long_seq_from_step, or unset "
                    "them.")
  if tr.long_batch_size < 0:
    raise UserError(f"train.long_batch_size={tr.long_batch_size}; use 1 or more rows (0: "
                    "train.batch_size).")
  if tr.long_weight_decay != -1 and not tr.long_learning_rate:
    raise UserError(f"train.long_weight_decay={tr.long_weight_decay} goes with the long "
                    "phase's own rate; set train.long_learning_rate too (or unset it: -1).")
  if tr.restart_weight_decay != -1 and not tr.restart_from_step:
    raise UserError(f"train.restart_weight_decay={tr.restart_weight_decay} goes with a restart; "
                    "set train.restart_from_step and restart_learning_rate too (or unset it: "
                    "-1).")


def _check_modernbert(config: run_config.PretrainingRun) -> None:
  """ModernBERT pretrains the masked LM alone, and only it has a context extension."""
  m, data = config.model, config.data
  long_theta = m.long_rope_theta_global
  if m.architecture != "modernbert":
    if long_theta:
      raise UserError(f"model.long_rope_theta_global={long_theta} is ModernBERT's context "
                      "extension; set it to 0 for architecture=bert (no rotary embeddings).")
    return
  if config.pretraining.uses_nsp or config.pretraining.left_to_right:
    raise UserError("model.architecture=modernbert pretrains the masked LM alone on contiguous "
                    "spans; set --config.pretraining.nsp=false and pretraining.objective=mlm.")
  if long_theta and not data.long_seq_length:
    raise UserError(f"model.long_rope_theta_global={long_theta} sets the global rotary base of "
                    "the long phase, but data.long_seq_length=0 (one phase); set "
                    "data.long_seq_length (and train.long_seq_from_step), or set it to 0.")
  if long_theta and long_theta <= 1:
    raise UserError(f"model.long_rope_theta_global={long_theta}; use a base above 1 (ModernBERT:"
                    " 160000), or 0 to keep model.rope_theta_global in the long phase.")


def long_phase_config(config: run_config.PretrainingRun,
                      bert_config: bert_configs.BertConfig) -> bert_configs.BertConfig | None:
  """The model of the long sequence-length phase where it differs from the first phase's
  (ModernBERT's context extension: model.long_rope_theta_global), else None."""
  long_theta = config.model.long_rope_theta_global
  if not (long_theta and config.data.long_seq_length):
    return None
  return dataclasses.replace(bert_config, rope_theta_global=float(long_theta))


def model_config(config: run_config.PretrainingRun, vocab_size: int) -> bert_configs.BertConfig:
  """The frozen BertConfig of `config.model` for a vocabulary of `vocab_size`."""
  m = config.model
  architecture = m.architecture
  modernbert = {name: getattr(m, name) for name in MODERNBERT_FIELDS
                if architecture == "modernbert"}
  try:
    bert_config = bert_configs.bert_config(
        m.size, architecture=architecture, vocab_size=vocab_size, hidden_act=m.hidden_act,
        max_position_embeddings=m.max_position_embeddings, causal=config.pretraining.left_to_right,
        **modernbert, **model_options.pretraining_overrides(m))
  except (KeyError, ValueError) as e:
    raise UserError(f"bad model config: {e}".rstrip(".") + ". Check the config.model fields.") \
        from e
  model_options.check_attention(
      bert_config, [n for n in (config.data.max_seq_length, config.data.long_seq_length) if n])
  return bert_config
