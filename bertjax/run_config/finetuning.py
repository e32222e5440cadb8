"""Fine-tuning runs' schemas: `FinetuningRun` (configs/finetuning.py's defaults are the
paper's GLUE recipe) and one data section per task (`GlueRun`, `SquadRun`, `NerRun`,
`SwagRun`)."""
from __future__ import annotations

import dataclasses

from bertjax.run_config.common import Divergence, Mesh, Train


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
class FinetuningDivergence(Divergence):
  """Divergence, with the spike tests off (0): a fine-tuning loss falls toward 0, where one hard
  batch is many times the median, so a healthy run would stop. NaN and infinity stop it (or,
  with policy rollback, roll it back) as in pretraining; set the tests to watch for spikes."""
  loss_zscore: float = 0.0
  loss_ratio: float = 0.0
  grad_norm_zscore: float = 0.0
  grad_norm_ratio: float = 0.0


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
  divergence: FinetuningDivergence = dataclasses.field(default_factory=FinetuningDivergence)


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
