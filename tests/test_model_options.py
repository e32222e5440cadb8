"""Tests of bertjax.modeldir.model_options: the compute dtype by backend and the run's BertConfig
fields."""
import re

import pytest

from bertjax import run_config, tasks
from bertjax.modeldir import model_options
from bertjax.configs import base, finetuning, tiny
from bertjax.errors import UserError


@pytest.mark.parametrize("dtype, platform, expected", [
    ("auto", "cpu", "float32"), ("auto", "gpu", "bfloat16"), ("auto", "tpu", "bfloat16"),
    ("float32", "gpu", "float32"), ("bfloat16", "cpu", "bfloat16")])
def test_resolve_dtype(dtype, platform, expected):
  assert model_options.resolve_dtype(dtype, platform) == expected


def test_auto_is_float32_on_this_cpu():
  assert model_options.resolve_dtype("auto") == "float32"


def test_overrides_of_the_configs():
  assert model_options.pretraining_overrides(tasks.typed(tiny.get_config()).model) == dict(
      dropout_rate=0.0, attention_dropout_rate=0.0, attention="auto", remat="none",
      pad_vocab_to_multiple=128, fused_qkv=False, dropout_per_hash=2, dtype="float32",
      mlm_logits_dtype="float32", pooling="cls", local_kernel="auto", fp8=False)
  # Fine-tuning keeps the pretrained model's padding (bert_config.json), so sets none.
  finetuning_model = run_config.typed(finetuning.get_config(), run_config.FinetuningRun).model
  assert "pad_vocab_to_multiple" not in model_options.bert_overrides(finetuning_model)
  # A config.json of an older run, without the new fields, takes their defaults (the schema's).
  old = {"task": "pretraining", "model": dict(dtype="bfloat16", dropout_rate=0.1)}
  assert model_options.pretraining_overrides(
      run_config.typed(old, run_config.PretrainingRun).model) == dict(
          dropout_rate=0.1, attention_dropout_rate=0.0, attention="auto", remat="none",
          pad_vocab_to_multiple=128, fused_qkv=False, dropout_per_hash=2, dtype="bfloat16",
          mlm_logits_dtype="float32", pooling="cls", local_kernel="auto", fp8=False)


def test_fast_variant_of_base():
  paper, fast = base.get_config(), base.get_config("fast")
  assert paper.model.attention_dropout_rate == 0.1 and not paper.data.packing
  assert fast.model.attention_dropout_rate == 0.0 and fast.data.packing
  assert fast.model.attention == "auto" and fast.model.dtype == "auto"
  with pytest.raises(UserError, match="configs/base.py:fast"):
    base.get_config("fastest")


@pytest.mark.parametrize("fields, message", [
    (dict(attention="splash"), "splash attention needs a TPU, and this backend is 'cpu'; use "
                               "--config.model.attention=auto"),
    (dict(attention="cudnn", dtype="bfloat16"), "cudnn attention needs an NVIDIA GPU"),
    (dict(attention="xla", attention_dropout_rate=0.1), "cannot drop attention probabilities"),
    (dict(remat="some"), "BertConfig.remat='some'"),
    (dict(mlm_logits_dtype="float16"), "BertConfig.mlm_logits_dtype='float16'"),
])
def test_pretraining_refuses_a_model_that_cannot_run_before_preparing(fields, message):
  from bertjax.tasks import pretraining_config  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.model.update(fields)
  with pytest.raises(UserError, match=re.escape(message)):
    pretraining_config.check_config(tasks.typed(config))
