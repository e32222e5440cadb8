"""Pretraining: masked LM + next-sentence prediction on the user's text (the paper, section 3.1).

Text (the bundled corpus, the user's files or a TFDS dataset) is prepared once by
`bertjax.data.prepare` into shards: a vocabulary, tokenized documents split into training and
held-out ones, NSP pairs per sequence length. A run takes `data.prepared` (a directory made by
that command) or prepares its text into WORKDIR/data on first use and reuses it after. The
vocabulary is `data.vocab_model`, else `init_checkpoint`'s (continued pretraining keeps the
vocabulary its embeddings were trained with), else one trained on the text. Batches stream
from the shards (`bertjax.data.pretraining.loader`) into `BertForPreTraining` and the trainer.

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
contiguous single-segment examples `[CLS] span [SEP]`, each span as long as the sequence allows
from one document (prepared with --contiguous=true; `bertjax.data.pretraining.examples.
iter_contiguous_spans`). `objective=ltr` is "LTR & No NSP": a left-to-right LM on the same
spans, a causal encoder (BertConfig.causal, recorded in bert_config.json, so fine-tuning from it
keeps the causal mask), no [MASK] corruption, and each real position's next token scored by the
tied MLM head (`loader.NextTokens`): next_token_loss, next_token_accuracy, and the perplexity in
evaluations. Neither is packed (the spans fill their rows; `check_config`).
"""
from __future__ import annotations

import os
from typing import Any, Iterator

from absl import logging
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax import model_files, tokenization
from bertjax.training import init_params, model_options, train
from bertjax.data import prepare, sources
from bertjax.data.pretraining import loader
from bertjax.data.pretraining import examples as pe
from bertjax.errors import UserError
from bertjax.models import config as bert_configs
from bertjax.models import heads

DATA_DIR = "data"  # WORKDIR/data: the config's text, prepared on first use
OBJECTIVES = ("mlm", "ltr")  # config.pretraining.objective: masked LM, left-to-right LM


def uses_nsp(config: ml_collections.ConfigDict) -> bool:
  """Whether the run trains next-sentence prediction on NSP pairs (the paper's BERT), rather
  than an ablation on contiguous spans (pretraining.nsp=false, or objective=ltr, which has no
  NSP). A config without a `pretraining` section (written before it existed) is the paper's."""
  ablation = config.get("pretraining")
  return ablation is None or (ablation.objective == "mlm" and bool(ablation.nsp))


def is_left_to_right(config: ml_collections.ConfigDict) -> bool:
  """Whether the run trains the left-to-right LM (pretraining.objective=ltr)."""
  ablation = config.get("pretraining")
  return ablation is not None and ablation.objective == "ltr"


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises UserError naming the first field of the pretraining config that cannot work."""
  data, tr = config.data, config.train
  chosen = [name for name in ("input_files", "tfds_name", "prepared") if data[name]]
  if len(chosen) > 1:
    raise UserError(f"data.{' and data.'.join(chosen)} are all set; give one source of text.")
  if not 0 < data.masked_lm_prob < 1:
    raise UserError(f"data.masked_lm_prob={data.masked_lm_prob}; use a value in (0, 1), e.g. "
                    "0.15.")
  if not 0 <= data.eval_fraction < 1:
    raise UserError(f"data.eval_fraction={data.eval_fraction}; use a value in [0, 1), e.g. 0.05.")
  for name in ("max_seq_length", "max_predictions_per_seq", "dupe_factor", "vocab_size",
               "max_sequences_per_row"):
    if data[name] < 1:
      raise UserError(f"data.{name}={data[name]}; use 1 or more.")
  for length, name in ((data.max_seq_length, "max_predictions_per_seq"),
                       (data.long_seq_length, "long_max_predictions_per_seq")):
    if length and data[name] > length:
      raise UserError(f"data.{name}={data[name]} is more than the {length} tokens of a "
                      f"sequence; use at most {length} (the paper: 20 at 128, 80 at 512).")
  longest = max(data.max_seq_length, data.long_seq_length)
  if longest > config.model.max_position_embeddings:
    raise UserError(f"sequences of {longest} tokens need model.max_position_embeddings >= "
                    f"{longest} (it is {config.model.max_position_embeddings}).")
  if data.long_seq_length and tr.long_seq_from_step < 1:
    raise UserError(f"data.long_seq_length={data.long_seq_length} needs "
                    f"train.long_seq_from_step >= 1 (the paper: 90% of the steps); it is "
                    f"{tr.long_seq_from_step}. Set data.long_seq_length=0 for one phase.")
  for name in ("num_train_steps", "batch_size", "eval_batch_size", "log_every_steps",
               "eval_every_steps", "checkpoint_every_steps", "keep_checkpoints"):
    if tr[name] < 1:
      raise UserError(f"train.{name}={tr[name]}; use 1 or more.")
  if not 0 <= tr.warmup_steps <= tr.num_train_steps:
    raise UserError(f"train.warmup_steps={tr.warmup_steps}; use 0 to train.num_train_steps "
                    f"({tr.num_train_steps}).")
  if tr.learning_rate <= 0:
    raise UserError(f"train.learning_rate={tr.learning_rate}; use a positive rate.")
  ablation = config.get("pretraining")
  if ablation is not None and ablation.objective not in OBJECTIVES:
    raise UserError(f"pretraining.objective={ablation.objective!r}; use mlm (the masked LM) or "
                    "ltr (a left-to-right LM, the paper's LTR & No NSP).")
  if data.packing and not uses_nsp(config):
    which = ("pretraining.objective=ltr" if is_left_to_right(config)
             else "pretraining.nsp=false")
    raise UserError(f"data.packing=true packs NSP pairs, but {which} trains on contiguous "
                    "spans, which fill their rows already (each is as long as the sequence "
                    "allows) and are not packed; set data.packing=false.")
  model_config(config, data.vocab_size)  # the model fields, before any text is prepared


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> bert_configs.BertConfig:
  """The frozen BertConfig of `config.model` for a vocabulary of `vocab_size`."""
  m = config.model
  try:
    bert_config = bert_configs.bert_config(
        m.size, vocab_size=vocab_size, hidden_act=m.hidden_act,
        max_position_embeddings=m.max_position_embeddings, causal=is_left_to_right(config),
        **model_options.bert_overrides(m))
  except (KeyError, ValueError) as e:
    raise UserError(f"bad model config: {e}".rstrip(".") + ". Check the config.model fields.") \
        from e
  model_options.check_attention(
      bert_config, [n for n in (config.data.max_seq_length, config.data.long_seq_length) if n])
  return bert_config


# ----------------------------------------------------------------------------------------------
# Prepared data.


def checkpoint_vocabulary(config: ml_collections.ConfigDict) -> str:
  """The vocabulary file (vocab.model or vocab.txt) of init_checkpoint's model directory, the
  one its embeddings were trained with; "" without an init_checkpoint, or without such a file
  when data.vocab_model is given.

  Raises:
    UserError: no such file and no data.vocab_model: embeddings without their vocabulary mean
      nothing.
  """
  if not config.init_checkpoint:
    return ""
  try:
    directory = model_files.find_model_dir(config.init_checkpoint)
  except UserError:  # no bert_config.json: look beside the checkpoint itself
    directory = os.path.abspath(config.init_checkpoint)
  for name in (tokenization.MODEL_FILE, tokenization.VOCAB_FILE):
    if os.path.isfile(os.path.join(directory, name)):
      return os.path.join(directory, name)
  if config.data.vocab_model:
    return ""
  raise UserError(f"init_checkpoint {config.init_checkpoint} has no vocabulary: no "
                  f"{tokenization.MODEL_FILE} or {tokenization.VOCAB_FILE} in {directory}, and its "
                  "embeddings mean nothing without the vocabulary they were trained with; pass "
                  "that vocabulary as --config.data.vocab_model=FILE.")


def vocabulary(config: ml_collections.ConfigDict) -> str:
  """The vocabulary file the text is prepared with: data.vocab_model, else init_checkpoint's,
  else "" (a sentencepiece model is trained on the text)."""
  return config.data.vocab_model or checkpoint_vocabulary(config)


def check_vocabulary(config: ml_collections.ConfigDict) -> None:
  """Before anything is written: UserError if init_checkpoint is missing, has no vocabulary
  (and data.vocab_model is not given), or data.vocab_model has another size than its
  vocabulary; a warning if data.vocab_model is another vocabulary of the same size (each row of
  the embeddings then stands for another piece)."""
  if not config.init_checkpoint:
    return
  init_params.find_step_dir(config.init_checkpoint)  # a missing or empty path, named now
  given, theirs = config.data.vocab_model, checkpoint_vocabulary(config)
  if not given or not theirs:
    return
  mine, its = tokenization.load_tokenizer(given), tokenization.load_tokenizer(theirs)
  if mine.vocab_size != its.vocab_size:
    raise UserError(f"data.vocab_model={given} has {mine.vocab_size} pieces, but the embeddings "
                    f"of init_checkpoint are rows of its vocabulary {theirs}, {its.vocab_size} "
                    f"pieces; drop data.vocab_model to continue with {theirs}, or drop "
                    "init_checkpoint to pretrain from scratch on the other vocabulary.")
  if prepare.vocab_sha256(mine) != prepare.vocab_sha256(its):
    logging.warning(
        "data.vocab_model=%s is another vocabulary than %s, the one init_checkpoint's "
        "embeddings were trained with (both %d pieces): each embedding row now stands for "
        "another piece. Continuing as asked; drop data.vocab_model to keep %s.",
        given, theirs, its.vocab_size, theirs)


def prepare_options(config: ml_collections.ConfigDict) -> prepare.Options:
  """The bertjax.data.prepare flags of the text a config names (default: the bundled corpus)."""
  data = config.data
  lengths = [data.max_seq_length] + ([data.long_seq_length] if data.long_seq_length else [])
  predictions = [data.max_predictions_per_seq] + (
      [data.long_max_predictions_per_seq] if data.long_seq_length else [])
  source = data.input_files or sources.BUNDLED_CORPUS
  if data.tfds_name:
    source = f"tfds:{data.tfds_name}:{data.tfds_split}"
  return prepare.Options(
      input=source, vocab=vocabulary(config), vocab_size=data.vocab_size,
      max_seq_length=tuple(lengths), max_predictions_per_seq=tuple(predictions),
      dupe_factor=data.dupe_factor, short_seq_prob=data.short_seq_prob,
      eval_fraction=data.eval_fraction, static_masks=not data.dynamic_masking,
      masked_lm_prob=data.masked_lm_prob, whole_word_masking=data.whole_word_masking,
      seed=config.seed, max_sequences_per_row=data.max_sequences_per_row,
      tfds_feature=data.tfds_feature, tfds_data_dir=data.tfds_data_dir,
      contiguous=not uses_nsp(config))


def prepared_data(config: ml_collections.ConfigDict, workdir: str) -> loader.PreparedData:
  """`data.prepared`, or the config's text prepared into WORKDIR/data (by host 0; the others
  wait for it, so WORKDIR must be shared) on first use and reused after."""
  if config.data.prepared:
    return loader.PreparedData(config.data.prepared)
  directory = os.path.join(workdir, DATA_DIR)
  if jax.process_index() == 0:
    prepare.prepare(prepare_options(config), directory, workers=config.data.prepare_workers)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("bertjax: pretraining data prepared")
    if not os.path.isfile(os.path.join(directory, prepare.INFO_FILE)):
      raise UserError(f"host {jax.process_index()} does not see {directory}, which host 0 "
                      "prepared: the workdir is not shared. Prepare the data once with "
                      "python -m bertjax.data.prepare into a directory every host reads, and "
                      "pass --config.data.prepared=DIR.")
  return loader.PreparedData(directory)


def data_tokenizer(data: loader.PreparedData, workdir: str) -> tokenization.Tokenizer:
  """The tokenizer of prepared data; UserError naming the fix for its own copy of the vocabulary
  if that file is damaged (empty or corrupt): the workdir's copy, or preparing the text again."""
  try:
    return data.tokenizer()
  except tokenization.UnreadableVocabulary as e:
    copy = os.path.join(workdir, os.path.basename(e.path))
    restore = f"copy {copy} (the run's copy of it) over it, or " if _same_vocabulary(
        copy, data.info["vocab"]["sha256"]) else ""
    again = ("and rerun: the text is prepared again" if data.directory == os.path.join(
        workdir, DATA_DIR) else "and prepare the text again (python -m bertjax.data.prepare)")
    raise UserError(f"{e.path} {e.problem}; it is the vocabulary of the data prepared in "
                    f"{data.directory}: {restore}delete {data.directory} {again}.") from None


def _same_vocabulary(path: str, sha256: str) -> bool:
  """Whether `path` is a readable vocabulary file with this vocab_sha256."""
  if not os.path.isfile(path):
    return False
  try:
    return prepare.vocab_sha256(tokenization.load_tokenizer(path)) == sha256
  except UserError:
    return False


def check_prepared(data: loader.PreparedData, config: ml_collections.ConfigDict) -> None:
  """UserError, before any step, if prepared data cannot serve the run: another vocabulary,
  no pairs at a sequence length a phase needs, stored masks of another kind, or (packing) no
  packing plans or plans of another max_sequences_per_row."""
  given = vocabulary(config)
  if given:
    given_tok = tokenization.load_tokenizer(given)
    if prepare.vocab_sha256(given_tok) != data.info["vocab"]["sha256"]:
      if config.data.vocab_model:
        raise UserError(f"{data.directory} was prepared with another vocabulary than "
                        f"data.vocab_model={given}; drop data.vocab_model (the data's own, "
                        f"{data.info['vocab']['file']}, is used) or prepare the text again with "
                        "it.")
      raise UserError(f"{data.directory} was prepared with another vocabulary than {given}, the "
                      "one init_checkpoint's embeddings were trained with; prepare the text "
                      f"again with it (--vocab={given}), or set data.vocab_model to the data's "
                      "own to use it anyway.")
  for length, field in ((config.data.max_seq_length, "max_seq_length"),
                        (config.data.long_seq_length, "long_seq_length")):
    if length and length not in data.lengths:
      raise UserError(f"{data.directory} holds pairs of {', '.join(map(str, data.lengths))} "
                      f"tokens, not the {length} of data.{field}; prepare it with "
                      f"--max_seq_length={','.join(map(str, sorted({*data.lengths, length})))}, "
                      f"or set data.{field} to a length it holds.")
  if data.flags["whole_word_masking"] != config.data.whole_word_masking and \
      data.flags["static_masks"]:
    raise UserError(f"{data.directory} stores masks made with whole_word_masking="
                    f"{data.flags['whole_word_masking']}; set data.whole_word_masking to match.")
  if config.data.packing:
    _check_packs(data, config)
  if not uses_nsp(config):
    _check_spans(data, config)


def _check_spans(data: loader.PreparedData, config: ml_collections.ConfigDict) -> None:
  """UserError unless every phase's length has contiguous spans (prepare --contiguous=true)."""
  for length in (config.data.max_seq_length, config.data.long_seq_length):
    if length and not data.has_contiguous(length):
      which = ("pretraining.objective=ltr" if is_left_to_right(config)
               else "pretraining.nsp=false")
      raise UserError(f"{which} trains on contiguous spans, which {data.directory} lacks at "
                      f"{length} tokens; prepare the text with --contiguous=true (python -m "
                      "bertjax.data.prepare, into a new directory, with the other flags of its "
                      f"{prepare.INFO_FILE}), or drop data.prepared to prepare it into the "
                      "workdir.")


def _check_packs(data: loader.PreparedData, config: ml_collections.ConfigDict) -> None:
  """UserError unless every phase's pairs have packing plans of data.max_sequences_per_row."""
  again = (f"prepare it again (python -m bertjax.data.prepare into a new directory, "
           f"--max_sequences_per_row={config.data.max_sequences_per_row})"
           if config.data.prepared else f"delete {data.directory} and rerun: the text is "
           "prepared again")
  for length in (config.data.max_seq_length, config.data.long_seq_length):
    if length and not data.has_packs(length):
      raise UserError(f"data.packing=true needs packing plans, which {data.directory} lacks at "
                      f"{length} tokens (it was prepared by an older bertjax); {again}, or set "
                      "data.packing=false.")
  if data.max_sequences_per_row() != config.data.max_sequences_per_row:
    raise UserError(f"{data.directory} plans packs of at most {data.max_sequences_per_row()} "
                    f"pairs, not the {config.data.max_sequences_per_row} of "
                    "data.max_sequences_per_row; set data.max_sequences_per_row="
                    f"{data.max_sequences_per_row()}, or {again}.")


# ----------------------------------------------------------------------------------------------
# Loss and metrics.


def make_terms(baseline_token: int, nsp: bool = True, left_to_right: bool = False):
  """(outputs, batch) -> the terms of pretraining (`train.Terms`): the paper's objective is the
  sum of the MLM mean (cross-entropy over the real masked positions, masked_lm_weights) and the
  NSP mean (over the examples), with their accuracies and the MLM accuracy of always guessing
  `baseline_token` (the frequency baseline). Packed batches give the same terms per example:
  their predictions are [batch, k * P] and their examples [batch, k].

  Without `nsp` (No NSP, and the left-to-right LM) there are no NSP terms. `left_to_right` names
  the LM terms next_token_* (the batch's masked_lm_* are then every position's next token,
  `loader.NextTokens`): next_token_loss is the mean cross-entropy of each real token given
  those before it."""
  lm = "next_token" if left_to_right else "mlm"

  def terms(outputs, batch):
    # [batch, predictions, vocab], [batch, 2] ([batch, k, 2] packed; None without NSP); float32
    mlm_logits, nsp_logits = outputs
    ids = batch["masked_lm_ids"]
    mlm_weight = batch["masked_lm_weights"]  # [batch, predictions]
    lm_terms = {
        f"{lm}_loss": (optax.softmax_cross_entropy_with_integer_labels(mlm_logits, ids),
                       mlm_weight),
        f"{lm}_accuracy": (jnp.argmax(mlm_logits, -1) == ids, mlm_weight),
        f"frequency_baseline_{lm}_accuracy": (ids == baseline_token, mlm_weight)}
    if not nsp:
      return lm_terms
    labels = batch["next_sentence_label"]
    example_weight = batch["example_weight"]  # [batch] ([batch, k] packed; 0: empty slot)
    return {
        "mlm_loss": lm_terms["mlm_loss"],
        "nsp_loss": (optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels),
                     example_weight),
        "mlm_accuracy": lm_terms["mlm_accuracy"],
        "nsp_accuracy": (jnp.argmax(nsp_logits, -1) == labels, example_weight),
        "frequency_baseline_mlm_accuracy": lm_terms["frequency_baseline_mlm_accuracy"]}

  return terms


def score(totals: dict[str, Any], predictions: None) -> dict[str, float]:
  """Evaluation totals -> the means (loss = MLM + NSP, or the one LM loss without NSP), the LM's
  perplexity (mlm_perplexity or next_token_perplexity), and the number of held-out examples
  (with NSP) or of scored tokens, `predictions` (without)."""
  del predictions  # pretraining is scored by its sums alone
  metrics = train.means(totals)
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

  def iterate(self, position: dict | None) -> Iterator[tuple[dict, dict]]:
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
    inner = self.phases[phase].iterate(examples)
    while True:
      if phase == 0 and self._switch_step and served == self._switch_step:
        phase, inner = 1, self.phases[1].iterate(0)
      batch, examples = next(inner)
      served += 1
      yield batch, {"phase": phase, "batches": served, "examples": examples,
                    "packed": self._packed}


def make_task(config: ml_collections.ConfigDict, workdir: str) -> train.Task:
  """Prepares the text if needed (WORKDIR/data) and builds the pretraining Task."""
  check_config(config)
  check_vocabulary(config)
  data, tr = config.data, config.train
  prepared = prepared_data(config, workdir)
  tok = data_tokenizer(prepared, workdir)
  check_prepared(prepared, config)
  special = pe.SpecialTokens.from_tokenizer(tok)
  word_tables = tok.word_boundary_tables() if data.whole_word_masking else None
  nsp, left_to_right = uses_nsp(config), is_left_to_right(config)

  def batches(length: int, max_predictions: int, batch_size: int,
              packing: bool = False) -> loader.PairBatches:
    if left_to_right:
      targets = loader.NextTokens(special, config.seed)
    else:
      targets = loader.Masking(special, data.masked_lm_prob, max_predictions,
                               data.dynamic_masking, config.seed, word_tables)
    return loader.PairBatches(prepared, length, targets,
                              batch_size=batch_size // jax.process_count(),
                              process_index=jax.process_index(),
                              process_count=jax.process_count(), threads=data.loader_threads,
                              packing=packing, contiguous=not nsp)

  phases = [batches(data.max_seq_length, data.max_predictions_per_seq, tr.batch_size,
                    data.packing)]
  if data.long_seq_length:
    phases.append(batches(data.long_seq_length, data.long_max_predictions_per_seq,
                          tr.batch_size, data.packing))
  for phase in phases:  # opens every phase's shards (and plans): a damaged one is named now
    phase.num_examples()
    phase.num_rows()
  eval_batches = batches(data.max_seq_length, data.max_predictions_per_seq, tr.eval_batch_size)
  num_eval = eval_batches.num_examples("heldout")
  baseline_token = int(prepared.info["most_common_token"])
  bert_config = model_config(config, tok.vocab_size)
  rows = phases[0].num_rows()
  packed = (f" in {rows} packed rows ({phases[0].num_examples() / rows:.2f} a row)"
            if data.packing else "")
  objective = ("a left-to-right LM on contiguous spans" if left_to_right else
               "MLM + NSP on segment pairs" if nsp else "MLM on contiguous spans (No NSP)")
  print(f"pretraining ({objective}) on {prepared.directory}: {phases[0].num_examples()} "
        f"training examples{packed} ({rows // tr.batch_size} steps per epoch), {num_eval} "
        f"held-out examples, vocabulary {tok.vocab_size}, frequency baseline token "
        f"{tok.id_to_token(baseline_token)!r}")
  return train.Task(
      model=heads.BertForPreTraining(bert_config, next_sentence=nsp),
      terms=make_terms(baseline_token, nsp, left_to_right),
      batches=train.Batches(
          train=_Phases(phases, tr.long_seq_from_step if data.long_seq_length else 0,
                        bool(data.packing)).iterate,
          eval=eval_batches.eval_batches if num_eval else None),
      score=score,  # main_metric: on the held-out documents
      main_metric="next_token_accuracy" if left_to_right else "mlm_accuracy",
      files={model_files.BERT_CONFIG_FILE: model_files.bert_config_json(bert_config),
             **model_files.tokenizer_file_contents(prepared.directory)})  # the vocabulary


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Pretrains as the config says; returns the last held-out evaluation."""
  train.make_checked_mesh(config)  # fail on batch sizes before writing the vocabulary
  return train.train_and_evaluate(config, workdir, make_task(config, workdir))
