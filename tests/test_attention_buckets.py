"""Splash attention and fine-tuning's length buckets (bertjax.tasks.finetuning.length_buckets):
with model.attention=splash every bucket is a length splash runs at (a multiple of 128), so the
default buckets (32, 64, 96, ...) no longer stop a run at its first batch of short sentences."""
import dataclasses

import pytest

from bertjax import run_config
from bertjax.configs import finetuning as finetuning_config
from bertjax.models import attention
from bertjax.tasks import finetuning

from attention_helpers import CONFIG


def _typed(config):
  return run_config.typed(config, run_config.FinetuningRun)


@pytest.mark.parametrize("value, max_seq_length, packing, expected", [
    ("auto", 128, 0, (128,)),
    ("auto", 512, 0, (128, 256, 384, 512)),
    ("auto", 128, 4, (128, 256, 384, 512)),
    ("100,200,256", 512, 0, (128, 256, 512)),
    ("", 128, 0, ()),
])
def test_splash_buckets_are_lengths_splash_runs_at(value, max_seq_length, packing, expected):
  config = finetuning_config.get_config()
  config.model.attention = "splash"
  config.data.length_buckets, config.data.max_seq_length = value, max_seq_length
  buckets = finetuning.length_buckets(_typed(config), packing)
  assert buckets == expected
  splash = dataclasses.replace(CONFIG, attention="splash")
  for length in buckets:  # raised "needs a ... multiple of 128, got 32" before the rounding
    assert attention.resolve_attention(splash, "tpu", seq_len=length) == "splash"


def test_other_paths_keep_the_buckets_asked_for():
  config = finetuning_config.get_config()
  for path in ("auto", "xla", "reference"):
    config.model.attention = path
    assert finetuning.length_buckets(_typed(config)) == (32, 64, 96, 128)
