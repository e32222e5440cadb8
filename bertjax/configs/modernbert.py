"""ModernBERT (Warner et al. 2024, arXiv 2412.13663) pretraining: the CPU demo, and base and
large with the paper's recipe.

  python -m bertjax.main --config=configs/modernbert.py --workdir=/tmp/bertjax_modernbert
  python -m bertjax.main --config=configs/modernbert.py:base --workdir=W --config.data.prepared=D

The model (`bertjax.models.modernbert`): pre-LayerNorm without biases, GeGLU, rotary embeddings,
global attention every third layer and a window of local_attention tokens in the others, a final
norm and a Dense-GELU-LayerNorm head; sizes as ModernBERT's (`MODERNBERT_SIZES`: tiny for CPU,
base 149M, large 395M). Pretraining is the masked LM alone on contiguous spans (no NSP), 30% of
the tokens masked, on fused attention (no attention-probability dropout) with packing left to
the data (spans fill their rows).

The recipe, from the ModernBERT repository's yamls (yamls/modernbert/modernbert-{base,large}-
{pretrain,context-extension,learning-rate-decay}.yaml, commit 00220af) and the paper (section 2.2
and appendix): StableAdamW (`train.optimizer=stable_adamw`, the yamls' decoupled_stableadamw),
betas (0.9, 0.98), eps 1e-6, no gradient clipping, weight decay off norms and biases and
decoupled from the rate (optimi's decouple_lr: `train.decouple_lr`, the decay a step at the
plateau, whatever the rate is); dropout 0.1 on the attention output only (attn_out_dropout_prob;
model.dropout_rate in ModernBERT), none on the probabilities; 30% of the tokens masked in
training, the held-out MLM also scored at the yamls' 15% (`data.eval_masked_lm_prob`: metrics
mlm_accuracy_at_15pct, mlm_loss_at_15pct). Three runs in the yamls, one here, in phases:

  phase (yaml)                base                          large
  pretrain (-pretrain)        1.719T tokens at 1,024,       1.719T tokens at 1,024, batch 4,928,
                              batch 4,608, warmup 3B        warmup 2B tokens, lr 5e-4, wd 1e-5,
                              tokens, lr 8e-4, wd 1e-5,     global rotary base 10,000; from 900B
                              global rotary base 10,000     tokens lr 5e-5, wd 1e-6 (the paper:
                              (warmup_stable_decay,         "rolled back and restarted at 5e-5";
                              t_decay 0: no decay)          wd from the large extension yamls)
  context extension           250B tokens at 8,192, 576     250B tokens at 8,192, 616 rows, lr
  (-context-extension)        rows, constant lr 3e-4, wd    5e-5, wd 1e-6, the same bases
                              1e-5, global base 160,000
                              (local 10,000)
  decay (-learning-rate-      50B tokens, the same rows,    50B tokens (the yaml: 624 rows; 616
  decay)                      1-sqrt from 3e-4 to 0.001x    here), 1-sqrt from 5e-5 to 0.001x
                              (one_minus_sqrt, alpha_f)

In bertjax's fields: data.long_seq_length from train.long_seq_from_step, with its own rows
(train.long_batch_size), rate (train.long_learning_rate), weight decay (train.long_weight_decay)
and global rotary base (model.long_rope_theta_global); large's restart is train.restart_from_step
at restart_learning_rate and restart_weight_decay; the decay is the wsd schedule's last
decay_steps, to train.decay_floor of the rate. Steps are the tokens over the tokens a step (the
long rows are as many tokens a step as the short ones: 576 x 8,192 = 4,608 x 1,024). What
bertjax keeps different: one run with phases where the authors ran three (each from the one
before's checkpoint, weights and optimizer state, with a new schedule: load_path, reset_time,
restart_override); no batch-size ramp (the yamls ramp the batch over the first 50B tokens, 10B
for large); large's decay at 616 rows, not 624; large starts from scratch, where the authors
initialised it from base's weights (tile_weights_from_middle); and large's restart continues the
run at 900B tokens where the authors rolled back to an earlier checkpoint.

The demo (no argument) is tiny (L6 H128 A2, GeGLU 192) on the bundled corpus at 128 tokens with
a window of 64, the tiny config's data and rate, the same optimizer and schedule; it learns on 2
CPU cores in minutes (README).
"""
from bertjax.configs import tiny
from bertjax.errors import UserError

SIZES = ("base", "large")


def get_config(arg=None):
  """The CPU demo; arg "base" or "large": ModernBERT's recipe at that size."""
  if arg not in (None, "") + SIZES:
    raise UserError(f"configs/modernbert.py takes no argument, base or large "
                    f"(configs/modernbert.py:base), not {arg!r}.")
  config = tiny.get_config()
  config.pretraining.nsp = False  # the masked LM alone, on contiguous spans
  m = config.model
  m.architecture = "modernbert"  # bertjax.models.modernbert
  m.size = "tiny"  # bertjax.models.config.MODERNBERT_SIZES: tiny base large
  m.max_position_embeddings = 8192  # the context it is trained for (no position table)
  m.local_attention = 64  # a local layer's window, in tokens (ModernBERT: 128)
  m.global_attention_every = 3  # layers 0, 3, 6, ... attend globally
  m.rope_theta_global = 160_000.0  # the global layers' rotary base (10,000 before extension)
  m.rope_theta_local = 10_000.0  # the local layers' rotary base
  m.long_rope_theta_global = 0.0  # the long phase's global base (context extension); 0 = same
  m.pooling = "cls"  # what sequence-level fine-tuning heads read: cls or mean
  m.dropout_rate = 0.0  # ModernBERT: on the attention output only (0.1 in its pretraining)
  m.attention_dropout_rate = 0.0  # fused attention kernels take none
  config.data.masked_lm_prob = 0.3  # ModernBERT masks 30% of the tokens
  config.data.max_predictions_per_seq = 40  # 30% of 128
  config.data.eval_masked_lm_prob = 0.15  # the yamls evaluate at 15%
  tr = config.train
  tr.optimizer = "stable_adamw"  # AdamW with per-tensor update clipping (Wortsman et al. 2023)
  tr.b2 = 0.98
  tr.eps = 1e-6
  tr.clip_norm = 0.0  # ModernBERT clips updates, not gradients
  tr.lr_schedule = "wsd"  # warmup, constant, then decay
  tr.decay_shape = "1-sqrt"
  tr.decay_steps = 400  # the last 20% of the demo's 2,000 steps
  tr.weight_decay = 1e-5  # a step at the peak: not multiplied by the rate (optimi's decouple_lr)
  tr.decouple_lr = True
  if arg:
    _paper_recipe(config, arg)
  return config


def _paper_recipe(config, size: str) -> None:
  """ModernBERT-base or -large as its authors trained it (the module docstring's table)."""
  m, data, tr = config.model, config.data, config.train
  m.size = size
  m.local_attention = 128
  m.rope_theta_global = 10_000.0  # until the context extension
  m.long_rope_theta_global = 160_000.0
  m.dropout_rate = 0.1  # attention output
  data.vocab_size = 50368  # as ModernBERT's (its tokenizer.json: --config.data.vocab_model)
  data.max_seq_length = 1024
  data.max_predictions_per_seq = 308  # 30% of 1,024
  data.long_seq_length = 8192
  data.long_max_predictions_per_seq = 2458  # 30% of 8,192
  data.dupe_factor = 1
  data.eval_fraction = 0.001
  tr.eval_batch_size = 256
  tr.decay_floor = 0.001  # the decay yamls' alpha_f
  if size == "base":
    tr.batch_size, tr.long_batch_size = 4608, 576  # rows of 1,024, then of 8,192
    tr.learning_rate, tr.long_learning_rate = 8e-4, 3e-4
    tr.weight_decay = tr.long_weight_decay = 1e-5
    tr.warmup_steps = 636  # 3B tokens at 4,608 x 1,024
    tr.long_seq_from_step = 364_304  # 1.719T tokens at 4,608 x 1,024
    tr.decay_steps = 10_596  # 50B tokens at 576 x 8,192
    tr.num_train_steps = 364_304 + 52_982 + 10_596  # + 250B constant + 50B decay
  else:
    tr.batch_size, tr.long_batch_size = 4928, 616
    tr.learning_rate, tr.weight_decay = 5e-4, 1e-5
    tr.warmup_steps = 396  # 2B tokens at 4,928 x 1,024
    tr.restart_from_step = 178_349  # 900B tokens
    tr.restart_learning_rate, tr.restart_weight_decay = 5e-5, 1e-6
    tr.long_learning_rate, tr.long_weight_decay = 5e-5, 1e-6
    tr.long_seq_from_step = 340_648  # 1.719T tokens at 4,928 x 1,024
    tr.decay_steps = 9_908  # 50B tokens at 616 x 8,192
    tr.num_train_steps = 340_648 + 49_542 + 9_908  # + 250B constant + 50B decay
  tr.log_every_steps = 1000
  tr.eval_every_steps = 20_000
  tr.eval_steps = 50
  tr.checkpoint_every_steps = 5_000
  tr.keep_checkpoints = 3
