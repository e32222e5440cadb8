"""A run's config as frozen typed dataclasses: every field of every kind of run, each default
defined once, here; and `typed`, the one place where a ConfigDict becomes one.

A config file (bertjax/configs/) starts from `defaults(Schema)`, every field of its kind of run
at its default, and sets its recipe's values; ml_collections then refuses a --config.KEY that
names no field, and a value of the wrong type. `typed(config, Schema)` is the boundary:
`bertjax.tasks.run` calls it once, with the schema of the task that `config.task` names. It
refuses keys that are not fields (a config file's typo), takes the default for fields that an
earlier run's config.json lacks, and derives what follows from the final values (warmup from
train.warmup_proportion, where train.warmup_steps is -1 and the steps are known). Library code
reads the fields as attributes, never with a default of its own.

The kinds: `PretrainingRun` (configs/tiny.py and the configs built on it: its defaults are the
CPU demo's), `FinetuningRun` with one data section per task (`GlueRun`, `SquadRun`, `NerRun`,
`SwagRun`: configs/finetuning.py's defaults are the paper's GLUE recipe) and `FeaturesRun`.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping, TypeVar

import ml_collections

from bertjax.errors import UserError
from bertjax.models.config import BertConfig

Schema = TypeVar("Schema")


def _bert_default(name: str) -> Any:
  """BertConfig's own default of field `name` (defined there once)."""
  return BertConfig.__dataclass_fields__[name].default


# ---------------------------------------------------------------------------------------------
# Sections every training run has.


@dataclasses.dataclass(frozen=True)
class Mesh:
  """The device mesh: data, fsdp and tensor ways (`bertjax.training.parallel`)."""
  data: int = -1  # data-parallel ways (-1 = all devices not used by fsdp/tensor)
  fsdp: int = 1  # parameter-sharded data parallelism
  tensor: int = 1  # tensor (model) parallelism


@dataclasses.dataclass(frozen=True)
class Train:
  """The optimizer, the schedule and the loop's intervals: the fields both kinds of training run
  share (the defaults are the CPU pretraining demo's; `FinetuningTrain` has the paper's GLUE
  recipe)."""
  batch_size: int = 32  # global batch (all devices, all hosts); rows with data.packing
  eval_batch_size: int = 128  # global batch for evaluation and prediction
  num_train_steps: int = 2000  # optimizer updates (fine-tuning: -1 = from the epochs)
  warmup_steps: int = -1  # linear warmup (-1 = warmup_proportion of the steps)
  warmup_proportion: float = 0.1  # share of the steps warmed up when warmup_steps is -1
  stop_after_steps: int = -1  # stop (with a checkpoint) here; rerun to go on (-1: the end)
  learning_rate: float = 2e-3  # peak; a tiny model takes a far larger rate than base
  lr_schedule: str = "linear"  # linear: warmup then the decay below (BERT's); wsd: warmup, the
  # peak held, then a decay to 0 over the last decay_steps (ModernBERT's)
  lr_decay_power: float = 1.0  # decay after warmup as (1 - progress) ** power: 1.0 is the
  # paper's linear decay, 0.5 NVIDIA's with LAMB (docs/accelerators.md)
  lr_decay_from_step_0: bool = False  # true: progress counted from step 0, as the original TF
  # code and NVIDIA's scheduler (the rate steps down as warmup ends)
  decay_steps: int = 0  # wsd: steps of the final decay (0 = none: the peak to the end)
  decay_shape: str = "1-sqrt"  # wsd: 1-sqrt (ModernBERT's: 1 - sqrt(progress)) or linear
  decay_floor: float = 0.0  # wsd: the decay ends at this fraction of the rate (ModernBERT: 0.001)
  optimizer: str = "adamw"  # adamw (the paper), lamb (large batches) or stable_adamw
  # (ModernBERT's: AdamW with each tensor's update clipped, Wortsman et al. 2023)
  weight_decay: float = 0.01  # AdamW decay, off LayerNorm and biases
  decouple_lr: bool = False  # true: the decay is not multiplied by the rate, only by its
  # schedule's fraction of the peak (optimi's decouple_lr, ModernBERT's): weight_decay 1e-5 is
  # 1e-5 a step at the peak, whatever learning_rate is
  frozen_params: str = ""  # top-level parameter groups never changed (no update, no weight
  # decay), comma-separated: "bert" = the encoder (configs/ner.py:feature_based)
  b1: float = 0.9  # AdamW: decay of the first moment (the gradients' moving average)
  b2: float = 0.999  # AdamW: decay of the second moment (the squared gradients')
  eps: float = 1e-6  # AdamW: added to the second moment's root (BERT's; optax's is 1e-8)
  clip_norm: float = 1.0  # clip gradients by global norm (0 = no clipping)
  grad_accum_steps: int = 1  # micro-batches per update (batch_size is split into them)
  prng_impl: str = "threefry"  # random keys (init, dropout): threefry (jax's default), rbg or
  # unsafe_rbg (XLA's RngBitGenerator: other numbers); a resumed run keeps its own
  log_every_steps: int = 100  # metrics.jsonl, TensorBoard and the progress bar
  eval_every_steps: int = 500  # held-out evaluation (and always at the end; fine-tuning: -1 =
  # every epoch)
  eval_steps: int = -1  # eval batches per evaluation (-1 = the whole held-out set)
  checkpoint_every_steps: int = 500  # and always at the end / on SIGTERM (fine-tuning: -1 =
  # every epoch)
  keep_checkpoints: int = 2  # most recent checkpoints kept

  @property
  def frozen(self) -> tuple[str, ...]:
    """frozen_params as names ("bert, classifier" -> ("bert", "classifier"))."""
    return tuple(name.strip() for name in self.frozen_params.split(",") if name.strip())


# ---------------------------------------------------------------------------------------------
# Pretraining (configs/tiny.py, base.py, large.py, modernbert.py).


@dataclasses.dataclass(frozen=True)
class Objective:
  """config.pretraining: the paper's objective or an ablation (section 5.1, Table 5). Both
  ablations train on contiguous spans [CLS] A [SEP] B [SEP], cut into two segments at a sentence
  boundary so that both segment embeddings train, and are not packed."""
  objective: str = "mlm"  # mlm: the masked LM (BERT); ltr: a left-to-right LM (causal
  # attention, each token predicted from those before it, no [MASK], never NSP: the paper's
  # "LTR & No NSP"; fine-tuning from it keeps the causal mask)
  nsp: bool = True  # next-sentence prediction beside the masked LM, on NSP pairs; false: "No
  # NSP", the masked LM alone (objective=mlm only: ltr never has NSP)

  @property
  def uses_nsp(self) -> bool:
    """Whether the run trains NSP on NSP pairs (the paper's BERT), rather than an ablation on
    contiguous spans."""
    return self.objective == "mlm" and self.nsp

  @property
  def left_to_right(self) -> bool:
    """Whether the run trains the left-to-right LM (objective=ltr)."""
    return self.objective == "ltr"


@dataclasses.dataclass(frozen=True)
class PretrainingModel:
  """The model a pretraining run builds (`bertjax.models.config.bert_config`) and how it runs."""
  architecture: str = "bert"  # bert, or modernbert (configs/modernbert.py)
  size: str = "tiny"  # bertjax.models.config.SIZES (tiny mini small medium base large), or
  # MODERNBERT_SIZES (tiny base large) for modernbert
  hidden_act: str = "gelu"  # "gelu" (exact, erf) or "gelu_tanh" (tanh approximation)
  dtype: str = "auto"  # compute dtype: auto (bfloat16 on GPU/TPU, float32 on CPU), float32 or
  # bfloat16; params, LayerNorm, softmax and loss stay float32
  attention: str = "auto"  # auto, reference (the paper's, with attention dropout), xla, cudnn
  # (GPU) or splash (TPU); fused kernels need attention_dropout_rate=0; auto = the fastest the
  # backend has, reference when attention_dropout_rate > 0
  remat: str = "none"  # recompute activations in the backward pass: none, full, dots
  fused_qkv: bool = False  # query, key, value as one matmul (the same three parameters)
  mlm_logits_dtype: str = "float32"  # the MLM head's vocabulary logits: float32, bfloat16 or
  # auto (= the compute dtype); its softmax and loss stay float32
  pad_vocab_to_multiple: int = 128  # embedding/MLM rows rounded up (never predicted)
  # Dropout 0.1 in the paper (configs/base.py); 0 here: the demo sees each example about once,
  # so dropout only slows learning, and drawing its random bits costs a quarter of a CPU step.
  dropout_rate: float = 0.0  # embeddings and residual branches (ModernBERT: attention output)
  attention_dropout_rate: float = 0.0  # attention probabilities
  max_position_embeddings: int = 512  # learned positions (BERT); >= data.max_seq_length
  # ModernBERT only (architecture=modernbert):
  local_attention: int = _bert_default("local_attention")  # a local layer's window, in tokens
  global_attention_every: int = _bert_default("global_attention_every")  # layers 0, k, 2k, ...
  # attend globally
  rope_theta_global: float = _bert_default("rope_theta_global")  # the global layers' rotary base
  rope_theta_local: float = _bert_default("rope_theta_local")  # the local layers' rotary base
  long_rope_theta_global: float = 0.0  # the long phase's global base (context extension); 0 =
  # the same
  pooling: str = "cls"  # what sequence-level fine-tuning heads read: cls or mean (ModernBERT;
  # BERT always pools [CLS])


@dataclasses.dataclass(frozen=True)
class PretrainingData:
  """The text, its preparation (`bertjax.data.prepare`) and the batches made of it."""
  input_files: str = ""  # comma-separated globs of text files ("" = the bundled corpus);
  # format: one sentence per line, blank line between documents (as google-research/bert)
  tfds_name: str = ""  # or a TFDS dataset name (e.g. "wikipedia/20230601.en") instead
  tfds_split: str = "train"  # its split
  tfds_feature: str = "text"  # its text feature; each example is one document
  tfds_data_dir: str = ""  # where it was built ("" = TFDS's default); never downloads
  prepared: str = ""  # a directory from bertjax.data.prepare, instead of the text above ("" =
  # the text above is prepared into WORKDIR/data on first use and reused after)
  prepare_workers: int = 0  # processes that prepare WORKDIR/data (0 = every core)
  loader_threads: int = 2  # threads that read and mask batches ahead of the step
  vocab_model: str = ""  # sentencepiece .model, WordPiece vocab.txt or a byte-level BPE
  # tokenizer.json ("" = the init_checkpoint's, else one trained on the training documents)
  vocab_size: int = 8000  # size of the sentencepiece vocabulary trained when none is given
  max_seq_length: int = 128  # tokens per example, [CLS] A [SEP] B [SEP] + padding
  max_predictions_per_seq: int = 20  # masked positions per example at most
  long_seq_length: int = 0  # a second phase at this length (paper: 512); 0 = none
  long_max_predictions_per_seq: int = 80  # masked positions per long example at most
  masked_lm_prob: float = 0.15  # fraction of tokens masked (80% [MASK] 10% random 10% kept)
  short_seq_prob: float = 0.1  # chance an example targets a shorter length
  dupe_factor: int = 5  # times the corpus is turned into NSP pairs (different pairings)
  whole_word_masking: bool = False  # mask all pieces of a word together
  dynamic_masking: bool = True  # fresh masks each epoch (False: one fixed mask per example)
  packing: bool = False  # several examples a training row, attention kept within each (Krell
  # et al. 2021), so little of a row is padding; train.batch_size then counts rows, each of up
  # to max_sequences_per_row examples. Evaluation is not packed.
  max_sequences_per_row: int = 3  # examples in a packed row at most (as the data's plans)
  eval_fraction: float = 0.05  # share of documents held out for evaluation
  eval_masked_lm_prob: float = 0.0  # held-out MLM also scored at this masking (metrics
  # mlm_*_at_15pct for 0.15; ModernBERT's yamls evaluate at 15% while training at 30%); 0 = only
  # at masked_lm_prob


@dataclasses.dataclass(frozen=True)
class PretrainingTrain(Train):
  """Train, with a restart at a lower rate (ModernBERT-large's) and the long sequence-length
  phase: the step it starts at, and its own rows, rate and weight decay (ModernBERT's context
  extension)."""
  long_seq_from_step: int = 0  # first step at data.long_seq_length (if set)
  long_batch_size: int = 0  # rows of a long-phase batch (0 = batch_size)
  long_learning_rate: float = 0.0  # wsd: the long phase's plateau (0 = the rate runs on)
  long_weight_decay: float = -1.0  # its weight decay (-1 = the one before it); with
  # long_learning_rate
  restart_from_step: int = 0  # wsd: from here the rate holds restart_learning_rate (0 = never)
  restart_learning_rate: float = 0.0  # the restart's plateau
  restart_weight_decay: float = -1.0  # its weight decay (-1 = weight_decay)


@dataclasses.dataclass(frozen=True)
class PretrainingRun:
  """A pretraining run (`bertjax.tasks.pretraining`)."""
  task: str = "pretraining"  # a name in bertjax.tasks.REGISTRY
  seed: int = 0  # parameter init, dropout, data order and masking
  init_checkpoint: str = ""  # bertjax checkpoint to take parameters from ("" = from scratch)
  pretraining: Objective = dataclasses.field(default_factory=Objective)
  model: PretrainingModel = dataclasses.field(default_factory=PretrainingModel)
  data: PretrainingData = dataclasses.field(default_factory=PretrainingData)
  train: PretrainingTrain = dataclasses.field(default_factory=PretrainingTrain)
  mesh: Mesh = dataclasses.field(default_factory=Mesh)


# ---------------------------------------------------------------------------------------------
# Fine-tuning (configs/finetuning.py and the task configs over it).


@dataclasses.dataclass(frozen=True)
class FinetuningModel:
  """How a fine-tuning run runs the pretrained model (its bert_config.json says what it is)."""
  architecture: str = ""  # the pretrained model's (bert or modernbert); "" = whichever it is;
  # set, it must be the model's
  dtype: str = "auto"  # compute dtype: auto (bfloat16 on GPU/TPU, float32 on CPU), float32 or
  # bfloat16; params, LayerNorm, softmax and loss stay float32
  attention: str = "auto"  # as PretrainingModel.attention: reference while attention dropout > 0
  remat: str = "none"  # recompute activations in the backward pass: none, full, dots
  dropout_rate: float = 0.1  # embeddings, residual branches and the task's head
  attention_dropout_rate: float = 0.1  # attention probabilities
  pooling: str = ""  # ModernBERT: what sequence-level heads read, cls or mean ("" = the
  # pretrained model's); BERT always pools [CLS]
  bilstm_on_top: bool = False  # the paper's "+ BiLSTM" (Table 5): a fresh one-layer BiLSTM
  # (hidden_size / 2 units a direction) between the encoder and any task's head; pooled heads
  # read its two final states instead of the pooler; no data.packing with it
  feature_layers: str = ""  # NER: "" = fine-tune the whole model; else the feature-based
  # approach (configs/ner.py:feature_based): the layers the tagger reads, a row of Table 7
  # (bertjax.models.feature_based.LAYER_COMBINATIONS)
  feature_bilstm_units: int = 768  # feature-based: units of each direction of the tagger's
  # two BiLSTM layers (the paper: 768)


@dataclasses.dataclass(frozen=True)
class FinetuningData:
  """What every fine-tuning task's data has; each task's section adds its files."""
  max_seq_length: int = 128  # tokens per sequence with [CLS]/[SEP]; longer input is cut
  length_buckets: str = "auto"  # each batch cut to the shortest of these lengths that holds its
  # longest example or row (GLUE, NER, SWAG; SQuAD always pads): "auto" = every multiple of 32;
  # or e.g. "32,64,128"; "" = every batch padded to max_seq_length
  packing: str = "auto"  # examples a row (GLUE; exact: each pooled from its own [CLS], attending
  # only to itself, the batch still train.batch_size examples): "auto" = as many as fit in
  # max_seq_length on average, where the task can pack (else one a row); "0" = one a row


@dataclasses.dataclass(frozen=True)
class FinetuningTrain(Train):
  """Train with the paper's GLUE recipe (section 4.1), measured in epochs."""
  eval_batch_size: int = 64
  num_train_epochs: float = 3.0  # passes over the training data
  num_train_steps: int = -1  # -1 = from the epochs and the training data's size, as
  # run_classifier.py counts them
  learning_rate: float = 2e-5
  log_every_steps: int = 50
  eval_every_steps: int = -1
  checkpoint_every_steps: int = -1
  keep_checkpoints: int = 1


@dataclasses.dataclass(frozen=True)
class FinetuningRun:
  """A fine-tuning run (`bertjax.tasks.finetuning`); a task's schema replaces `data`."""
  task: str = ""  # a name in bertjax.tasks.REGISTRY (each task's config sets it)
  seed: int = 0  # head init, dropout and data order
  init_checkpoint: str = ""  # the pretrained model (required), with bert_config.json + vocab
  model: FinetuningModel = dataclasses.field(default_factory=FinetuningModel)
  data: FinetuningData = dataclasses.field(default_factory=FinetuningData)
  train: FinetuningTrain = dataclasses.field(default_factory=FinetuningTrain)
  mesh: Mesh = dataclasses.field(default_factory=Mesh)


@dataclasses.dataclass(frozen=True)
class GlueData(FinetuningData):
  """GLUE's files (download_glue_data.py's layout) or TFDS's glue/<task>."""
  glue_dir: str = ""  # GLUE's download layout (MRPC/train.tsv, ...); "" = TFDS glue/<task>
  tfds_data_dir: str = ""  # where TFDS's glue was prepared ("" = TFDS's default)
  eval_split: str = ""  # scored at each evaluation ("" = dev; mnli: dev_matched)
  predict_splits: str = ""  # comma-separated splits written as GLUE leaderboard files after
  # training, e.g. "test" (mnli: "test_matched,test_mismatched,ax")


@dataclasses.dataclass(frozen=True)
class SquadData(FinetuningData):
  """SQuAD's JSON files and run_squad.py's feature and answer settings."""
  train_file: str = ""  # SQuAD JSON to train on, e.g. train-v1.1.json (required)
  predict_file: str = ""  # SQuAD JSON scored at each evaluation, e.g. dev-v1.1.json
  version_2_with_negative: bool = False  # SQuAD 2.0: questions may have no answer
  max_seq_length: int = 384  # [CLS] question [SEP] context window [SEP]
  doc_stride: int = 128  # tokens between the starts of a context's windows
  max_query_length: int = 64  # questions are cut to this many tokens
  n_best_size: int = 20  # best starts/ends per window; answers in nbest_predictions.json
  max_answer_length: int = 30  # longest answer, in tokens
  null_score_diff_threshold: float = 0.0  # v2.0: answer "" when null - best span > this


@dataclasses.dataclass(frozen=True)
class NerData(FinetuningData):
  """CoNLL-2003 files ("word POS chunk NER" lines)."""
  data_dir: str = ""  # directory of the files below (absolute file paths need none)
  train_file: str = "train.txt"  # CoNLL-format training file; its tags are the classes
  eval_file: str = ""  # tagged dev file, scored at each evaluation ("" = valid.txt, or
  # testa.txt where only it exists)
  predict_file: str = ""  # predicted after training into test_predictions.txt, e.g. test.txt;
  # scored too (test_results.json) where it has tags
  label_column: int = -1  # the tag's column (-1 = the last: CoNLL-2003's NER tags)


@dataclasses.dataclass(frozen=True)
class SwagData(FinetuningData):
  """SWAG's CSVs (the data/ directory of rowanz/swagaf)."""
  train_file: str = ""  # swagaf's data/train.csv (required)
  eval_file: str = ""  # swagaf's data/val.csv (required): scored at each evaluation
  predict_file: str = ""  # optional, e.g. data/test.csv: written to test_predictions.csv


@dataclasses.dataclass(frozen=True)
class GlueRun(FinetuningRun):
  """A GLUE task's fine-tuning (configs/glue.py)."""
  task: str = "mrpc"  # the GLUE task: cola sst2 mrpc qqp stsb mnli qnli rte wnli (ax: predict)
  data: GlueData = dataclasses.field(default_factory=GlueData)


@dataclasses.dataclass(frozen=True)
class SquadRun(FinetuningRun):
  """SQuAD fine-tuning (configs/squad.py)."""
  task: str = "squad"
  data: SquadData = dataclasses.field(default_factory=SquadData)


@dataclasses.dataclass(frozen=True)
class NerRun(FinetuningRun):
  """CoNLL-2003 NER fine-tuning (configs/ner.py)."""
  task: str = "ner"
  data: NerData = dataclasses.field(default_factory=NerData)


@dataclasses.dataclass(frozen=True)
class SwagRun(FinetuningRun):
  """SWAG fine-tuning (configs/swag.py)."""
  task: str = "swag"
  data: SwagData = dataclasses.field(default_factory=SwagData)


# What the trainer (`bertjax.training`) runs: a pretraining or a fine-tuning config.
TrainingRun = PretrainingRun | FinetuningRun


# ---------------------------------------------------------------------------------------------
# Feature extraction (configs/features.py).


@dataclasses.dataclass(frozen=True)
class FeaturesRun:
  """Feature extraction (`bertjax.tasks.features`: extract_features.py's output)."""
  task: str = "features"  # a name in bertjax.tasks.REGISTRY
  init_checkpoint: str = ""  # the model (required), with bert_config.json and its tokenizer
  input_file: str = ""  # text, one input a line; "text_a ||| text_b" for pairs (required)
  layers: str = "-1,-2,-3,-4"  # layer indices: -1 = the last layer, 0 = the first
  max_seq_length: int = 128  # tokens per input with [CLS]/[SEP]; longer inputs are cut
  batch_size: int = 8  # inputs per forward pass


# ---------------------------------------------------------------------------------------------
# The boundary.


def defaults(schema: type) -> ml_collections.ConfigDict:
  """Every field of `schema` at its default, as the ConfigDict a config file starts from."""
  return ml_collections.ConfigDict(dataclasses.asdict(schema()))


def _build(schema: type, values: Mapping[str, Any], prefix: str) -> Any:
  """`schema` from `values` ({field: value}, nested dicts for sections); a field absent from
  `values` takes its default. Raises UserError naming a key that is no field."""
  fields = {f.name: f for f in dataclasses.fields(schema)}
  unknown = sorted(set(values) - set(fields))
  if unknown:
    names = ", ".join(prefix + name for name in unknown)
    raise UserError(f"unknown config key(s) {names} for a {schema.__name__} (its fields are "
                    f"{', '.join(prefix + name for name in fields)}); check the spelling in the "
                    "config file (bertjax/run_config.py lists every field, with comments).")
  hints = typing.get_type_hints(schema)
  kwargs = {}
  for name, value in values.items():
    kind = hints[name]
    if dataclasses.is_dataclass(kind):
      if not isinstance(value, Mapping):
        raise UserError(f"config key {prefix}{name} is a section ({kind.__name__}), not "
                        f"{value!r}.")
      kwargs[name] = _build(kind, value, f"{prefix}{name}.")
    elif kind is float and isinstance(value, int) and not isinstance(value, bool):
      kwargs[name] = float(value)
    elif kind in (int, float, str, bool) and not isinstance(value, kind):
      raise UserError(f"config key {prefix}{name}={value!r} is not a {kind.__name__}; set "
                      f"--config.{prefix}{name} to one.")
    else:
      kwargs[name] = value
  return schema(**kwargs)


def typed(config: ml_collections.ConfigDict | Mapping[str, Any], schema: type[Schema]) -> Schema:
  """The frozen `schema` (a *Run class) of `config` (a ConfigDict or its dict), with the values
  derived from the final ones filled in (`derived`).

  Raises:
    UserError: a key that is no field of `schema`, or a value of the wrong type.
  """
  values = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
  return derived(_build(schema, values, ""))


def derived(value: Schema) -> Schema:
  """`value` (a run, or a train section alone) with train.warmup_steps -1 made warmup_proportion
  of train.num_train_steps where the steps are known (pretraining; a fine-tuning run knows them
  once it has read its data: `bertjax.tasks.finetuning.schedule`)."""
  if isinstance(value, (PretrainingRun, FinetuningRun)):
    return dataclasses.replace(value, train=derived(value.train))
  if not isinstance(value, Train) or value.warmup_steps >= 0 or value.num_train_steps < 0:
    return value
  return dataclasses.replace(
      value, warmup_steps=int(value.warmup_proportion * value.num_train_steps))
