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

The recipe (the ModernBERT repository's yamls/modernbert/modernbert-base-pretrain.yaml and
main.py, and the paper's section 2.2 and appendix): StableAdamW (`train.optimizer=stable_adamw`)
at lr 8e-4 (large 5e-4), betas (0.9, 0.98), eps 1e-6, weight decay 1e-5 decoupled from the rate
(optimi's decouple_lr: train.decouple_lr, so the decay stays 1e-5 a step at the peak whatever
--config.train.learning_rate is), off norms and biases, no gradient clipping; warmup 3B tokens,
then a constant rate (warmup-stable-decay, `train.lr_schedule=wsd`), decayed with 1-sqrt over
the last 50B tokens; dropout 0.1 on the attention output only (model.dropout_rate in ModernBERT); 1.719T tokens at
1,024 with global rotary base 10,000, then the context extension: 8,192 tokens with global base
160,000 (model.long_rope_theta_global), about 300B tokens. ModernBERT ran the extension as a run
of its own at a lower constant rate (3e-4) and a smaller batch; here it is the long phase of one
run (`train.long_seq_from_step`), at the same batch of rows and the run's schedule, so the
decay falls inside it. Steps are the token counts at batch 4,608 rows.

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
  """ModernBERT-base or -large as the paper trains it (the module docstring's sources)."""
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
  tr.batch_size = 4608  # rows (ModernBERT ramps its batch up over the first 50B tokens)
  tr.eval_batch_size = 256
  tr.learning_rate = 8e-4 if size == "base" else 5e-4
  tr.warmup_steps = 636  # 3B tokens at 4,608 x 1,024
  tr.long_seq_from_step = 364_301  # 1.719T tokens at 1,024
  tr.num_train_steps = 364_301 + 7_947  # + 300B tokens at 4,608 x 8,192
  tr.decay_steps = 1_325  # the last 50B tokens
  tr.log_every_steps = 1000
  tr.eval_every_steps = 20_000
  tr.eval_steps = 50
  tr.checkpoint_every_steps = 5_000
  tr.keep_checkpoints = 3
