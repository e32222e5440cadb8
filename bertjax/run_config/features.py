"""Feature extraction's schema (`FeaturesRun`: configs/features.py)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class FeaturesRun:
  """Feature extraction (`bertjax.tasks.features`: extract_features.py's output)."""
  task: str = "features"  # a name in bertjax.tasks.REGISTRY
  init_checkpoint: str = ""  # the model (required), with bert_config.json and its tokenizer
  input_file: str = ""  # text, one input a line; "text_a ||| text_b" for pairs (required)
  layers: str = "-1,-2,-3,-4"  # layer indices: -1 = the last layer, 0 = the first
  max_seq_length: int = 128  # tokens per input with [CLS]/[SEP]; longer inputs are cut
  batch_size: int = 8  # inputs per forward pass
