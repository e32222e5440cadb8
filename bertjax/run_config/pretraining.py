"""A pretraining run's schema (`PretrainingRun`: configs/tiny.py and the configs built on it,
whose defaults are the CPU demo's): the objective, the model it builds, its text and batches,
and the long phase's train fields."""
from __future__ import annotations

import dataclasses
from typing import Any

from bertjax.models.config import BertConfig
from bertjax.run_config.common import Divergence, Mesh, Train


def _bert_default(name: str) -> Any:
  """BertConfig's own default of field `name` (defined there once)."""
  return BertConfig.__dataclass_fields__[name].default


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
  dropout_per_hash: int = 2  # dropout decisions per threefry hash: 2 or 4 (both words of each
  # hash; half the hashes, other masks at the same rate)
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
  local_kernel: str = _bert_default("local_kernel")  # the local layers' kernel on the xla and
  # cudnn paths: auto (the fused Pallas kernel on a GPU where it fits, else XLA's blocks), xla
  # or pallas (off a GPU in the Pallas interpreter: slow)
  fp8: bool = False  # the encoder layers' projections as FP8 matmuls with delayed scaling
  # (bertjax.models.fp8; embeddings and heads stay in dtype); evaluation and exports in dtype


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
  divergence: Divergence = dataclasses.field(default_factory=Divergence)
