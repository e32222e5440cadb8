"""BERT-large (L24 H1024 A16, 340M parameters) pretraining, the paper's recipe.

  python -m bertjax.main --config=configs/large.py --workdir=/mnt/bucket/bert_large \
      --config.data.prepared=/mnt/bucket/bert_data      # prepared as in configs/base.py

As configs/base.py (batch 256, lr 1e-4, 1M steps, seq 128 then 512) with the large encoder. The
paper reports MNLI-m 86.7 after fine-tuning. FSDP over 8 chips: --config.mesh.fsdp=8.
`--config=configs/large.py:fast` is the fast variant of configs/base.py:fast.
"""
from bertjax.configs import base


def get_config(arg=None):
  config = base.get_config(arg)
  config.model.size = "large"
  return config
