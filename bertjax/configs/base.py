"""BERT-base (L12 H768 A12, 110M parameters) pretraining, the paper's recipe.

  python -m bertjax.data.prepare --input='/data/text/*.txt' --output_dir=/mnt/bucket/bert_data \
      --vocab=/data/vocab.txt --max_seq_length=128,512 --dupe_factor=5
  python -m bertjax.main --config=configs/base.py --workdir=/mnt/bucket/bert_base \
      --config.data.prepared=/mnt/bucket/bert_data

Batch 256, lr 1e-4 (warmup 10k, linear decay), 1M steps: 900k at sequence length 128 (20
predictions per sequence), then 100k at 512 (80 predictions), switched within the one run. Text
and workdir are paths on the host (mount a Cloud Storage bucket, e.g. with gcsfuse, for them). The
paper reports MNLI-m 84.6 for BERT-base after fine-tuning (about 4 days on 16 Cloud TPU v3 chips).
On a CPU, one step at a reduced batch:
  --config.train.batch_size=2 --config.train.warmup_steps=0 --config.train.num_train_steps=1

Computes in bfloat16 on GPU and TPU (model.dtype=auto). The paper recipe keeps attention dropout
0.1, so attention is the exact reference einsum. `--config=configs/base.py:fast` is the fast
variant that MosaicBERT and ModernBERT train with: no attention-probability dropout, so the fused
kernel of the backend (cuDNN flash attention on GPU, splash attention on TPU), and sequence
packing (several examples per row, no padding, each row with only the prediction slots it can
fill: 21 at 128 tokens); and the MLM head's vocabulary logits in the compute dtype (bfloat16 on
GPU/TPU; its softmax and loss in float32); everything else is the paper's. model.fused_qkv and
model.remat=dots are left to measure on a GPU (README: "What the fast recipe leaves out").
"""
from bertjax.configs import tiny
from bertjax.errors import UserError


def get_config(arg=None):
  """The paper's recipe; arg "fast": fused attention without attention dropout, packing, and
  MLM logits in the compute dtype."""
  if arg not in (None, "", "fast"):
    raise UserError(f"configs/base.py takes no argument or fast (configs/base.py:fast), not "
                    f"{arg!r}.")
  config = tiny.get_config()
  config.model.size = "base"
  config.model.dropout_rate = 0.1  # the paper's dropout, everywhere
  config.model.attention_dropout_rate = 0.1
  config.data.vocab_size = 30522  # as the paper's WordPiece vocabulary
  config.data.max_predictions_per_seq = 20
  config.data.long_seq_length = 512  # the last 10% of steps, as the paper
  config.data.long_max_predictions_per_seq = 80
  config.data.dupe_factor = 10
  config.data.eval_fraction = 0.01
  config.train.batch_size = 256
  config.train.eval_batch_size = 256
  config.train.num_train_steps = 1_000_000
  config.train.warmup_steps = 10_000
  config.train.long_seq_from_step = 900_000
  config.train.learning_rate = 1e-4
  config.train.log_every_steps = 1000
  config.train.eval_every_steps = 50_000
  config.train.eval_steps = 100
  config.train.checkpoint_every_steps = 10_000
  config.train.keep_checkpoints = 3
  if arg == "fast":
    config.model.attention_dropout_rate = 0.0  # fused kernels cannot drop probabilities
    config.data.packing = True  # packed rows get only the prediction slots they can fill
    config.model.mlm_logits_dtype = "auto"  # bfloat16 vocabulary logits on GPU/TPU (f32 loss)
  return config
