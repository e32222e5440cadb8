"""Benchmark of the pretraining train step: bertjax against Hugging Face transformers.

  python -m bertjax.tools.bench --size=tiny,mini,base --batch_size=32 --seq_len=128 \
      [--max_predictions=20] [--steps=20] [--warmup=3] [--dtype=float32|bfloat16] \
      [--peers=bertjax,torch,hf_flax] [--vocab_size=30522] [--json=OUT.json] \
      [--attention=auto|reference|xla|cudnn|splash] [--packing=K] [--remat=none|full|dots] \
      [--optimizer=adamw|lamb] [--memory_only]

bertjax's own choices: `--attention` (a fused path runs without attention dropout, which fused
kernels cannot apply; `auto` and `reference` keep the paper's 0.1, so `auto` is the reference
einsum), `--packing=K` (each row holds K sequences of seq_len / K tokens, with their sequence
ids, positions and one [CLS] and NSP label each, and the same max_predictions per row: the cost
of the block-diagonal mask; the gain of packing, fewer padding tokens, depends on the data and
is reported by `python -m bertjax.tools.data_benchmark`), `--remat` and `--optimizer`. Every bertjax
row also gives the compiled memory per device of its train step
(`jit(step).lower(...).compile().memory_analysis()`: arguments + outputs - donated + temporaries,
XLA's own plan, for any shape on any backend); `--memory_only` compiles without running, so the
memory of BERT-large at seq 512 can be read on a laptop.

The peers run on the same machine, in one process, on the same random batch (every token real,
`max_predictions` masked positions per example), and do the whole step: forward with dropout 0.1,
MLM + NSP loss, backward, clipping to global norm 1.0 and an AdamW update.

- bertjax: the trainer's own step, `bertjax.training.train.build(config, task).train_step(state, batch)`
  (jitted, donated state) with configs/tiny.py's optimizer fields, the model of `--size`.
- torch: `transformers.BertForPreTraining` in train mode, `torch.optim.AdamW(lr=1e-4,
  betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)`, loss = MLM (labels -100 off the masked
  positions, as HF does) + NSP, `clip_grad_norm_(1.0)`, step, zero_grad. bfloat16 runs under
  `torch.autocast` with float32 parameters, as bertjax keeps float32 parameters and computes in
  bfloat16. On a GPU, float32 matmuls may use TF32 in both (JAX's default precision; torch is set
  to `set_float32_matmul_precision("high")` to match).
- hf_flax: transformers' `FlaxBertForPreTraining` (Flax linen), called with `train=True` and a
  dropout rng; loss = MLM cross-entropy in float32 at every position, averaged over the masked
  ones (as the torch peer's labels -100 do) + NSP; `optax.chain(clip_by_global_norm(1.0),
  adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01))`; one `jax.jit` step with donated
  params and optimizer state. bfloat16 is its `dtype=jnp.bfloat16` (compute dtype; parameters
  stay float32). transformers 5 removed Flax; 4.57.6, the last release with it, runs on this jax
  and flax when installed without its [flax] extra, but in a virtual environment of its own:
  `pip install -e . torch==2.13.0`, then `pip install transformers==4.57.6` (pip moves tokenizers
  to 0.22.x and huggingface_hub below 1.0 for it, and the [test] extra's transformers 5 tests do
  not run there). The default --peers include hf_flax only where FlaxBertForPreTraining imports.

What differs by design: HF, in torch and in Flax, scores the vocabulary at every position
(logits [batch, seq, vocab]) and then drops the ~85% of them without a label; bertjax gathers the
masked positions first, as the original BERT does. That saving is part of what is compared.

Timing: each step is timed alone, blocked to completion (`jax.block_until_ready` on the new state
and metrics; `torch.cuda.synchronize()` on a GPU), after `--warmup` untimed steps (which include
compilation); the step time reported is the median of `--steps` steps.

Model FLOPs per step (`bertjax.training.flops.model_flops`, the formula the trainer logs too) are the
same for every peer, so the ratio is of useful work; they count the MLM head at the gathered
positions only. HF's full-sequence logits do 6 * B * (S - P) * H * (V + H) more, which this count
leaves out. MFU = model FLOPs / step time / the device's peak (dense, for the dtype), where known.

Peak memory: on a GPU, jax's `peak_bytes_in_use` of the device and
`torch.cuda.max_memory_allocated` (reset before the peer). jax's figure cannot be reset: it is the
high-water mark of the process so far, compilation scratch included, so the second JAX peer of a
size (hf_flax after bertjax, or any JAX peer after a larger size) reports the larger of its own
peak and the earlier ones (run `--peers=hf_flax` with one --size for its own figure). On
CPU, the peak resident memory of the process during the timed steps less its resident memory
before the peer was set up (Linux: VmHWM, reset after the warmup, so the compiler's transient
memory is left out; elsewhere the growth of ru_maxrss). The first JAX peer in the process also
carries what the XLA runtime and compiler keep resident (some hundreds of MiB on CPU at BERT-tiny),
so to compare the two JAX peers' CPU memory, run each alone.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import resource
import statistics
import sys
import time
from typing import Any, Callable, Sequence

# jax must not take 75% of a GPU's memory up front: the torch peer shares the device.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from bertjax.errors import UserError  # pylint: disable=wrong-import-position
from bertjax.training.flops import model_flops, peak_flops  # pylint: disable=wrong-import-position
from bertjax.models.attention import resolve_attention  # pylint: disable=wrong-import-position
from bertjax.models.config import (  # pylint: disable=wrong-import-position
    ATTENTIONS, REMATS, SIZES, BertConfig, bert_config)

PEERS = ("bertjax", "torch", "hf_flax")
DTYPES = ("float32", "bfloat16")
HF_LOGITS_NOTE = ("HF (torch and Flax) computes MLM logits at every position; bertjax gathers the "
                  "masked ones first (as original BERT). model_flops counts the gathered "
                  "positions for every peer.")
HF_FLAX_MISSING = (
    "--peers=hf_flax needs transformers' FlaxBertForPreTraining, which the installed transformers "
    "lacks (5.x removed Flax); make a separate virtual environment: python3 -m venv flaxvenv && "
    "flaxvenv/bin/pip install -e . torch==2.13.0 && flaxvenv/bin/pip install transformers==4.57.6 "
    "(without its [flax] extra), and run the benchmark with flaxvenv/bin/python, or drop hf_flax.")


def make_batch(vocab_size: int, batch_size: int, seq_len: int, max_predictions: int,
               seed: int = 0, packing: int = 0) -> dict[str, np.ndarray]:
  """A random pretraining batch with the trainer's keys; every token real, all predictions used.

  Args:
    packing: 0 for one sequence a row; K >= 1 packs K sequences of seq_len // K tokens into each
      row (the last takes the remainder), as `bertjax.data.pretraining.loader` lays packed rows out.
  Returns:
    input_ids, segment_ids, input_mask [batch, seq] int32; masked_lm_positions, masked_lm_ids
    [batch, predictions] int32 and masked_lm_weights float32 (distinct sorted positions, none
    on a [CLS]); next_sentence_label and example_weight (ones) [batch] int32 / float32, or
    [batch, K] when packed, which adds position_ids, sequence_ids [batch, seq] and
    cls_positions [batch, K].
  """
  rng = np.random.default_rng(seed)
  k = max(packing, 1)
  starts = np.arange(k) * (seq_len // k)  # each sequence's [CLS]
  sequence = np.searchsorted(starts, np.arange(seq_len), side="right")  # [seq] 1..K
  position = np.arange(seq_len) - starts[sequence - 1]
  maskable = np.setdiff1d(np.arange(seq_len), starts)
  positions = np.sort(np.stack([rng.choice(maskable, max_predictions, replace=False)
                                for _ in range(batch_size)]), axis=1)
  segment_ids = np.zeros((batch_size, seq_len), np.int32)
  segment_ids[:, (position >= (seq_len // k) // 2)] = 1
  batch = dict(
      input_ids=rng.integers(5, vocab_size, (batch_size, seq_len)).astype(np.int32),
      segment_ids=segment_ids,
      input_mask=np.ones((batch_size, seq_len), np.int32),
      masked_lm_positions=positions.astype(np.int32),
      masked_lm_ids=rng.integers(5, vocab_size, (batch_size, max_predictions)).astype(np.int32),
      masked_lm_weights=np.ones((batch_size, max_predictions), np.float32),
      next_sentence_label=rng.integers(0, 2, (batch_size, k)[:1 + bool(packing)]).astype(
          np.int32),
      example_weight=np.ones((batch_size, k)[:1 + bool(packing)], np.float32))
  if packing:
    tile = lambda row: np.tile(row.astype(np.int32), (batch_size, 1))
    batch.update(position_ids=tile(position), sequence_ids=tile(sequence),
                 cls_positions=tile(starts))
  return batch


class _CpuPeakMemory:
  """Peak RSS in bytes since the last `reset_peak()`, less the RSS at `start()`.

  On Linux the peak (VmHWM) can be reset, so `reset_peak()` after the warmup steps leaves the
  compiler's transient memory out; elsewhere it is the growth of the lifetime peak (ru_maxrss).
  """

  def start(self) -> None:
    self._exact = self.reset_peak()
    self._base = (self._status("VmRSS") if self._exact
                  else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)

  @staticmethod
  def reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux: "5" to clear_refs); False where it cannot."""
    try:
      with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
      return True
    except OSError:
      return False

  @staticmethod
  def _status(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")

  def delta(self) -> int:
    peak = (self._status("VmHWM") if self._exact
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return max(peak - self._base, 0)


def _time_steps(step: Callable[[], None], steps: int, warmup: int,
                after_warmup: Callable[[], Any]) -> list[float]:
  """Seconds of each of `steps` calls of `step` (which blocks until done), after `warmup`."""
  for _ in range(warmup):
    step()
  after_warmup()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
  return times


def _bertjax_config(size: str, batch_size: int, seq_len: int, max_predictions: int,
                    dtype: str, steps: int, warmup: int, options: "BertjaxOptions"):
  """configs/tiny.py with the benchmark's shapes, the paper's dropout (none on the attention
  probabilities for a fused path) and a flat learning rate."""
  from bertjax.configs import tiny  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.model.size = size
  config.model.dtype = dtype
  config.model.dropout_rate = 0.1
  config.model.attention = options.attention
  config.model.attention_dropout_rate = 0.1 if options.attention in ("auto", "reference") else 0.0
  config.model.remat = options.remat
  config.train.optimizer = options.optimizer
  config.model.max_position_embeddings = max(512, seq_len)
  config.data.max_seq_length = seq_len
  config.data.max_predictions_per_seq = max_predictions
  config.train.batch_size = batch_size
  config.train.eval_batch_size = batch_size
  config.train.num_train_steps = steps + warmup + 1
  config.train.warmup_steps = 0
  config.train.learning_rate = 1e-4
  return config


@dataclasses.dataclass(frozen=True)
class BertjaxOptions:
  """bertjax's own choices for its step (the flags of the same names)."""
  attention: str = "auto"
  packing: int = 0
  remat: str = "none"
  optimizer: str = "adamw"
  memory_only: bool = False


def compiled_memory_bytes(compiled) -> dict[str, int]:
  """What XLA plans to hold per device for a compiled step: {arguments, outputs, temporaries,
  total}, total = arguments + outputs - the donated (aliased) buffers + temporaries.

  XLA's CPU compiler does not keep remat's savings in its plan (its schedule computes the
  rematerialised forward early: a stack of checkpointed tanh layers plans more temporaries than
  the plain one), so on CPU the remat rows differ in `saved_activation_bytes`, not here."""
  analysis = compiled.memory_analysis()
  parts = dict(arguments=analysis.argument_size_in_bytes, outputs=analysis.output_size_in_bytes,
               temporaries=analysis.temp_size_in_bytes)
  parts["total"] = (parts["arguments"] + parts["outputs"] - analysis.alias_size_in_bytes
                    + parts["temporaries"])
  return {k: int(v) for k, v in parts.items()}


def saved_activation_bytes(loss: Callable[..., Any], *args, seq_len: int) -> dict[str, int]:
  """Bytes the backward pass of `loss` keeps from its forward pass: the residuals of
  `jax.vjp(loss, *args)`, less those that are the arguments themselves (the parameters, the
  batch). Traced only (args may be ShapeDtypeStructs), so it holds for any backend; it is what
  remat trades for recomputation.

  Returns:
    {"activations": all of them, "attention_matrices": those shaped [..., seq_len, seq_len]
    (scores, probabilities, dropout masks), which a fused attention kernel (cuDNN, splash) does
    not keep: it saves [batch, heads, seq] softmax statistics instead}.
  """
  from jax.extend import core  # pylint: disable=import-outside-toplevel
  closed, shapes = jax.make_jaxpr(lambda *a: jax.vjp(loss, *a), return_shape=True)(*args)
  jaxpr = closed.jaxpr
  residuals = jaxpr.outvars[len(jaxpr.outvars) - len(jax.tree.leaves(shapes[1])):]
  arguments = set(jaxpr.invars)
  kept = [v.aval for v in {v for v in residuals
                           if not isinstance(v, core.Literal) and v not in arguments}]
  size = lambda aval: aval.size * aval.dtype.itemsize
  return dict(activations=int(sum(size(a) for a in kept)),
              attention_matrices=int(sum(size(a) for a in kept
                                         if a.shape[-2:] == (seq_len, seq_len))))


def bench_bertjax(size: str, batch: dict[str, np.ndarray], vocab_size: int, dtype: str,
                  steps: int, warmup: int, options: BertjaxOptions = BertjaxOptions()
                  ) -> dict[str, Any]:
  """Times bertjax's jitted train step; returns {step_times_s, peak_memory_bytes, device,
  platform, attention (the path it resolved to), compiled_memory (compiled_memory_bytes)}.
  With options.memory_only the step is compiled, not run, and step_times_s is empty."""
  # Imported here: the trainer pulls in orbax and tensorboardX, not needed for --peers=torch.
  from bertjax.training import parallel, train  # pylint: disable=import-outside-toplevel
  from bertjax.models import heads  # pylint: disable=import-outside-toplevel
  from bertjax.tasks import pretraining  # pylint: disable=import-outside-toplevel
  batch_size, seq_len = batch["input_ids"].shape
  max_predictions = batch["masked_lm_positions"].shape[1]
  config = _bertjax_config(size, batch_size, seq_len, max_predictions, dtype, steps, warmup,
                           options)
  device = jax.devices()[0]
  on_cpu = device.platform == "cpu"
  memory = _CpuPeakMemory()
  memory.start()
  model_config = pretraining.model_config(config, vocab_size)
  model = heads.BertForPreTraining(model_config)
  task = train.Task(model=model, terms=pretraining.make_terms(5),
                    batches=train.Batches(train=lambda position: iter(())))
  setup = train.build(config, task, batch)
  batch_spec = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=parallel.batch_sharding(setup.mesh)),
      dict(batch))
  compiled = setup.train_step.lower(setup.abstract_state, batch_spec).compile()

  def loss(params, batch):
    outputs = heads.apply_to_batch(model, params, batch, deterministic=False,
                                   rngs={"dropout": jax.random.PRNGKey(0)})
    return sum(jax.numpy.sum(values * weights) / jax.numpy.maximum(jax.numpy.sum(weights), 1)
               for name, (values, weights) in task.terms(outputs, batch).items()
               if train.is_loss(name))

  planned = dict(compiled_memory_bytes(compiled), **saved_activation_bytes(
      loss, setup.abstract_state["params"], batch_spec, seq_len=seq_len))
  result = dict(device=device.device_kind, platform=device.platform,
                attention=resolve_attention(model_config, seq_len=seq_len),
                compiled_memory=planned)
  if options.memory_only:
    return dict(result, step_times_s=[], peak_memory_bytes=0)
  state = setup.init_state()
  device_batch = parallel.global_batch(batch, setup.mesh)

  def step():
    nonlocal state
    state, metrics = compiled(state, device_batch)
    jax.block_until_ready((state, metrics))

  times = _time_steps(step, steps, warmup, memory.reset_peak)
  if on_cpu:
    peak = memory.delta()
  else:
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use", 0)
  del state
  return dict(result, step_times_s=times, peak_memory_bytes=int(peak))


def _hf_config(config: BertConfig):
  """transformers.BertConfig of the same size as `config`, with the paper's dropout 0.1."""
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
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  model_class = flax_bert_for_pretraining()
  device = jax.devices()[0]
  memory = _CpuPeakMemory()
  memory.start()
  # Parameters stay float32; `dtype` is the compute dtype, as in bertjax.
  model = model_class(_hf_config(config), seed=0, dtype=jnp.dtype(dtype))
  tx = optax.chain(optax.clip_by_global_norm(1.0),
                   optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01))
  params = model.params
  opt_state = tx.init(params)
  # MLM labels [batch, seq]: the masked token at each masked position, 0 (weight 0) elsewhere.
  labels = np.zeros(batch["input_ids"].shape, np.int32)
  weights = np.zeros(batch["input_ids"].shape, np.float32)
  np.put_along_axis(labels, batch["masked_lm_positions"], batch["masked_lm_ids"], axis=1)
  np.put_along_axis(weights, batch["masked_lm_positions"], 1.0, axis=1)
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
    params, opt_state, rng, loss = train_step(params, opt_state, rng, inputs)
    jax.block_until_ready((params, opt_state, loss))

  times = _time_steps(step, steps, warmup, memory.reset_peak)
  if device.platform == "cpu":
    peak = memory.delta()
  else:
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use", 0)
  del params, opt_state
  return dict(step_times_s=times, peak_memory_bytes=int(peak), device=device.device_kind,
              platform=device.platform)


def bench_torch(config: BertConfig, batch: dict[str, np.ndarray], dtype: str, steps: int,
                warmup: int) -> dict[str, Any]:
  """Times a Hugging Face BertForPreTraining train step; returns the same fields."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(0)
  cuda = torch.cuda.is_available()
  device = torch.device("cuda" if cuda else "cpu")
  memory = _CpuPeakMemory()
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
  # MLM labels [batch, seq]: the masked token at each masked position, -100 (ignored) elsewhere.
  labels = np.full(batch["input_ids"].shape, -100, np.int64)
  np.put_along_axis(labels, batch["masked_lm_positions"], batch["masked_lm_ids"], axis=1)
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
    if cuda:
      torch.cuda.synchronize()

  times = _time_steps(step, steps, warmup, memory.reset_peak if not cuda else lambda: None)
  peak = torch.cuda.max_memory_allocated() if cuda else memory.delta()
  name = torch.cuda.get_device_name() if cuda else "cpu"
  attention = hf_config._attn_implementation  # pylint: disable=protected-access
  del model, optimizer
  if cuda:
    torch.cuda.empty_cache()
  return dict(step_times_s=times, peak_memory_bytes=int(peak), device=name,
              platform=device.type, attention=attention)


def _check_options(options: BertjaxOptions, peers: Sequence[str], seq_len: int,
                   max_predictions: int) -> None:
  """Raises UserError naming the first of bertjax's own flags that cannot work."""
  from bertjax.training import optim  # pylint: disable=import-outside-toplevel
  for flag, value, allowed in (("attention", options.attention, ATTENTIONS),
                               ("remat", options.remat, REMATS),
                               ("optimizer", options.optimizer, optim.OPTIMIZERS)):
    if value not in allowed:
      raise UserError(f"unknown --{flag} {value!r}; use one of {', '.join(allowed)}.")
  if (options.packing or options.memory_only) and list(peers) != ["bertjax"]:
    raise UserError("--packing and --memory_only are bertjax's alone (transformers has no "
                    "packing, and its memory is measured by running); add --peers=bertjax.")
  if options.packing < 0 or options.packing and seq_len // options.packing < 2:
    raise UserError(f"--packing={options.packing} leaves fewer than 2 tokens a sequence at "
                    f"--seq_len={seq_len}; use 0 (no packing) or fewer sequences a row.")
  if options.packing and max_predictions > seq_len - options.packing:
    raise UserError(f"--max_predictions={max_predictions} is more than the {seq_len} - "
                    f"{options.packing} tokens that are not [CLS]; lower it.")


def _check(sizes: Sequence[str], peers: Sequence[str], dtype: str, **positive: int) -> None:
  """Raises UserError naming the first argument that cannot work."""
  for size in sizes:
    if size not in SIZES:
      raise UserError(f"unknown --size {size!r}; use one or more of {','.join(SIZES)} "
                      "(comma-separated).")
  if not sizes:
    raise UserError(f"--size is empty; give one or more of {','.join(SIZES)}.")
  for peer in peers:
    if peer not in PEERS:
      raise UserError(f"unknown --peers entry {peer!r}; use one or more of {','.join(PEERS)}.")
  if not peers:
    raise UserError(f"--peers is empty; give one or more of {','.join(PEERS)}.")
  if "hf_flax" in peers and flax_bert_for_pretraining() is None:
    raise UserError(HF_FLAX_MISSING)
  if dtype not in DTYPES:
    raise UserError(f"unknown --dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
  for name, value in positive.items():
    if value < 1:
      raise UserError(f"--{name}={value}; use 1 or more.")
  if positive["max_predictions"] >= positive["seq_len"]:
    raise UserError(f"--max_predictions={positive['max_predictions']} must be below "
                    f"--seq_len={positive['seq_len']} (position 0 is [CLS]); lower it.")
  if positive["vocab_size"] < 6:
    raise UserError(f"--vocab_size={positive['vocab_size']}; use 6 or more (5 special ids).")


def run(sizes: Sequence[str] = ("tiny",), peers: Sequence[str] | None = None, batch_size: int = 32,
        seq_len: int = 128, max_predictions: int = 20, steps: int = 20, warmup: int = 3,
        dtype: str = "float32", vocab_size: int = 30522,
        options: BertjaxOptions = BertjaxOptions()) -> list[dict[str, Any]]:
  """Benchmarks each peer (default: `default_peers()`) at each size; one row per (size, peer).

  Returns:
    rows with size, peer, device, platform, dtype, batch_size, seq_len, max_predictions, steps,
    step_ms (median), step_ms_min, tokens_per_s, examples_per_s, peak_memory_bytes, model_flops,
    achieved_flops_per_s, mfu (None where the peak is unknown), and on bertjax rows, for each
    other peer of the same size, speedup_vs_<peer> (bertjax tokens/s / that peer's tokens/s),
    plus attention (the path used), packing, remat, optimizer and compiled_memory (bytes per
    device: arguments, outputs, temporaries, total). With options.memory_only the timing
    fields are None.
  """
  peers = default_peers() if peers is None else peers
  _check(sizes, peers, dtype, batch_size=batch_size, seq_len=seq_len,
         max_predictions=max_predictions, steps=steps, warmup=warmup, vocab_size=vocab_size)
  _check_options(options, peers, seq_len, max_predictions)
  rows = []
  for size in sizes:
    config = bert_config(size, vocab_size=vocab_size, dtype=dtype,
                         max_position_embeddings=max(512, seq_len))
    batch = make_batch(vocab_size, batch_size, seq_len, max_predictions, packing=options.packing)
    flops = model_flops(config, batch_size, seq_len, max_predictions)
    by_peer = {}
    for peer in peers:
      if peer == "bertjax":
        result = bench_bertjax(size, batch, vocab_size, dtype, steps, warmup, options)
        if options.memory_only:
          rows.append(dict(size=size, peer=peer, device=result["device"],
                           platform=result["platform"], dtype=dtype, batch_size=batch_size,
                           seq_len=seq_len, max_predictions=max_predictions, steps=0,
                           step_ms=None, tokens_per_s=None, mfu=None, model_flops=flops,
                           peak_memory_bytes=None, **_bertjax_fields(result, options)))
          continue
      elif peer == "torch":
        result = bench_torch(config, batch, dtype, steps, warmup)
      else:
        result = bench_hf_flax(config, batch, dtype, steps, warmup)
      step_s = statistics.median(result["step_times_s"])
      peak = peak_flops(result["device"], dtype) if result["platform"] != "cpu" else None
      row = dict(size=size, peer=peer, device=result["device"], platform=result["platform"],
                 dtype=dtype, batch_size=batch_size, seq_len=seq_len,
                 max_predictions=max_predictions, steps=steps,
                 step_ms=1e3 * step_s, step_ms_min=1e3 * min(result["step_times_s"]),
                 tokens_per_s=batch_size * seq_len / step_s, examples_per_s=batch_size / step_s,
                 peak_memory_bytes=result["peak_memory_bytes"], model_flops=flops,
                 achieved_flops_per_s=flops / step_s,
                 mfu=None if peak is None else flops / step_s / peak)
      if "attention" in result:
        row["attention"] = result["attention"]
      if peer == "bertjax":
        row.update(_bertjax_fields(result, options))
      by_peer[peer] = row
      rows.append(row)
    for peer, row in by_peer.items():
      if "bertjax" in by_peer and peer != "bertjax":
        by_peer["bertjax"][f"speedup_vs_{peer}"] = (by_peer["bertjax"]["tokens_per_s"]
                                                    / row["tokens_per_s"])
  return rows


def _bertjax_fields(result: dict[str, Any], options: BertjaxOptions) -> dict[str, Any]:
  return dict(attention=result["attention"], packing=options.packing, remat=options.remat,
              optimizer=options.optimizer, compiled_memory=result["compiled_memory"])


def format_memory_table(rows: Sequence[dict[str, Any]]) -> str:
  """The compiled memory per device of bertjax rows (--memory_only) as a text table."""
  header = (f"{'size':<7} {'dtype':<9} {'batch':>5} {'seq':>5} {'attention':<10} {'remat':<6} "
            f"{'optimizer':<9} {'args GiB':>9} {'temp GiB':>9} {'total GiB':>10} "
            f"{'activations GiB':>16} {'of which seq x seq':>19}")
  lines = [header, "-" * len(header)]
  for r in rows:
    m = {k: v / 2**30 for k, v in r["compiled_memory"].items()}
    lines.append(f"{r['size']:<7} {r['dtype']:<9} {r['batch_size']:>5} {r['seq_len']:>5} "
                 f"{r['attention']:<10} {r['remat']:<6} {r['optimizer']:<9} "
                 f"{m['arguments']:>9.2f} {m['temporaries']:>9.2f} {m['total']:>10.2f} "
                 f"{m['activations']:>16.2f} {m['attention_matrices']:>19.2f}")
  lines.append(f"per device, as XLA compiled the train step for {rows[0]['platform']} "
               "(arguments: parameters, optimizer state and batch; total = arguments + outputs "
               "- donated + temporaries); activations: what the backward pass keeps from the "
               "forward (jax.vjp's residuals), which remat trades for recomputation; of which "
               "seq x seq: the attention matrices among them, which a fused kernel (cuDNN, "
               "splash) does not keep." if rows else "")
  return "\n".join(lines)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
  """The rows as a fixed-width text table, then the notes.

  The ratio columns (`jax/torch`, `jax/hf_flax`: bertjax tokens/s over the peer's) are those of
  the peers present, on the bertjax rows.
  """
  others = [p for p in PEERS if p != "bertjax" and any(r["peer"] == p for r in rows)]
  header = (f"{'size':<7} {'peer':<8} {'device':<22} {'dtype':<9} {'step ms':>9} "
            f"{'tokens/s':>11} {'ex/s':>9} {'peak MiB':>9} {'GFLOP/step':>11} {'MFU':>7}"
            + "".join(f" {'jax/' + p:>11}" for p in others))
  lines = [header, "-" * len(header)]
  for r in rows:
    if r["step_ms"] is None:  # --memory_only: see format_memory_table
      continue
    mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    ratios = [f"{r[f'speedup_vs_{p}']:.2f}x" if f"speedup_vs_{p}" in r else "" for p in others]
    lines.append(
        f"{r['size']:<7} {r['peer']:<8} {r['device'][:22]:<22} {r['dtype']:<9} "
        f"{r['step_ms']:>9.2f} {r['tokens_per_s']:>11.0f} {r['examples_per_s']:>9.1f} "
        f"{r['peak_memory_bytes'] / 2**20:>9.1f} {r['model_flops'] / 1e9:>11.3f} {mfu:>7}"
        + "".join(f" {ratio:>11}" for ratio in ratios))
  if rows:
    r = rows[0]
    lines.append(f"batch {r['batch_size']} x seq {r['seq_len']}, {r['max_predictions']} "
                 f"predictions/example; median of {r['steps']} steps, each blocked to completion.")
  for r in rows:
    if "compiled_memory" in r:
      lines.append(f"bertjax {r['size']}: attention {r['attention']}, packing {r['packing']}, "
                   f"remat {r['remat']}, {r['optimizer']}; compiled memory per device "
                   f"{r['compiled_memory']['total'] / 2**30:.2f} GiB.")
  lines.append(HF_LOGITS_NOTE)
  if len({r["platform"] for r in rows}) > 1:
    lines.append("WARNING: the peers ran on different platforms; the ratio compares devices.")
  return "\n".join(lines)


def _csv(text: str) -> list[str]:
  return [part.strip() for part in text.split(",") if part.strip()]


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.bench", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--size", default="tiny", help="comma-separated BERT sizes")
  parser.add_argument("--peers", default=None, help=(
      "comma-separated, of bertjax, torch, hf_flax (default: all three where transformers has "
      "FlaxBertForPreTraining, otherwise bertjax,torch)"))
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--max_predictions", type=int, default=20)
  parser.add_argument("--steps", type=int, default=20, help="timed steps")
  parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation)")
  parser.add_argument("--dtype", default="float32", help="compute dtype: float32 or bfloat16")
  parser.add_argument("--vocab_size", type=int, default=30522)
  parser.add_argument("--json", default="", help="also write the rows to this JSON file")
  parser.add_argument("--attention", default="auto", help=(
      "bertjax's attention: auto, reference, xla, cudnn, splash (fused ones without attention "
      "dropout)"))
  parser.add_argument("--packing", type=int, default=0,
                      help="bertjax only: sequences packed into each row (0 = none)")
  parser.add_argument("--remat", default="none", help="bertjax's remat: none, full, dots")
  parser.add_argument("--optimizer", default="adamw", help="bertjax's optimizer: adamw, lamb")
  parser.add_argument("--memory_only", action="store_true",
                      help="bertjax only: compile the step and print its memory, run nothing")
  return parser


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
  """Parses the flags, runs the benchmark, prints the table (and writes --json)."""
  args = _parser().parse_args(argv)
  options = BertjaxOptions(attention=args.attention, packing=args.packing, remat=args.remat,
                           optimizer=args.optimizer, memory_only=args.memory_only)
  try:
    rows = run(sizes=_csv(args.size), peers=None if args.peers is None else _csv(args.peers),
               batch_size=args.batch_size,
               seq_len=args.seq_len, max_predictions=args.max_predictions, steps=args.steps,
               warmup=args.warmup, dtype=args.dtype, vocab_size=args.vocab_size,
               options=options)
  except UserError as e:
    print(f"bertjax.tools.bench: error: {e}", file=sys.stderr)
    sys.exit(2)
  print(format_memory_table(rows) if args.memory_only else format_table(rows))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"rows": rows, "note": HF_LOGITS_NOTE}, f, indent=2)
      f.write("\n")
  return rows


if __name__ == "__main__":
  main()
