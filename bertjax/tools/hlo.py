"""What a compiled program communicates and multiplies, read from its text.

`collectives` reads the collectives of an optimized HLO module (`jit(f).lower(...).compile()
.as_text()`: after SPMD partitioning, so it is what each device sends), each with its kind, the
bytes of the whole tensor per device (times the trips of a while loop it is in) and the mesh
axes its devices span. `matmuls` reads the
operand and result dtypes of every matmul of the lowered program (`jit(f).lower(...).as_text()`,
StableHLO, before a backend changes them: XLA's CPU compiler computes a bfloat16 dot in float32).
"""
from __future__ import annotations

import collections
import dataclasses
import re

import numpy as np
from jax.sharding import Mesh

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# What `collectives` reports: KINDS, and an all-reduce whose result each device slices.
REPORTED = KINDS + ("all-reduce-scatter",)

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_LIST_GROUPS = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class Collective:
  """One collective of a compiled program, as each device runs it."""
  kind: str  # one of KINDS
  nbytes: int  # the whole tensor per device: a reduce-scatter's input, an all-gather's output
  axes: tuple[str, ...]  # the mesh axes along which its devices differ
  op_name: str  # the jax operation it came from (HLO metadata), "" if none
  instruction: str = ""  # its HLO instruction (one may reduce several arrays)


def _array_bytes(text: str) -> int:
  """Bytes of an HLO type: `f32[8,128]{1,0}` or a tuple `(f32[], bf16[4])`."""
  return sum(_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
             for dtype, dims in _ARRAY.findall(text))


def _groups(line: str, num_devices: int) -> list[list[int]]:
  """The device groups (logical ids) of a collective's replica_groups or source_target_pairs;
  one group of every device where the line gives none."""
  if match := _MESH_GROUPS.search(line):
    sizes = [(name.strip("'"), int(size)) for name, size in
             (axis.split("=") for axis in match.group(1).split(","))]
    grouped = {name.strip(" '") for name in match.group(2).split(",")}
    ids = np.arange(num_devices).reshape([size for _, size in sizes])
    order = ([i for i, (name, _) in enumerate(sizes) if name not in grouped]
             + [i for i, (name, _) in enumerate(sizes) if name in grouped])
    size = int(np.prod([s for name, s in sizes if name in grouped]))
    return ids.transpose(order).reshape(-1, size).tolist()
  if match := _IOTA_GROUPS.search(line):
    count, size, dims, perm = match.groups()
    ids = np.arange(num_devices).reshape([int(d) for d in dims.split(",")])
    if perm:
      ids = ids.transpose([int(p) for p in perm.split(",")])
    return ids.reshape(int(count), int(size)).tolist()
  if match := _LIST_GROUPS.search(line):
    groups = [[int(i) for i in group.split(",") if i]
              for group in re.findall(r"\{([\d,]*)\}", match.group(1))]
    return [g for g in groups if g] or [list(range(num_devices))]
  if match := _PAIRS.search(line):
    return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", match.group(1))]
  return [list(range(num_devices))]


def _axes(groups: list[list[int]], mesh: Mesh) -> tuple[str, ...]:
  """The mesh axes whose coordinate differs between devices of one group (logical id i is
  `mesh.devices.flat[i]`, the order jit assigns devices in)."""
  varying = set()
  for group in groups:
    coords = np.array([np.unravel_index(i, mesh.devices.shape) for i in group])
    varying |= {name for name, column in zip(mesh.axis_names, coords.T) if len(set(column)) > 1}
  return tuple(name for name in mesh.axis_names if name in varying)


_COMPUTATION = re.compile(r"^(?:ENTRY )?(%[\w.-]+) ")  # a computation's first line
_WHILE = re.compile(r"condition=(%[\w.-]+), body=(%[\w.-]+)")
# `%name = TYPE opcode(operands...`; TYPE is one array type or a tuple of them.
_DEFINITION = re.compile(r"^\s*(?:ROOT )?(%[\w.-]+) = (\(.*?\)|\S+) ([\w-]+)\((.*)$")


def _elements(type_text: str) -> list[int]:
  """Element counts of the arrays of an HLO type (one, or one per tuple element)."""
  return [int(np.prod([int(d) for d in dims.split(",") if d]))
          for _, dims in _ARRAY.findall(type_text)]


class _Module:
  """The instructions of an HLO module's text: name -> (result type, opcode, line), the users of
  each, and the computation each is in (`runs`: how many times a step runs it)."""

  def __init__(self, hlo_text: str):
    self.defs, self.users = {}, collections.defaultdict(list)
    self.computation, computation = {}, ""
    for line in hlo_text.splitlines():
      if start := _COMPUTATION.match(line):
        computation = start.group(1)
      match = _DEFINITION.match(line)
      if not match:
        continue
      name, result, opcode, rest = match.groups()
      self.defs[name] = (result, opcode, line)
      self.computation[name] = computation
      for operand in set(re.findall(r"%[\w.-]+", rest.split("), ")[0])):
        self.users[operand].append(name)
    # A while loop's body runs as many times as its condition's `i < N` allows (the TPU
    # compiler's windowed einsums: a matmul's operand sent around a ring of collective-permutes).
    self.trips = {}
    inside = collections.defaultdict(list)
    for name, where in self.computation.items():
      inside[where].append(name)
    for name, (_, opcode, line) in self.defs.items():
      loop = _WHILE.search(line) if opcode == "while" else None
      if loop:
        self.trips[loop.group(2)] = (self._trips(inside[loop.group(1)], inside[loop.group(2)]),
                                     name)

  def _constant(self, name: str) -> int | None:
    value = re.search(r"constant\((\d+)\)", self.defs[name][2]) if name in self.defs else None
    return int(value.group(1)) if value else None

  def _trips(self, condition: list[str], body: list[str]) -> int:
    """A loop's trips: its condition's `counter < N` over N / the body's `counter + step`, the
    counter starting at 0 (a scan's, a windowed einsum's); 1 where it reads otherwise."""
    compares = [n for n in condition if self.defs[n][1] == "compare"]
    roots = [n for n in body if " ROOT " in f" {self.defs[n][2].lstrip()}"]
    if len(compares) != 1 or "direction=LT" not in self.defs[compares[0]][2] or len(roots) != 1:
      return 1
    counter, bound = re.findall(r"%[\w.-]+", self.defs[compares[0]][2].split("compare(")[1])[:2]
    index = re.search(r"index=(\d+)", self.defs.get(counter, ("", "", ""))[2])
    bound = self._constant(bound)
    if index is None or bound is None:
      return 1
    following = re.findall(r"%[\w.-]+", self.defs[roots[0]][2].split("tuple(", 1)[-1])
    step = following[int(index.group(1))] if int(index.group(1)) < len(following) else ""
    steps = [self._constant(n) for n in re.findall(r"%[\w.-]+", self.defs.get(
        step, ("", "", "add()"))[2].split("add(", 1)[-1])]
    step = next((s for s in steps if s), 1)
    return -(-bound // step)

  def runs(self, name: str) -> int:
    """Times a step runs instruction `name`: its loops' trips (1 outside any loop)."""
    trips = self.trips.get(self.computation.get(name, ""))
    return 1 if trips is None else trips[0] * self.runs(trips[1])

  def sliced(self, name: str, elements: int, ways: int, depth: int = 3) -> bool:
    """Whether every use of `name` (an array of `elements`) keeps 1/`ways` of it at most: each
    device's slice of a reduced array, after at most `depth` ops that keep its size (an async
    -done, a convert to another dtype)."""
    users = self.users.get(name, [])
    if not users or depth < 0:
      return False
    for user in users:
      result, opcode, _ = self.defs[user]
      size = max(_elements(result), default=elements)
      if size * ways <= elements:
        continue
      if size != elements or opcode not in ("fusion", "convert", "copy", "bitcast") and not (
          opcode.endswith("-done")) or not self.sliced(user, elements, ways, depth - 1):
        return False
    return True


def collectives(hlo_text: str, mesh: Mesh) -> list[Collective]:
  """Every collective in an optimized HLO module's text (async ones counted at their start; one
  in a while loop with its bytes times the loop's trips, where its condition is `i < N`).

  An all-reduce that XLA combined from several arrays (a tuple) gives one Collective per array
  (`summary` counts its instruction once). An all-reduce array whose every use keeps only this
  device's slice of it is an
  "all-reduce-scatter" (TPU's name for that form): a reduce-scatter, which XLA's CPU compiler
  writes as an all-reduce and a slice (GPU and TPU compilers fuse or rewrite it).

  Args:
    hlo_text: `compiled.as_text()` of a program jitted over `mesh`.
    mesh: the mesh it was compiled for (its device order gives the logical ids).
  """
  module = _Module(hlo_text)
  found = []
  for name, (result, opcode, line) in module.defs.items():
    kind = opcode.removesuffix("-start")
    started = kind != opcode
    if kind not in KINDS:
      continue
    groups = _groups(line, mesh.devices.size)
    ways = max(len(g) for g in groups)
    axes = _axes(groups, mesh)
    op_name = _OP_NAME.search(line)
    op_name = op_name.group(1) if op_name else ""
    arrays = _ARRAY.findall(result)
    if started and kind == "collective-permute":  # (operand, result, u32[] context...)
      arrays = arrays[1:2]
    elif started and kind != "all-reduce":  # (operands, results); an all-reduce-start's: results
      arrays = arrays[len(arrays) // 2:]
    runs = module.runs(name)  # in a loop, each of its trips
    if kind != "all-reduce":
      nbytes = sum(_array_bytes(f"{t}[{d}]") for t, d in arrays) * runs
      if kind == "reduce-scatter":
        nbytes *= ways
      found.append(Collective(kind, nbytes, axes, op_name, name))
      continue
    # Each array of the (tuple) result, followed through its get-tuple-element if a tuple.
    outputs = {0: name}
    if len(arrays) > 1 or result.startswith("("):
      outputs = {}
      for user in module.users.get(name, []):
        index = re.search(r"index=(\d+)", module.defs[user][2])
        if module.defs[user][1] == "get-tuple-element" and index:
          outputs[int(index.group(1))] = user
    for i, (dtype, dims) in enumerate(arrays):
      elements = int(np.prod([int(d) for d in dims.split(",") if d]))
      scattered = (ways > 1 and elements >= ways and i in outputs
                   and module.sliced(outputs[i], elements, ways))
      found.append(Collective("all-reduce-scatter" if scattered else "all-reduce",
                              elements * _BYTES[dtype] * runs, axes, op_name, name))
  return found


def summary(found: list[Collective]) -> list[dict]:
  """Rows of {kind, axes, count (HLO instructions), nbytes} per kind and axes, by kind."""
  rows = collections.defaultdict(lambda: [set(), 0])
  for c in found:
    rows[(c.kind, c.axes)][0].add(c.instruction)
    rows[(c.kind, c.axes)][1] += c.nbytes
  return [dict(kind=kind, axes=list(axes), count=len(names), nbytes=nbytes)
          for (kind, axes), (names, nbytes) in sorted(
              rows.items(), key=lambda item: (REPORTED.index(item[0][0]), item[0][1]))]


_TENSOR = r"tensor<(?:[\d?]+x)*(\w+)>"  # the element type of `tensor<32x128xbf16>`
_MATMUL = re.compile(r"stablehlo\.(?:dot_general|convolution).*:\s*\(" + _TENSOR + ", " + _TENSOR
                     + r"\)\s*->\s*" + _TENSOR)


def matmuls(stablehlo_text: str) -> collections.Counter:
  """Counts the matmuls (dot_general, convolution) of a lowered program by dtypes: a Counter of
  'LHS x RHS -> OUT' strings, e.g. 'bf16 x bf16 -> f32'."""
  counts = collections.Counter()
  for line in stablehlo_text.splitlines():
    if match := _MATMUL.search(line):
      lhs, rhs, out = match.groups()
      counts[f"{lhs} x {rhs} -> {out}"] += 1
  return counts
