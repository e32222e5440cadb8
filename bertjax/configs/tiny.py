"""CPU demo: a tiny BERT (L2 H128 A2) pretrained with MLM + NSP on the bundled Jane Austen corpus.

  python -m bertjax.main --config=configs/tiny.py --workdir=/tmp/bertjax_tiny

Prepares the corpus into WORKDIR/data once (a sentencepiece vocabulary trained on the training
chapters, NSP pairs in shards; reused on later runs), masks batches as it streams them, pretrains for a few minutes on 2 CPU cores, evaluates on held-out chapters and
checkpoints. Held-out MLM accuracy ends far above the frequency baseline (predicting the most
common token) and NSP accuracy above 50%; the README gives the figures measured.

It is also the pretraining default, every field commented: base.py (and large.py) are this plus
the paper's values. `--config.pretraining.nsp=false` and `--config.pretraining.objective=ltr`
pretrain the paper's No NSP and LTR & No NSP ablations (section 5.1) instead.
"""
import ml_collections


def get_config(arg=None):
  del arg
  config = ml_collections.ConfigDict()
  config.task = "pretraining"  # a name in bertjax.tasks.REGISTRY
  config.seed = 0  # parameter init, dropout, data order and masking
  config.init_checkpoint = ""  # bertjax checkpoint to take parameters from ("" = from scratch)

  # The pretraining tasks (the paper's ablations, section 5.1 and Table 5; README "Pretraining
  # ablations"). Both ablations train on contiguous spans [CLS] A [SEP] B [SEP], cut into two
  # segments at a sentence boundary so that both segment embeddings train (prepared with
  # --contiguous=true; on first use automatically), and are not packed.
  config.pretraining = ml_collections.ConfigDict()
  config.pretraining.objective = "mlm"  # mlm: the masked LM (BERT); ltr: a left-to-right LM
  # (causal attention, each token predicted from those before it, no [MASK], never NSP: the
  # paper's "LTR & No NSP"; fine-tuning from it keeps the causal mask)
  config.pretraining.nsp = True  # next-sentence prediction beside the masked LM, on NSP pairs;
  # false: "No NSP", the masked LM alone (objective=mlm only: ltr never has NSP)

  config.model = ml_collections.ConfigDict()
  config.model.size = "tiny"  # bertjax.models.config.SIZES: tiny mini small medium base large
  config.model.hidden_act = "gelu"  # "gelu" (exact, erf) or "gelu_tanh" (tanh approximation)
  config.model.dtype = "auto"  # compute dtype: auto (bfloat16 on GPU/TPU, float32 on CPU),
  # float32 or bfloat16; params, LayerNorm, softmax and loss stay float32
  config.model.attention = "auto"  # auto, reference (the paper's, with attention dropout), xla,
  # cudnn (GPU) or splash (TPU); fused kernels need attention_dropout_rate=0; auto = the
  # fastest the backend has, reference when attention_dropout_rate > 0
  config.model.remat = "none"  # recompute activations in the backward pass: none, full, dots
  config.model.fused_qkv = False  # query, key, value as one matmul (the same three parameters)
  config.model.mlm_logits_dtype = "float32"  # the MLM head's vocabulary logits: float32,
  # bfloat16 or auto (= the compute dtype); its softmax and loss stay float32
  config.model.pad_vocab_to_multiple = 128  # embedding/MLM rows rounded up (never predicted)
  # Dropout 0.1 in the paper (configs/base.py); 0 here: the demo sees each example about once,
  # so dropout only slows learning, and drawing its random bits costs a quarter of a CPU step.
  config.model.dropout_rate = 0.0  # embeddings and residual branches
  config.model.attention_dropout_rate = 0.0  # attention probabilities
  config.model.max_position_embeddings = 512  # learned positions; >= data.max_seq_length

  config.data = ml_collections.ConfigDict()
  config.data.input_files = ""  # comma-separated globs of text files ("" = the bundled corpus);
  # format: one sentence per line, blank line between documents (as google-research/bert)
  config.data.tfds_name = ""  # or a TFDS dataset name (e.g. "wikipedia/20230601.en") instead
  config.data.tfds_split = "train"  # its split
  config.data.tfds_feature = "text"  # its text feature; each example is one document
  config.data.tfds_data_dir = ""  # where it was built ("" = TFDS's default); never downloads
  config.data.prepared = ""  # a directory from bertjax.data.prepare, instead of the text above
  # ("" = the text above is prepared into WORKDIR/data on first use and reused after)
  config.data.prepare_workers = 0  # processes that prepare WORKDIR/data (0 = every core)
  config.data.loader_threads = 2  # threads that read and mask batches ahead of the step
  config.data.vocab_model = ""  # sentencepiece .model or WordPiece vocab.txt ("" = the
  # init_checkpoint's, else one trained on the training documents)
  config.data.vocab_size = 8000  # size of the sentencepiece vocabulary trained when none is given
  config.data.max_seq_length = 128  # tokens per example, [CLS] A [SEP] B [SEP] + padding
  config.data.max_predictions_per_seq = 20  # masked positions per example at most
  config.data.long_seq_length = 0  # a second phase at this length (paper: 512); 0 = none
  config.data.long_max_predictions_per_seq = 80  # masked positions per long example at most
  config.data.masked_lm_prob = 0.15  # fraction of tokens masked (80% [MASK] 10% random 10% kept)
  config.data.short_seq_prob = 0.1  # chance an example targets a shorter length
  config.data.dupe_factor = 5  # times the corpus is turned into NSP pairs (different pairings)
  config.data.whole_word_masking = False  # mask all pieces of a word together
  config.data.dynamic_masking = True  # fresh masks each epoch (False: one fixed mask per example)
  config.data.packing = False  # several examples a training row, attention kept within each
  # (Krell et al. 2021), so little of a row is padding; train.batch_size then counts rows, each
  # of up to max_sequences_per_row examples. Evaluation is not packed.
  config.data.max_sequences_per_row = 3  # examples in a packed row at most (as the data's plans)
  config.data.eval_fraction = 0.05  # share of documents held out for evaluation

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 32  # global batch (all devices, all hosts); rows with data.packing
  config.train.eval_batch_size = 128  # global batch for evaluation
  config.train.num_train_steps = 2000  # optimizer updates
  config.train.long_seq_from_step = 0  # first step at data.long_seq_length (if set)
  config.train.stop_after_steps = -1  # stop (with a checkpoint) here; rerun to go on (-1: the end)
  config.train.warmup_steps = 200  # linear warmup, then linear decay to 0
  config.train.lr_decay_power = 1.0  # decay after warmup as (1 - progress) ** power: 1.0 is
  # the paper's linear decay, 0.5 NVIDIA's with LAMB (see README)
  config.train.lr_decay_from_step_0 = False  # true: progress counted from step 0, as the
  # original TF code and NVIDIA's scheduler (the rate steps down as warmup ends)
  config.train.lr_schedule = "linear"  # linear: warmup then the decay above (BERT's); wsd:
  # warmup, the peak held, then a decay to 0 over the last decay_steps (ModernBERT's)
  config.train.decay_steps = 0  # wsd: steps of the final decay (0 = none: the peak to the end)
  config.train.decay_shape = "1-sqrt"  # wsd: 1-sqrt (ModernBERT's: 1 - sqrt(progress)) or linear
  config.train.learning_rate = 2e-3  # peak; a tiny model takes a far larger rate than base
  config.train.optimizer = "adamw"  # adamw (the paper), lamb (large batches; see README) or
  # stable_adamw (ModernBERT's: AdamW with each tensor's update clipped, Wortsman et al. 2023)
  config.train.weight_decay = 0.01  # AdamW decay, off LayerNorm and biases
  config.train.b1 = 0.9  # AdamW: decay of the first moment (the gradients' moving average)
  config.train.b2 = 0.999  # AdamW: decay of the second moment (the squared gradients')
  config.train.eps = 1e-6  # AdamW: added to the second moment's root (BERT's; optax's is 1e-8)
  config.train.clip_norm = 1.0  # clip gradients by global norm
  config.train.grad_accum_steps = 1  # micro-batches per update (batch_size is split into them)
  config.train.prng_impl = "threefry"  # random keys (init, dropout): threefry (jax's default),
  # rbg or unsafe_rbg (XLA's RngBitGenerator: other numbers); a resumed run keeps its own
  config.train.log_every_steps = 100  # metrics.jsonl, TensorBoard and the progress bar
  config.train.eval_every_steps = 500  # held-out evaluation (and always at the end)
  config.train.eval_steps = -1  # eval batches per evaluation (-1 = the whole held-out set)
  config.train.checkpoint_every_steps = 500  # and always at the end / on SIGTERM
  config.train.keep_checkpoints = 2  # most recent checkpoints kept

  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1  # data-parallel ways (-1 = all devices not used by fsdp/tensor)
  config.mesh.fsdp = 1  # parameter-sharded data parallelism
  config.mesh.tensor = 1  # tensor (model) parallelism
  return config
