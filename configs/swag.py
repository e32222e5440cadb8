"""SWAG fine-tuning (the paper, section 4.4): pick the right ending of four.

  python -m bertjax.main --config=configs/swag.py --workdir=DIR \
      --config.init_checkpoint=CKPT --config.data.train_file=SWAG/train.csv \
      --config.data.eval_file=SWAG/val.csv [--config.data.predict_file=SWAG/test.csv]

CKPT: a pretraining workdir or a directory from `python -m bertjax.convert --from=hf|tf` (e.g.
Google's BERT-base). SWAG: the data/ directory of the rowanz/swagaf repository (train.csv,
val.csv, test.csv). The defaults are the paper's: 3 epochs, learning rate 2e-5, batch 16, with
BERT's usual warmup 10% and dropout 0.1; the paper gives no sequence length, and 128 is
transformers' run_swag.py default. The paper reports dev accuracy 81.6 (BERT-base) and 86.6
(BERT-large). Writes eval_results.json (dev loss and accuracy), eval_predictions.csv
(id,label,prediction) and, with data.predict_file, test_predictions.csv (id,prediction).
"""
import ml_collections


def get_config(arg=None):
  del arg
  config = ml_collections.ConfigDict()
  config.task = "swag"  # a name in bertjax.tasks.REGISTRY
  config.seed = 0  # scorer init, dropout and data order
  config.init_checkpoint = ""  # the pretrained model (required), with bert_config.json + vocab

  config.model = ml_collections.ConfigDict()
  config.model.dtype = "float32"  # compute dtype: float32 or bfloat16 (params stay float32)
  config.model.dropout_rate = 0.1  # embeddings, residual branches and the scorer
  config.model.attention_dropout_rate = 0.1  # attention probabilities

  config.data = ml_collections.ConfigDict()
  config.data.train_file = ""  # swagaf's data/train.csv (required)
  config.data.eval_file = ""  # swagaf's data/val.csv (required): scored at each evaluation
  config.data.predict_file = ""  # optional, e.g. data/test.csv: written to test_predictions.csv
  config.data.max_seq_length = 128  # [CLS] sent1 [SEP] sent2 ending [SEP], longer part cut first

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 16  # global batch of questions (x4 sequences), all devices and hosts
  config.train.eval_batch_size = 64  # global batch for evaluation and prediction
  config.train.num_train_epochs = 3.0  # passes over the training file
  config.train.num_train_steps = -1  # set from the epochs and the file's size
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
  config.train.eval_steps = -1  # eval batches per evaluation (-1 = the whole dev file)
  config.train.checkpoint_every_steps = -1  # (-1 = every epoch; always at the end / on SIGTERM)
  config.train.keep_checkpoints = 1  # most recent checkpoints kept

  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1  # data-parallel ways (-1 = all devices not used by fsdp/tensor)
  config.mesh.fsdp = 1  # parameter-sharded data parallelism
  config.mesh.tensor = 1  # tensor (model) parallelism
  return config
