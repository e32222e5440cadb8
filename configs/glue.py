"""GLUE fine-tuning (the paper, section 4.1): one task of the benchmark on a pretrained BERT.

  python -m bertjax.main --config=configs/glue.py --workdir=DIR --config.task=mrpc \
      --config.init_checkpoint=CKPT --config.data.glue_dir=GLUE_DIR

config.task: cola sst2 mrpc qqp stsb mnli qnli rte wnli. CKPT: a pretraining workdir or a
directory from `python -m bertjax.convert --from=hf|tf` (e.g. Google's BERT-base). GLUE_DIR: the
layout of GLUE's download_glue_data.py (MRPC/train.tsv, ...); leave it empty to read TFDS's
glue/<task> prepared under data.tfds_data_dir. The defaults are the paper's: batch 32, 3 epochs,
learning rate 2e-5 (the paper picks the best of 5e-5, 4e-5, 3e-5, 2e-5 on dev), warmup 10%,
dropout 0.1, 128 tokens. Writes eval_results.json (dev metrics), eval_predictions.tsv and, for
data.predict_splits, GLUE leaderboard files (e.g. MRPC.tsv).
"""
import ml_collections


def get_config(arg=None):
  del arg
  config = ml_collections.ConfigDict()
  config.task = "mrpc"  # the GLUE task (a name in bertjax.tasks.REGISTRY)
  config.seed = 0  # classifier init, dropout and data order
  config.init_checkpoint = ""  # the pretrained model (required), with bert_config.json + vocab

  config.model = ml_collections.ConfigDict()
  config.model.dtype = "float32"  # compute dtype: float32 or bfloat16 (params stay float32)
  config.model.dropout_rate = 0.1  # embeddings, residual branches and the classifier
  config.model.attention_dropout_rate = 0.1  # attention probabilities

  config.data = ml_collections.ConfigDict()
  config.data.glue_dir = ""  # GLUE's download layout; "" = TFDS glue/<task>
  config.data.tfds_data_dir = ""  # where TFDS's glue was prepared ("" = TFDS's default)
  config.data.max_seq_length = 128  # [CLS] A [SEP] B [SEP], the longer sentence cut first
  config.data.eval_split = ""  # scored at each evaluation ("" = dev; mnli: dev_matched)
  config.data.predict_splits = ""  # comma-separated splits written as GLUE leaderboard files
  # after training, e.g. "test" (mnli: "test_matched,test_mismatched,ax")

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 32  # global batch (all devices, all hosts)
  config.train.eval_batch_size = 64  # global batch for evaluation and prediction
  config.train.num_train_epochs = 3.0  # passes over the training split
  config.train.num_train_steps = -1  # set from the epochs and the split's size
  config.train.warmup_proportion = 0.1  # share of the steps with linear warmup
  config.train.warmup_steps = -1  # set from warmup_proportion
  config.train.stop_after_steps = -1  # stop (with a checkpoint) here; rerun to go on (-1: the end)
  config.train.learning_rate = 2e-5  # peak, then linear decay to 0
  config.train.weight_decay = 0.01  # AdamW decay, off LayerNorm and biases
  config.train.b1 = 0.9
  config.train.b2 = 0.999
  config.train.eps = 1e-6
  config.train.clip_norm = 1.0  # clip gradients by global norm
  config.train.grad_accum_steps = 1  # micro-batches per update (batch_size is split into them)
  config.train.log_every_steps = 50  # metrics.jsonl, TensorBoard and the progress bar
  config.train.eval_every_steps = -1  # dev evaluation (-1 = every epoch; always at the end)
  config.train.eval_steps = -1  # eval batches per evaluation (-1 = the whole dev split)
  config.train.checkpoint_every_steps = -1  # (-1 = every epoch; always at the end / on SIGTERM)
  config.train.keep_checkpoints = 1  # most recent checkpoints kept

  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1  # data-parallel ways (-1 = all devices not used by fsdp/tensor)
  config.mesh.fsdp = 1  # parameter-sharded data parallelism
  config.mesh.tensor = 1  # tensor (model) parallelism
  return config
