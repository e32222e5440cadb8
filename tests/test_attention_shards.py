"""The fused attention kernels run per shard on a mesh (bertjax.models.attention.per_shard),
checked on 4 CPU devices in a subprocess (this file run as a script, which prints one line
'RESULT {json}'; the tests read it).

- splash (through `attention.attend`, the kernel in the Pallas interpreter) on data=2 x tensor=2
  and on data=4, padded and packed: its outputs and gradients are the dense reference's at real
  tokens, and each device's kernel is made for its own rows and heads;
- the compiled program of those outputs and gradients has no collective at all, while the same
  kernel called without shard_map all-gathers its inputs;
- lowered for a TPU (no TPU needed to lower), each Mosaic kernel's operands are the shard's
  [batch / data, heads / tensor, seq, head_dim], while jax refuses to lower the kernel called
  without shard_map ("Mosaic kernels cannot be automatically partitioned");
- `steps.build` traces the train step under its mesh, so the model's cudnn path (run by jax's
  'xla' implementation, `attention_helpers.cudnn_run_by_xla`) runs per shard in every layer and
  the step equals that of the plain 'xla' path on the same mesh.
"""
import contextlib
import dataclasses
import functools
import json
import os
import re
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import attention
from bertjax.models.config import BertConfig

from conftest import cpu_env
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHES = {"data2_tensor2": (2, 1, 2), "data4": (4, 1, 1)}  # (data, fsdp, tensor)
BATCH, SEQ, HEADS, HEAD_DIM = 8, 128, 2, 16
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
CONFIG = BertConfig(vocab_size=32, hidden_size=HEADS * HEAD_DIM, num_layers=1, num_heads=HEADS,
                    intermediate_size=64, max_position_embeddings=SEQ, dropout_rate=0.0,
                    attention_dropout_rate=0.0, attention="splash")


# ---- the subprocess: 4 CPU devices -------------------------------------------------------------


def _masks() -> dict[str, attention.AttentionMask]:
  """A padded batch (rows of 100, 128, 37 and 1 real tokens, twice) and a packed one."""
  lengths = np.array([100, 128, 37, 1] * 2)
  input_mask = (np.arange(SEQ) < lengths[:, None]).astype(np.int32)
  ids = np.zeros((BATCH // 2, SEQ), np.int32)
  ids[0, :50], ids[0, 50:120], ids[1], ids[2, :9], ids[2, 9:20], ids[3, :64] = 1, 2, 1, 1, 2, 1
  ids = np.concatenate([ids, ids])
  return {"padded": attention.AttentionMask(jnp.asarray(input_mask)),
          "packed": attention.AttentionMask(jnp.asarray(ids > 0, jnp.int32), jnp.asarray(ids))}


def _reference(q, k, v, mask):
  """Softmax attention by the dense mask: [batch, seq, heads, head_dim] q, k, v -> the same."""
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  probs = jax.nn.softmax(jnp.where(mask.dense(), scores, -np.inf), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def _splash(q, k, v, mask, interpret=True):
  """`attention.attend` taking the splash path (on any backend), its kernel run in the Pallas
  interpreter (`interpret`) or lowered for a TPU."""
  kernel = functools.partial(attention.splash_attention, interpret=interpret)
  with mock.patch.object(attention, "resolve_attention", lambda *a, **k: "splash"), \
       mock.patch.object(attention, "splash_attention", kernel):
    return attention.attend(q, k, v, mask, CONFIG, dropout=None)


def _outputs_and_grads(attend, mask, weights, mesh):
  """(q, k, v) -> (attend's output, the gradients of sum(output * weights)), traced under
  `mesh` as steps.build traces a step (no context mesh when None)."""

  def run(q, k, v):
    out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, mask), q, k, v)
    return out, vjp(weights)

  if mesh is None:
    return run
  from bertjax.training import steps  # pylint: disable=import-outside-toplevel
  return steps.under_mesh(mesh, run)


def _sharded(mesh, q, k, v):
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp"), None,
                                                                     "tensor", None))
  return [jax.device_put(x, spec) for x in (q, k, v)]


def _kernel_checks(mesh, q, k, v) -> dict:
  """Per batch: the largest error of splash per shard against the reference (outputs and
  gradients at real tokens, relative to max(1, the largest value)), and the shapes each
  kernel was made for: (MultiHeadMask [heads, seq, seq], the query [batch, seq, heads, d])."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=g-import-not-at-top
  made, make = [], splash.make_splash_mha
  seen, kernel = [], attention.splash_attention

  def spy_kernel(q, *args, **kwargs):
    seen.append(q.shape)
    return kernel(q, *args, **kwargs)

  result = {}
  for name, mask in _masks().items():
    real = np.asarray(mask.input_mask, bool)
    weights = jax.random.normal(jax.random.key(9), q.shape) * real[:, :, None, None]
    made.clear(), seen.clear()
    with mock.patch.object(splash, "make_splash_mha",
                           lambda m, **kw: made.append(m.shape) or make(m, **kw)), \
         mock.patch.object(attention, "splash_attention", spy_kernel):
      out, grads = jax.jit(_outputs_and_grads(_splash, mask, weights, mesh))(
          *_sharded(mesh, q, k, v))
    expected, expected_grads = jax.jit(_outputs_and_grads(_reference, mask, weights, None))(
        q, k, v)
    errors = [np.abs(np.asarray(a)[real] - np.asarray(b)[real]).max()
              / max(1.0, np.abs(np.asarray(b)).max())
              for a, b in zip([out, *grads], [expected, *expected_grads])]
    result[name] = {"error": float(max(errors)), "masks_made": sorted(set(made)),
                    "queries_seen": sorted(set(seen))}
  return result


def _uneven_check(mesh) -> float:
  """The largest error of per_shard against a direct call where the heads (3) do not divide
  over tensor=2 (so they are not split), with the dense reference as the kernel: outputs and
  gradients, relative to max(1, the largest value)."""
  q, k, v = (jax.random.normal(jax.random.key(i), (BATCH, SEQ, 3, HEAD_DIM)) for i in range(3))
  mask = _masks()["packed"]
  weights = jax.random.normal(jax.random.key(9), q.shape)
  kernel = lambda q, k, v, mask: attention.per_shard(_reference, q, k, v, mask)
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  got = jax.jit(_outputs_and_grads(kernel, mask, weights, mesh))(
      *(jax.device_put(x, rows) for x in (q, k, v)))
  expected = jax.jit(_outputs_and_grads(_reference, mask, weights, None))(q, k, v)
  return float(max(np.abs(np.asarray(a) - np.asarray(b)).max() / max(1.0, np.abs(b).max())
                   for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected))))


def _collectives(text: str) -> dict[str, int]:
  """{kind: how many} of the collectives in an optimized HLO module's text."""
  return {kind: len(re.findall(rf"\b{kind}(?:-start)?\(", text)) for kind in COLLECTIVES}


def _hlo_checks(mesh, q, k, v) -> dict:
  """The collectives of the compiled outputs-and-gradients of splash (interpreted) with and
  without the context mesh; the shapes of the TPU kernel's 4-d float32 operands and results
  ([batch, heads, seq, head_dim]) in the program lowered for a TPU, with and without."""
  mask = _masks()["packed"]
  weights = jnp.ones(q.shape)
  sharded = _sharded(mesh, q, k, v)
  result = {}
  for name, context in (("per_shard", mesh), ("direct", None)):
    compiled = jax.jit(_outputs_and_grads(_splash, mask, weights, context)).lower(
        *sharded).compile()
    result[name] = {"collectives": _collectives(compiled.as_text())}
    try:
      tpu = jax.jit(_outputs_and_grads(functools.partial(_splash, interpret=False), mask,
                                       weights, context)).trace(*sharded).lower(
                                           lowering_platforms=("tpu",)).as_text()
    except NotImplementedError as e:  # jax refuses to lower a Mosaic call that XLA must split
      result[name]["tpu_error"] = str(e)
      continue
    kernels = [line for line in tpu.splitlines() if "@tpu_custom_call(" in line]
    shapes = {shape for line in kernels  # the operands' types: after the last " : ", to "->"
              for shape in re.findall(rf"tensor<(\d+x\d+x{SEQ}x{HEAD_DIM})xf32>",
                                      line.rsplit(" : ", 1)[-1].split(" -> ")[0])}
    result[name].update(tpu_kernels=len(kernels), tpu_kernel_shapes=sorted(shapes))
  return result


def _step_checks(devices) -> dict:
  """One train step of a tiny pretraining model by `steps.build` over data=2 x tensor=2: the
  cudnn path (run by xla) against the plain xla path: the loss and parameters' largest
  difference, and what the cudnn path's kernel saw (the context mesh, the query's shape)."""
  sys.path.insert(0, os.path.join(ROOT, "tests"))
  import attention_helpers  # pylint: disable=import-outside-toplevel
  import test_train  # pylint: disable=import-outside-toplevel
  from bertjax.training import parallel  # pylint: disable=import-outside-toplevel

  config = test_train._config()
  config = dataclasses.replace(config, mesh=dataclasses.replace(config.mesh, tensor=2))
  seen, per_shard = [], attention.per_shard

  def spy_per_shard(kernel, q, *args):
    def spy_kernel(q, *args):
      seen.append([dict(jax.sharding.get_abstract_mesh().shape), list(q.shape)])
      return kernel(q, *args)
    return per_shard(spy_kernel, q, *args)

  results = {}
  for path in ("xla", "cudnn"):
    task = test_train._task(config, dropout=0.0)  # attention 'auto' -> xla on CPU
    setup = test_train._build(config, task, devices)
    batch = parallel.global_batch(test_train._first_batch(task), setup.mesh)
    with mock.patch.object(attention, "per_shard", spy_per_shard), (
        attention_helpers.cudnn_run_by_xla() if path == "cudnn" else contextlib.nullcontext()):
      state, metrics = setup.train_step(setup.init_state(), batch, setup.learning_rate(0))
    results[path] = (float(metrics.compute()["loss"]), jax.device_get(state["params"]))
  (loss, params), (expected_loss, expected_params) = results["cudnn"], results["xla"]
  difference = max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(params),
                                                        jax.tree.leaves(expected_params)))
  return {"loss": [loss, expected_loss], "params_difference": float(difference),
          "seen": seen, "batch": config.train.batch_size, "seq": config.data.max_seq_length}


def _main():
  assert jax.device_count() == 4, jax.devices()
  q, k, v = (jax.random.normal(jax.random.key(i), (BATCH, SEQ, HEADS, HEAD_DIM))
             for i in range(3))
  meshes = {name: jax.make_mesh(shape, ("data", "fsdp", "tensor"),
                                axis_types=(jax.sharding.AxisType.Auto,) * 3)
            for name, shape in MESHES.items()}
  result = {name: _kernel_checks(mesh, q, k, v) for name, mesh in meshes.items()}
  result["hlo"] = {name: _hlo_checks(mesh, q, k, v) for name, mesh in meshes.items()}
  result["uneven_heads_error"] = _uneven_check(meshes["data2_tensor2"])
  result["step"] = _step_checks(jax.devices())
  print("RESULT " + json.dumps(result))


# ---- the tests ----------------------------------------------------------------------------------


@functools.cache
def _result() -> dict:
  env = cpu_env(4)
  out = warm_python.run([sys.executable, os.path.abspath(__file__)], env=env, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.split("RESULT ", 1)[1])


def _local(mesh: str) -> tuple[int, int]:
  """(rows, heads) of one device's shard on MESHES[mesh]."""
  data, fsdp, tensor = MESHES[mesh]
  return BATCH // (data * fsdp), HEADS // tensor


def test_splash_per_shard_equals_the_reference_with_kernels_made_for_the_shard():
  for mesh in MESHES:
    rows, heads = _local(mesh)
    for batch in ("padded", "packed"):
      checks = _result()[mesh][batch]
      assert checks["error"] < 1e-5, (mesh, batch, checks)
      assert checks["masks_made"] == [[heads, SEQ, SEQ]], (mesh, batch)
      assert checks["queries_seen"] == [[rows, SEQ, heads, HEAD_DIM]], (mesh, batch)


def test_heads_that_do_not_divide_over_tensor_are_not_split():
  assert _result()["uneven_heads_error"] < 1e-5


def test_no_collective_around_the_kernel_per_shard_and_all_gathers_without():
  for mesh in MESHES:
    hlo = _result()["hlo"][mesh]
    assert hlo["per_shard"]["collectives"] == dict.fromkeys(COLLECTIVES, 0), mesh
    assert hlo["direct"]["collectives"]["all-gather"] > 0, mesh  # what per_shard avoids


def test_the_tpu_kernel_is_lowered_on_the_shards_arrays():
  """Lowered for a TPU, each Mosaic kernel's [rows, heads, seq, head_dim] operands and results
  are the shard's; called directly on the sharded arrays, jax refuses to lower the kernel (what
  a multi-chip slice met before per_shard)."""
  for mesh in MESHES:
    rows, heads = _local(mesh)
    hlo = _result()["hlo"][mesh]
    assert hlo["per_shard"]["tpu_kernels"] == 3  # forward, and the backward's dq and dkv
    assert hlo["per_shard"]["tpu_kernel_shapes"] == [f"{rows}x{heads}x{SEQ}x{HEAD_DIM}"], mesh
    assert "cannot be automatically partitioned" in hlo["direct"]["tpu_error"], mesh


def test_steps_build_runs_the_models_kernel_per_shard():
  step = _result()["step"]
  loss, expected_loss = step["loss"]
  assert abs(loss - expected_loss) < 1e-5 and step["params_difference"] < 1e-5, step
  mesh = {"data": 2, "fsdp": 1, "tensor": 2}
  # every layer, in the init's and the step's traces
  assert step["seen"] and all(s == [mesh, [step["batch"] // 2, step["seq"], 1, 64]]
                              for s in step["seen"]), step["seen"]


def test_without_a_context_mesh_the_kernel_is_called_as_it_is():
  calls = []
  q = jnp.ones((2, 8, 2, 4))
  out = attention.per_shard(lambda *args: calls.append(args[0].shape) or args[0], q, q, q,
                            attention.AttentionMask(jnp.ones((2, 8), jnp.int32)))
  assert calls == [(2, 8, 2, 4)] and out is q


if __name__ == "__main__":
  _main()
