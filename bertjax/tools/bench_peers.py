"""The benchmark's peers from Hugging Face transformers: `BertForPreTraining` in torch and
`FlaxBertForPreTraining` in Flax, each timing a whole train step on bertjax's batch.

What each peer runs (its optimizer, loss, dtype handling, and how transformers 4.57.6 is set up
for hf_flax) is in `bertjax.tools.bench`'s docstring, the command's --help; each returns the
fields `bench.run` reads: {step_s (back to back, `bench_measure.time_steps`),
peak_memory_bytes, device, platform} (and attention).
"""
from __future__ import annotations

import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.models.config import BertConfig
from bertjax.tools import bench_measure

PEERS = ("bertjax", "torch", "hf_flax")
HF_FLAX_MISSING = (
    "--peers=hf_flax needs transformers' FlaxBertForPreTraining, which the installed transformers "
    "lacks (5.x removed Flax); make a separate virtual environment: python3 -m venv flaxvenv && "
    "flaxvenv/bin/pip install -e . torch==2.13.0 && flaxvenv/bin/pip install transformers==4.57.6 "
    "(without its [flax] extra), and run the benchmark with flaxvenv/bin/python, or drop hf_flax.")


def _hf_config(config: BertConfig):
  """transformers.BertConfig of the same size as `config`, with the paper's dropout 0.1."""
  # Imported here, as below: transformers imports torch, which bertjax's own rows do not need.
  import transformers  # pylint: disable=import-outside-toplevel
  return transformers.BertConfig(
      vocab_size=config.vocab_size, hidden_size=config.hidden_size,
      num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
      intermediate_size=config.intermediate_size,
      max_position_embeddings=config.max_position_embeddings, hidden_act="gelu",
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
      layer_norm_eps=config.layer_norm_eps)


def flax_bert_for_pretraining():
  """transformers' FlaxBertForPreTraining class, or None where the installed transformers has none.

  transformers 5 removed its Flax models; 4.57.6 is the last release with them.
  """
  try:
    from transformers import FlaxBertForPreTraining  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return FlaxBertForPreTraining


def default_peers() -> tuple[str, ...]:
  """Every peer when transformers has FlaxBertForPreTraining, otherwise bertjax and torch."""
  return PEERS if flax_bert_for_pretraining() is not None else ("bertjax", "torch")


def bench_hf_flax(config: BertConfig, batch: dict[str, np.ndarray], dtype: str, steps: int,
                  warmup: int) -> dict[str, Any]:
  """Times a jitted train step of transformers' FlaxBertForPreTraining; returns the same fields."""
  model_class = flax_bert_for_pretraining()
  device = jax.devices()[0]
  memory = bench_measure.CpuPeakMemory()
  memory.start()
  # Parameters stay float32; `dtype` is the compute dtype, as in bertjax.
  model = model_class(_hf_config(config), seed=0, dtype=jnp.dtype(dtype))
  tx = optax.chain(optax.clip_by_global_norm(1.0),
                   optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01))
  params = model.params
  opt_state = tx.init(params)
  # MLM labels [batch, seq]: the masked token at each masked position, 0 (weight 0) elsewhere
  # (and at the [CLS] that a real row's empty prediction slots point to).
  labels = np.zeros(batch["input_ids"].shape, np.int32)
  weights = np.zeros(batch["input_ids"].shape, np.float32)
  np.put_along_axis(labels, batch["masked_lm_positions"], batch["masked_lm_ids"], axis=1)
  np.put_along_axis(weights, batch["masked_lm_positions"], batch["masked_lm_weights"], axis=1)
  inputs = jax.device_put(dict(
      input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
      attention_mask=batch["input_mask"], labels=labels, weights=weights,
      next_sentence_label=batch["next_sentence_label"]))

  def loss_fn(params, inputs, dropout_rng):
    out = model(inputs["input_ids"], attention_mask=inputs["attention_mask"],
                token_type_ids=inputs["token_type_ids"], params=params,
                dropout_rng=dropout_rng, train=True)
    # prediction_logits [batch, seq, vocab]: cross-entropy at every position in float32, averaged
    # over the masked ones (as the torch peer's loss with labels -100 elsewhere).
    mlm = optax.softmax_cross_entropy_with_integer_labels(
        out.prediction_logits.astype(jnp.float32), inputs["labels"])
    mlm = jnp.sum(mlm * inputs["weights"]) / jnp.sum(inputs["weights"])
    nsp = optax.softmax_cross_entropy_with_integer_labels(
        out.seq_relationship_logits.astype(jnp.float32), inputs["next_sentence_label"])
    return mlm + jnp.mean(nsp)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def train_step(params, opt_state, rng, inputs):
    rng, dropout_rng = jax.random.split(rng)
    loss, grads = jax.value_and_grad(loss_fn)(params, inputs, dropout_rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, rng, loss

  rng = jax.random.key(0)

  def step():
    nonlocal params, opt_state, rng
    params, opt_state, rng, _ = train_step(params, opt_state, rng, inputs)

  step_s = bench_measure.time_steps(step, lambda: jax.block_until_ready((params, opt_state)),
                                    steps, warmup, memory.reset_peak)
  if device.platform == "cpu":
    peak = memory.delta()
  else:
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use", 0)
  del params, opt_state
  return dict(step_s=step_s, peak_memory_bytes=int(peak), device=device.device_kind,
              platform=device.platform)


def bench_torch(config: BertConfig, batch: dict[str, np.ndarray], dtype: str, steps: int,
                warmup: int) -> dict[str, Any]:
  """Times a Hugging Face BertForPreTraining train step; returns the same fields."""
  # Imported here: torch stays out of the benchmark's other peers.
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(0)
  cuda = torch.cuda.is_available()
  device = torch.device("cuda" if cuda else "cpu")
  memory = bench_measure.CpuPeakMemory()
  if cuda:
    torch.set_float32_matmul_precision("high")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
  memory.start()
  hf_config = _hf_config(config)
  model = transformers.BertForPreTraining(hf_config).to(device)
  model.train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6,
                                weight_decay=0.01)
  # MLM labels [batch, seq]: the masked token at each masked position, -100 (ignored) elsewhere
  # (and at the [CLS] that a real row's empty prediction slots point to).
  labels = np.full(batch["input_ids"].shape, -100, np.int64)
  np.put_along_axis(labels, batch["masked_lm_positions"],
                    np.where(batch["masked_lm_weights"] > 0, batch["masked_lm_ids"], -100), axis=1)
  inputs = {k: torch.from_numpy(np.asarray(v, np.int64)).to(device) for k, v in dict(
      input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
      attention_mask=batch["input_mask"], labels=labels,
      next_sentence_label=batch["next_sentence_label"]).items()}
  autocast_dtype = torch.bfloat16 if dtype == "bfloat16" else None

  def step():
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
      loss = model(**inputs).loss  # MLM mean over labelled positions + NSP mean
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

  # On a GPU the step queues its kernels; on CPU it has finished when it returns.
  step_s = bench_measure.time_steps(step, torch.cuda.synchronize if cuda else lambda: None,
                                    steps, warmup, memory.reset_peak if not cuda else lambda: None)
  peak = torch.cuda.max_memory_allocated() if cuda else memory.delta()
  name = torch.cuda.get_device_name() if cuda else "cpu"
  attention = hf_config._attn_implementation  # pylint: disable=protected-access
  del model, optimizer
  if cuda:
    torch.cuda.empty_cache()
  return dict(step_s=step_s, peak_memory_bytes=int(peak), device=name,
              platform=device.type, attention=attention)
