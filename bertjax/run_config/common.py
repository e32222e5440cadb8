"""The sections every training run has: the mesh, the train section's shared fields (the
optimizer, the schedule and the loop's intervals) and the divergence guard."""
from __future__ import annotations

import dataclasses


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
  mu_dtype: str = "float32"  # the first moment's dtype: float32, or bfloat16 (half its memory;
  # the second moment stays float32)
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


@dataclasses.dataclass(frozen=True)
class Divergence:
  """config.divergence: what counts as a divergence and what the run then does
  (`bertjax.training.divergence`). A step diverges when its loss or gradient norm is NaN or
  infinite, or spikes: it passes every spike test that is on (0 = off) against the last
  `window` steps checked, the median m and the robust deviation s = 1.4826 x their median
  absolute deviation: value > m + zscore x s, and value > ratio x m. The defaults never fire on
  the CPU demo or a healthy run of the fast recipe (docs/reliability.md gives the margins)."""
  policy: str = "stop"  # stop: stop with a message naming the step (the paper recipes);
  # rollback: restore the newest checkpoint, skip the batches from it through the spike (and
  # skip_batches more), go on; after max_rollbacks, stop
  window: int = 200  # steps the spike tests compare with; none is tested before it is full
  loss_zscore: float = 6.0  # a loss spike: this many robust deviations above the median
  loss_ratio: float = 1.25  # and this many times the median
  grad_norm_zscore: float = 20.0  # a gradient-norm spike: the same tests on the global norm
  grad_norm_ratio: float = 8.0  # (before clipping), its z-score and its ratio to the median
  max_rollbacks: int = 3  # rollbacks in the whole run; the next divergence stops it
  skip_batches: int = 0  # batches skipped beyond those the abandoned steps trained on
  lr_factor: float = 1.0  # the learning rate times this after a rollback (the whole update,
  # decoupled weight decay too)
  lr_factor_steps: int = 0  # for this many steps from the checkpoint restored (0: none)
