"""Named-entity recognition fine-tuning on CoNLL-2003 (the paper, section 5.3).

  python -m bertjax.main --config=configs/ner.py --workdir=DIR \
      --config.init_checkpoint=CKPT --config.data.data_dir=CONLL_DIR \
      --config.data.predict_file=test.txt

CKPT: a pretraining workdir or a directory from `python -m bertjax.convert --from=hf|tf`; a
cased model (e.g. Google's cased BERT-base) suits NER. CONLL_DIR: CoNLL-2003 as distributed
(train.txt, valid.txt, test.txt; "word POS chunk NER" lines, -DOCSTART- lines, IOB1 or IOB2
tags). The defaults are the common BERT CoNLL-2003 settings: batch 32, 3 epochs, learning rate
5e-5, warmup 10%, dropout 0.1, 128 tokens (longer sentences are cut into windows of whole
words). Writes labels.json (the tag of each class id), eval_results.json (dev entity-level
precision/recall/F1 by seqeval, token accuracy), eval_predictions.txt and, for
data.predict_file, test_predictions.txt (CoNLL "word gold predicted" lines) and
test_results.json. The paper reports F1 96.4 (dev) and 92.4 (test) for BERT-base, with the
maximal document context around each sentence, which this sentence-level reader does not add.
"""
import ml_collections


def get_config(arg=None):
  del arg
  config = ml_collections.ConfigDict()
  config.task = "ner"  # bertjax.tasks.REGISTRY
  config.seed = 0  # classifier init, dropout and data order
  config.init_checkpoint = ""  # the pretrained model (required), with bert_config.json + vocab

  config.model = ml_collections.ConfigDict()
  config.model.dtype = "float32"  # compute dtype: float32 or bfloat16 (params stay float32)
  config.model.dropout_rate = 0.1  # embeddings, residual branches and the classifier
  config.model.attention_dropout_rate = 0.1  # attention probabilities

  config.data = ml_collections.ConfigDict()
  config.data.data_dir = ""  # directory of the files below (absolute file paths need none)
  config.data.train_file = "train.txt"  # CoNLL-format training file; its tags are the classes
  config.data.eval_file = ""  # tagged dev file, scored at each evaluation ("" = valid.txt,
  # else dev.txt)
  config.data.predict_file = ""  # predicted after training into test_predictions.txt, e.g.
  # test.txt (scored into test_results.json when tagged); "" = none
  config.data.label_column = -1  # the tag's column (-1 = the last: CoNLL-2003's NER tags)
  config.data.max_seq_length = 128  # [CLS] words [SEP]; longer sentences become more rows

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 32  # global batch of rows (all devices, all hosts)
  config.train.eval_batch_size = 64  # global batch for evaluation and prediction
  config.train.num_train_epochs = 3.0  # passes over the training file
  config.train.num_train_steps = -1  # set from the epochs and the file's size
  config.train.warmup_proportion = 0.1  # share of the steps with linear warmup
  config.train.warmup_steps = -1  # set from warmup_proportion
  config.train.stop_after_steps = -1  # stop (with a checkpoint) here; rerun to go on (-1: the end)
  config.train.learning_rate = 5e-5  # peak, then linear decay to 0
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
