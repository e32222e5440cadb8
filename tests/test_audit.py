"""What the compiled steps communicate on 8 simulated devices (`python -m bertjax.tools.audit`),
held to what each kind of parallelism needs, and the HLO reading under it (bertjax.tools.hlo).

The tiny model with the paper's dropout (0.1 on hidden states and attention probabilities) in
bfloat16, batch 32 x 128 tokens, on a data-parallel, an FSDP and a tensor x data mesh."""
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from bertjax.tools import hlo

from conftest import cpu_env
import docs_text
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_LAYERS = 2  # configs/tiny.py


def _audit(tmp_path, *mesh_flags, config="configs/tiny.py"):
  out = tmp_path / "audit.json"
  # (JAX_PLATFORMS=cpu, which the tool sets before it imports jax, given: from the warm server)
  result = warm_python.run(
      [sys.executable, "-m", "bertjax.tools.audit", f"--config={config}", "--devices=8",
       "--config.model.dropout_rate=0.1", "--config.model.attention_dropout_rate=0.1",
       "--config.model.dtype=bfloat16", *mesh_flags, f"--json={out}"],
      cwd=ROOT, env=cpu_env(8), timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "train step" in result.stdout and "collective" in result.stdout
  return json.loads(out.read_text())


def _bytes(report, kind, axes=None):
  return sum(row["nbytes"] for row in report["collectives"]
             if row["kind"] == kind and (axes is None or row["axes"] == axes))


def _kinds(report):
  return {(row["kind"], tuple(row["axes"])) for row in report["collectives"]}


def test_data_parallel_moves_the_gradient_all_reduce_and_scalars_only(tmp_path):
  """No random bits of dropout (each device draws its own), no activations: one all-reduce of
  the gradients (XLA's CPU compiler reduces the tied word table's two gradients apart, the TPU
  compiler as one: up to 1.7 x the parameters) and the metrics."""
  audit = _audit(tmp_path)
  params = audit["parameter_bytes"]
  assert audit["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}
  assert _kinds(audit["train"]) == {("all-reduce", ("data",))}
  assert params <= _bytes(audit["train"], "all-reduce") <= 1.7 * params
  assert _kinds(audit["eval"]) == {("all-reduce", ("data",))}
  assert _bytes(audit["eval"], "all-reduce") < 1000  # the metric sums
  assert audit["train"]["matmuls"].get("bf16 x bf16 -> bf16", 0) >= 6 * NUM_LAYERS


def test_fsdp_gathers_the_parameters_and_reduce_scatters_the_gradients(tmp_path):
  """Parameter all-gathers of about the parameters' size, gradient reduce-scatters (all-reduce
  and each device's slice on the CPU), no all-to-all, no activations in the eval step."""
  audit = _audit(tmp_path, "--config.mesh.fsdp=8")
  params = audit["parameter_bytes"]
  train, evaluation = audit["train"], audit["eval"]
  assert {kind for kind, _ in _kinds(train)} == {"all-gather", "all-reduce-scatter",
                                                 "all-reduce"}
  assert {axes for _, axes in _kinds(train)} == {("fsdp",)}
  assert 0.9 * params <= _bytes(train, "all-gather") <= 2.1 * params
  assert 0.9 * params <= _bytes(train, "all-reduce-scatter") <= 1.7 * params
  assert _bytes(train, "all-reduce") < 0.01 * params  # norms and metrics
  assert {kind for kind, _ in _kinds(evaluation)} == {"all-gather", "all-reduce"}
  assert 0.9 * params <= _bytes(evaluation, "all-gather") <= 1.05 * params
  assert _bytes(evaluation, "all-reduce") < 1000
  state = 3 * params  # parameters and Adam's two moments
  assert train["memory"]["arguments"] <= 1.2 * state / 8  # split 8 ways


def test_tensor_parallelism_moves_two_activation_reductions_a_layer(tmp_path):
  """Megatron's layout: each layer's attention and feed-forward outputs are all-reduced over
  `tensor` in the forward pass (and the inputs' gradients in the backward), the parameters'
  gradients over `data`; nothing moves all-to-all."""
  audit = _audit(tmp_path, "--config.mesh.tensor=2")
  assert audit["mesh"] == {"data": 4, "fsdp": 1, "tensor": 2}
  params = audit["parameter_bytes"]
  train, evaluation = audit["train"], audit["eval"]
  kinds = {kind for kind, _ in _kinds(train) | _kinds(evaluation)}
  assert not kinds & {"all-to-all", "collective-permute"}
  assert 0.5 * params <= _bytes(train, "all-reduce", ["data"]) <= 1.7 * params
  # One float32 [batch / data, seq, hidden] activation of a device: train batch 32, eval 128.
  train_hidden, eval_hidden = 32 // 4 * 128 * 128 * 4, 128 // 4 * 128 * 128 * 4
  count = sum(row["count"] for row in evaluation["collectives"]
              if row["kind"] == "all-reduce" and row["axes"] == ["tensor"])
  assert 2 * NUM_LAYERS <= count <= 2 * NUM_LAYERS + 2
  assert (2 * NUM_LAYERS * eval_hidden <= _bytes(evaluation, "all-reduce", ["tensor"])
          <= 2 * NUM_LAYERS * eval_hidden * 1.1)
  assert (4 * NUM_LAYERS * train_hidden <= _bytes(train, "all-reduce", ["tensor"])
          <= 8 * NUM_LAYERS * train_hidden)


def test_modernbert_communicates_what_bert_does(tmp_path):
  """configs/modernbert.py (6 layers: rotary embeddings, local windows by blocks, GeGLU) holds
  BERT's contracts: data parallel, the gradients' all-reduce and scalars; FSDP, the parameters
  gathered about once and the gradients reduce-scattered; tensor x data, two float32
  [batch / data, seq, hidden] residual-stream reductions a layer in the eval step."""
  layers = 6  # MODERNBERT_SIZES["tiny"]
  flags = ("--config.model.attention_dropout_rate=0.0",)
  dp = _audit(tmp_path, *flags, config="configs/modernbert.py")
  params = dp["parameter_bytes"]
  assert _kinds(dp["train"]) == {("all-reduce", ("data",))}
  assert params <= _bytes(dp["train"], "all-reduce") <= 1.7 * params
  fsdp = _audit(tmp_path, *flags, "--config.mesh.fsdp=8", config="configs/modernbert.py")
  assert {axes for _, axes in _kinds(fsdp["train"])} == {("fsdp",)}
  assert 0.9 * params <= _bytes(fsdp["train"], "all-gather") <= 2.1 * params
  assert 0.9 * params <= _bytes(fsdp["train"], "all-reduce-scatter") <= 1.7 * params
  assert _bytes(fsdp["train"], "all-reduce") < 0.01 * params
  tp = _audit(tmp_path, *flags, "--config.mesh.tensor=2", config="configs/modernbert.py")
  kinds = {kind for kind, _ in _kinds(tp["train"]) | _kinds(tp["eval"])}
  assert not kinds & {"all-to-all", "collective-permute"}
  eval_hidden = 128 // 4 * 128 * 128 * 4
  count = sum(row["count"] for row in tp["eval"]["collectives"]
              if row["kind"] == "all-reduce" and row["axes"] == ["tensor"])
  assert 2 * layers <= count <= 2 * layers + 2
  assert (2 * layers * eval_hidden <= _bytes(tp["eval"], "all-reduce", ["tensor"])
          <= 2 * layers * eval_hidden * 1.1)


def test_a_bad_flag_is_one_line(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.tools.audit", "--config=configs/tiny.py", "--devices=8",
       "--config.mesh.fsdp=3"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 2
  assert "Traceback" not in result.stderr
  assert "bertjax: error: mesh fsdp=3 x tensor=1 does not divide the 8 devices" in result.stderr


@pytest.mark.parametrize("count", ["0", "-2"])
def test_a_device_count_below_one_is_one_line(count):
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.tools.audit", "--config=configs/tiny.py",
       f"--devices={count}"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  assert (f"bertjax: error: --devices={count}: simulate 1 or more CPU devices"
          in result.stderr), result.stderr[-3000:]


MESH = types.SimpleNamespace(devices=np.empty((2, 2, 2)), axis_names=("data", "fsdp", "tensor"))


@pytest.mark.parametrize("groups, axes", [
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}", ("tensor",)),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", ("data", "fsdp")),
    ("replica_groups=[4,2]<=[8]", ("tensor",)),
    ("replica_groups=[4,2]<=[2,2,2]T(0,2,1)", ("fsdp",)),  # the fsdp pairs
    ("replica_groups=[2,4]<=[2,4]T(1,0)", ("data", "tensor")),  # {0,4,1,5}, {2,6,3,7}
    ("replica_groups={{0,2},{1,3},{4,6},{5,7}}", ("fsdp",)),
    ("replica_groups={}", ("data", "fsdp", "tensor")),
])
def test_replica_groups_in_each_hlo_form_name_their_mesh_axes(groups, axes):
  text = f"  %all-gather.3 = f32[8,128]{{1,0}} all-gather(%p), channel_id=1, {groups}, dims={{0}}"
  [found] = hlo.collectives(text, MESH)
  assert found == hlo.Collective("all-gather", 8 * 128 * 4, axes, "", "%all-gather.3")


def test_a_reduce_scatter_counts_its_input_and_async_starts_their_results():
  text = "\n".join([
      "  %reduce-scatter = bf16[4,16]{1,0} reduce-scatter(%g), replica_groups=[4,2]<=[8], "
      "dimensions={0}",
      "  %all-gather-start = (f32[2], f32[4]) all-gather-start(%x), replica_groups=[4,2]<=[8]",
      "  %all-gather-done = f32[4] all-gather-done(%all-gather-start)",
      "  %all-reduce-start = (f32[8], f32[4]) all-reduce-start(%a, %b), replica_groups=[4,2]<=[8]",
      "  %all-reduce-done = (f32[8], f32[4]) all-reduce-done(%all-reduce-start)"])
  found = hlo.collectives(text, MESH)
  assert [(c.kind, c.nbytes) for c in found] == [("reduce-scatter", 2 * 4 * 16 * 2),
                                                ("all-gather", 16), ("all-reduce", 32),
                                                ("all-reduce", 16)]


def test_collectives_in_a_while_loop_count_each_trip_and_a_permute_start_its_data():
  """The TPU compiler's windowed einsum on an FSDP mesh: a ring of collective-permutes in a while
  loop of `i < 16` by steps of 2, 8 trips; each sends its bf16[1024,8] (not the start's u32[]
  context)."""
  text = "\n".join([
      "%cond (p: (bf16[1024,8], u32[])) -> pred[] {",
      "  %constant.1 = u32[] constant(16)",
      "  %gte = u32[] get-tuple-element(%p), index=1",
      "  ROOT %compare.2 = pred[] compare(%gte, %constant.1), direction=LT",
      "}",
      "%body (p: (bf16[1024,8], u32[])) -> (bf16[1024,8], u32[]) {",
      "  %collective-permute-start.9 = (bf16[1024,8]{0,1:T(8,128)(2,1)}, bf16[1024,8]{0,1}, "
      "u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%x), channel_id=3, "
      "source_target_pairs={{0,1},{1,0},{2,3},{3,2},{4,5},{5,4},{6,7},{7,6}}",
      "  %constant.7 = u32[] constant(2)",
      "  %i = u32[] get-tuple-element(%p), index=1",
      "  %add.3 = u32[]{:T(128)} add(%i, %constant.7)",
      "  ROOT %tuple.4 = (bf16[1024,8], u32[]) tuple(%x, /*index=1*/%add.3)",
      "}",
      "ENTRY %main (a: bf16[1024,8]) -> bf16[1024,8] {",
      "  %while.3 = (bf16[1024,8], u32[]) while(%t), condition=%cond, body=%body",
      "  %collective-permute-start.1 = (bf16[8]{0}, bf16[8]{0}, u32[], u32[]) "
      "collective-permute-start(%a), source_target_pairs={{0,1},{1,0}}",
      "}"])
  found = hlo.collectives(text, MESH)
  assert [(c.kind, c.nbytes, c.axes) for c in found] == [
      ("collective-permute", 8 * 1024 * 8 * 2, ("tensor",)),
      ("collective-permute", 8 * 2, ("tensor",))]


def test_an_all_reduce_that_each_device_slices_is_an_all_reduce_scatter():
  """An all-reduce of a tuple counts once; its gradient (converted, then sliced to this device's
  quarter) is an all-reduce-scatter, its scalar an all-reduce."""
  text = "\n".join([
      "  %all-reduce.1 = (f32[], f32[64,8]{1,0}) all-reduce(%a, %b), replica_groups={{0,1,2,3},"
      "{4,5,6,7}}, to_apply=%add",
      "  %gte.0 = f32[] get-tuple-element(%all-reduce.1), index=0",
      "  %gte.1 = f32[64,8]{1,0} get-tuple-element(%all-reduce.1), index=1",
      "  %convert = bf16[64,8]{1,0} convert(%gte.1)",
      "  %slice = bf16[16,8]{1,0} fusion(%convert, %partition-id), kind=kLoop, calls=%ds",
      "  %loss = f32[] fusion(%gte.0), kind=kLoop, calls=%f",
      "  %all-reduce.2 = f32[64]{0} all-reduce(%c), replica_groups={{0,1,2,3},{4,5,6,7}}",
      "  %whole = f32[64]{0} add(%all-reduce.2, %all-reduce.2)"])
  rows = hlo.summary(hlo.collectives(text, MESH))
  assert rows == [
      dict(kind="all-reduce", axes=["fsdp", "tensor"], count=2, nbytes=4 + 64 * 4),
      dict(kind="all-reduce-scatter", axes=["fsdp", "tensor"], count=1, nbytes=64 * 8 * 4)]


def test_matmuls_are_counted_by_their_dtypes():
  text = "\n".join([
      "    %3 = stablehlo.dot_general %1, %2, contracting_dims = [1] x [0] : "
      "(tensor<32x128xbf16>, tensor<128x128xbf16>) -> tensor<32x128xbf16>",
      "    %4 = stablehlo.dot_general %1, %2, batching_dims = [0] x [0], contracting_dims = [2] "
      "x [1] : (tensor<4x32x128xbf16>, tensor<4x128x8xbf16>) -> tensor<4x32x8xf32>",
      "    %5 = stablehlo.add %3, %3 : tensor<32x128xbf16>"])
  assert hlo.matmuls(text) == {"bf16 x bf16 -> bf16": 1, "bf16 x bf16 -> f32": 1}


def test_the_readme_audit_command_runs_as_written():
  commands = [line for line in docs_text.all_text().splitlines()  # docs/accelerators.md
              if line.startswith("python -m bertjax.tools.audit")]
  assert len(commands) == 1, commands
  result = subprocess.run([sys.executable, *commands[0].split()[1:]], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "mesh data=1 x fsdp=8 x tensor=1 (8 devices)" in result.stdout
  assert "all-reduce-scatter" in result.stdout and "all-to-all" not in result.stdout


@pytest.mark.parametrize("chunk", [0, 16])
def test_contrastive_training_exchanges_only_the_embeddings(tmp_path, random_bert, chunk):
  """configs/embeddings.py on 8 devices, batch 64 (anchor, positive) rows of 32 tokens, a
  random H64 model with mean pooling, whole or with GradCache chunks of 16: the negatives'
  exchange is all-gathers of embeddings (the [64, 64] float32 of each column, a few times over:
  forward and backward) and permutes of a few scores, under 8 columns' worth in all, beside the
  gradient's all-reduce (with chunks, one a chunk); no tokens or activations move."""
  model = random_bert(tmp_path / "model", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                      [f"w{i}" for i in range(60)])
  out = tmp_path / "audit.json"
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.tools.audit", "--config=configs/embeddings.py",
       "--devices=8", f"--config.init_checkpoint={model}", "--config.embedding.pooling=mean",
       "--config.data.max_seq_length=32", "--config.model.dropout_rate=0.0",
       "--config.model.attention_dropout_rate=0.0",
       f"--config.embedding.grad_cache_chunk={chunk}", f"--json={out}"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  audit = json.loads(out.read_text())
  params = audit["parameter_bytes"]
  kinds = _kinds(audit["train"])
  assert ("all-gather", ("data",)) in kinds and all(axes == ("data",) for _, axes in kinds)
  embeddings = 64 * 64 * 4  # [batch, dim] float32, one column
  exchanged = sum(row["nbytes"] for row in audit["train"]["collectives"]
                  if row["kind"] != "all-reduce")  # gathers, and permutes of a few scores
  assert embeddings <= _bytes(audit["train"], "all-gather") <= exchanged <= 8 * embeddings
  # GradCache's gradient is all-reduced inside its loop over the chunks: once a chunk (the
  # audit counts a loop's trips), 4 times the parameters a step at chunks of 16 of 64 rows.
  reductions = 64 // chunk if chunk else 1
  assert (reductions * params <= _bytes(audit["train"], "all-reduce")
          <= reductions * 1.7 * params + 8 * embeddings)
