"""The fine-tuning default: the fields glue.py, ner.py, squad.py and swag.py share, each commented.

Not run by itself (it names no task): each of those configs is this plus its task, its data
fields and the few values its recipe changes. The values are the paper's GLUE recipe (section
4.1): batch 32, 3 epochs, learning rate 2e-5 with linear decay, warmup 10%, dropout 0.1, 128
tokens, from a pretrained model (`--config.init_checkpoint`). What runs faster than the paper did
and gives its results, batches cut to length buckets and (GLUE) sentences packed several to a
row, is on by default.
"""
import ml_collections


def get_config(arg=None):
  del arg
  config = ml_collections.ConfigDict()
  config.task = ""  # a name in bertjax.tasks.REGISTRY (each task's config sets it)
  config.seed = 0  # head init, dropout and data order
  config.init_checkpoint = ""  # the pretrained model (required), with bert_config.json + vocab

  config.model = ml_collections.ConfigDict()
  config.model.dtype = "auto"  # compute dtype: auto (bfloat16 on GPU/TPU, float32 on CPU),
  # float32 or bfloat16; params, LayerNorm, softmax and loss stay float32
  config.model.attention = "auto"  # as configs/tiny.py: reference while attention dropout > 0
  config.model.remat = "none"  # recompute activations in the backward pass: none, full, dots
  config.model.dropout_rate = 0.1  # embeddings, residual branches and the task's head
  config.model.attention_dropout_rate = 0.1  # attention probabilities
  config.model.pooling = ""  # ModernBERT: what sequence-level heads read, cls or mean ("" =
  # the pretrained model's); BERT always pools [CLS]
  config.model.bilstm_on_top = False  # the paper's "+ BiLSTM" (Table 5): a fresh one-layer
  # BiLSTM (hidden_size / 2 units a direction) between the encoder and any task's head; pooled
  # heads read its two final states instead of the pooler; no data.packing with it

  config.data = ml_collections.ConfigDict()  # each task's config adds its files and fields
  config.data.max_seq_length = 128  # tokens per sequence with [CLS]/[SEP]; longer input is cut
  config.data.length_buckets = "auto"  # each batch cut to the shortest of these lengths that
  # holds its longest example or row (GLUE, NER, SWAG; SQuAD always pads): "auto" = every
  # multiple of 32; or e.g. "32,64,128"; "" = every batch padded to max_seq_length
  config.data.packing = "auto"  # examples a row (GLUE; exact: each pooled from its own [CLS],
  # attending only to itself, the batch still train.batch_size examples): "auto" = as many as
  # fit in max_seq_length on average, where the task can pack (else one a row); "0" = one a row

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 32  # global batch of examples (all devices, all hosts)
  config.train.eval_batch_size = 64  # global batch for evaluation and prediction
  config.train.num_train_epochs = 3.0  # passes over the training data
  config.train.num_train_steps = -1  # set from the epochs and the training data's size
  config.train.warmup_proportion = 0.1  # share of the steps with linear warmup
  config.train.warmup_steps = -1  # set from warmup_proportion
  config.train.stop_after_steps = -1  # stop (with a checkpoint) here; rerun to go on (-1: the end)
  config.train.learning_rate = 2e-5  # peak, then linear decay to 0
  config.train.lr_decay_power = 1.0  # decay after warmup as (1 - progress) ** power: 1.0 is
  # the paper's linear decay, 0.5 NVIDIA's with LAMB (see README)
  config.train.lr_decay_from_step_0 = False  # true: progress counted from step 0, as the
  # original TF code and NVIDIA's scheduler (the rate steps down as warmup ends)
  config.train.optimizer = "adamw"  # adamw (the paper), lamb or stable_adamw (ModernBERT's)
  config.train.weight_decay = 0.01  # AdamW decay, off LayerNorm and biases
  config.train.frozen_params = ""  # top-level parameter groups never changed (no update, no
  # weight decay), comma-separated: "bert" = the encoder (configs/ner.py:feature_based)
  config.train.b1 = 0.9  # AdamW: decay of the first moment (the gradients' moving average)
  config.train.b2 = 0.999  # AdamW: decay of the second moment (the squared gradients')
  config.train.eps = 1e-6  # AdamW: added to the second moment's root (BERT's; optax's is 1e-8)
  config.train.clip_norm = 1.0  # clip gradients by global norm
  config.train.grad_accum_steps = 1  # micro-batches per update (batch_size is split into them)
  config.train.prng_impl = "threefry"  # random keys (init, dropout): threefry (jax's default),
  # rbg or unsafe_rbg (XLA's RngBitGenerator: other numbers); a resumed run keeps its own
  config.train.log_every_steps = 50  # metrics.jsonl, TensorBoard and the progress bar
  config.train.eval_every_steps = -1  # dev evaluation (-1 = every epoch; always at the end)
  config.train.eval_steps = -1  # eval batches per evaluation (-1 = the whole dev data)
  config.train.checkpoint_every_steps = -1  # (-1 = every epoch; always at the end / on SIGTERM)
  config.train.keep_checkpoints = 1  # most recent checkpoints kept

  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1  # data-parallel ways (-1 = all devices not used by fsdp/tensor)
  config.mesh.fsdp = 1  # parameter-sharded data parallelism
  config.mesh.tensor = 1  # tensor (model) parallelism
  return config
