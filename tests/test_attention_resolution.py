"""Which attention path a config gets (bertjax.models.attention.resolve_attention): what 'auto'
means per backend, dtype, head size, sequence length and dropout; explicit paths; and the paths,
lengths, backends and configs that are refused (splash off a TPU or at a length not a multiple
of 128, cudnn on a CPU or in float32, a fused path with attention dropout)."""
import functools

import jax
import jax.numpy as jnp
import pytest

from bertjax.models import attention, heads
from bertjax.models.config import FUSED_ATTENTIONS, bert_config

from attention_helpers import CONFIG, _with


def test_splash_refuses_lengths_and_backends_it_cannot_run():
  with pytest.raises(ValueError, match="needs a TPU.*use attention=auto"):
    model = heads.BertForPreTraining(_with(attention="splash", max_position_embeddings=128))
    ids = jnp.ones((1, 128), jnp.int32)
    jax.eval_shape(functools.partial(model.init, deterministic=True), jax.random.key(0),
                   ids, ids, ids)
  with pytest.raises(ValueError, match="multiple of 128, got 100"):
    attention.resolve_attention(_with(attention="splash"), "tpu", seq_len=100)
  x = jnp.zeros((1, 100, 2, 64))
  with pytest.raises(ValueError, match="multiple of 128, got 100"):
    attention.splash_attention(x, x, x, attention.AttentionMask(jnp.ones((1, 100), jnp.int32)))
  with pytest.raises(ValueError, match="cudnn attention needs an NVIDIA GPU"):
    attention.resolve_attention(_with(attention="cudnn", dtype="bfloat16"), "cpu")


BF16 = _with(dtype="bfloat16")


@pytest.mark.parametrize("config,backend,seq_len,expected", [
    (CONFIG, "cpu", 128, "xla"),
    (BF16, "cpu", 128, "xla"),
    (BF16, "gpu", 128, "cudnn"),
    (CONFIG, "gpu", 128, "xla"),  # cuDNN flash attention takes no float32
    (BF16, "gpu", 127, "xla"),  # nor an odd length (its biased training kernel, packed)
    (_with(BF16, hidden_size=2 * 160, num_heads=2), "gpu", 128, "xla"),  # head_dim 160 > 128
    (_with(BF16, hidden_size=2 * 60, num_heads=2), "gpu", 128, "xla"),  # 60: not a multiple of 8
    (BF16, "tpu", 512, "splash"),
    (BF16, "tpu", 100, "xla"),
    (BF16, "tpu", None, "splash"),
    (_with(BF16, attention_dropout_rate=0.1), "gpu", 128, "reference"),
    (_with(BF16, attention_dropout_rate=0.1), "tpu", 128, "reference"),
    (_with(attention_dropout_rate=0.1), "cpu", 128, "reference"),
])
def test_auto_resolution(config, backend, seq_len, expected):
  assert attention.resolve_attention(_with(config, attention="auto"), backend, seq_len) == expected


@pytest.mark.parametrize("path", ["reference", "xla", "cudnn", "splash"])
def test_explicit_paths_resolve_to_themselves(path):
  config = _with(attention=path, dtype="bfloat16")
  backend = {"cudnn": "gpu", "splash": "tpu"}.get(path, "cpu")
  assert attention.resolve_attention(config, backend, 128) == path


def test_fused_attention_with_dropout_and_cudnn_in_float32_are_refused():
  for path in FUSED_ATTENTIONS:
    with pytest.raises(ValueError, match="cannot drop attention probabilities"):
      bert_config("tiny", attention=path, attention_dropout_rate=0.1, dtype="bfloat16")
  with pytest.raises(ValueError, match="'cudnn' needs dtype='bfloat16'"):
    bert_config("tiny", attention="cudnn", attention_dropout_rate=0.0)


def test_auto_is_for_the_platform_of_the_context_meshs_devices():
  """The steps are traced under their mesh (bertjax.training.steps.under_mesh): a mesh of a TPU
  slice's devices, compiled for on a CPU (bertjax.tools.tpu_target), gets the TPU's path."""
  tpu = jax.sharding.AbstractMesh((4,), ("data",), abstract_device=jax.sharding.AbstractDevice(
      device_kind="TPU v5 lite", num_cores=1, platform="tpu"))
  config = _with(BF16, attention="auto")
  with jax.sharding.use_abstract_mesh(tpu):
    assert attention.resolve_attention(config, seq_len=128) == "splash"
    assert attention.resolve_attention(config, "cpu", seq_len=128) == "xla"  # named: as named
  assert attention.resolve_attention(config, seq_len=128) == "xla"  # this CPU
