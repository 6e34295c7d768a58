"""What a compiled step needs per device: HBM from `memory_analysis()`, collectives and matmul FLOPs from the
optimised HLO text.

Used to check a TPU configuration from a CPU host (topology.tpu_devices): the numbers are the TPU compiler's own,
for one device, for one call of the executable (one optimizer step).

Collectives are read from `compiled.as_text()` (parsed by `hlo_text`). Each counts once per execution of the
computation it sits in (`hlo_text.executions`: an op inside a while loop counts once per trip); a loop whose trip
count cannot be read counts once and is named in `CollectiveStats.unknown_trip_counts`. Ops in both branches of a
conditional count (an upper bound). With devices of several slices the TPU compiler emits one module per slice:
collectives in it stay within the slice, and what crosses the data-centre network is a host transfer marked
`_xla_megascale_transfer_type` (a send/recv pair), reported as `across_slices`.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from albert_jax import hlo_text
from albert_jax.errors import InputError

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


# ---------------------------------------------------------------------------------------------------- memory


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
  """Bytes per device. `arguments` = parameters + optimizer state + batch (+ RNG key) as sharded on one device."""
  arguments: int
  outputs: int
  aliased: int          # outputs written into donated argument buffers (counted once, in `arguments`)
  temporaries: int      # activations kept for the backward pass, workspace, collective buffers
  generated_code: int
  total: int            # arguments + outputs - aliased + temporaries: the conservative figure to compare with HBM
  peak: int             # the compiler's `peak_memory_in_bytes` (0 if not reported); can be below `total`
  argument_groups: dict[str, int] = dataclasses.field(default_factory=dict)  # e.g. {"state": ..., "batch": ...}

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def per_device_bytes(tree: Any) -> int:
  """Bytes one device holds of a tree of arrays / ShapeDtypeStructs with shardings (the largest shard)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = tuple(leaf.shape)
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None:
      shape = sharding.shard_shape(shape)
    total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
  return total


def memory_breakdown(compiled, arguments: dict[str, Any] | None = None) -> MemoryBreakdown:
  """`compiled.memory_analysis()` per device; `arguments` (name -> tree) splits the argument bytes by group."""
  m = compiled.memory_analysis()
  total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
  groups = {name: per_device_bytes(tree) for name, tree in (arguments or {}).items()}
  return MemoryBreakdown(
      arguments=int(m.argument_size_in_bytes), outputs=int(m.output_size_in_bytes),
      aliased=int(m.alias_size_in_bytes), temporaries=int(m.temp_size_in_bytes),
      generated_code=int(m.generated_code_size_in_bytes), total=int(total),
      peak=int(getattr(m, "peak_memory_in_bytes", 0) or 0), argument_groups=groups)


def out_of_memory(error: BaseException) -> dict[str, int] | None:
  """The TPU compiler's "does not fit" error -> {"required_bytes", "available_bytes"}; None for other errors.

  The message reads "Ran out of memory on HBM, the total memory required for HLO temporaries (16.06G) exceeds
  available HBM (15.48G)"; G is GiB, and "temporaries" there counts arguments and outputs too.
  """
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text:
    return None
  found = re.search(r"\(([\d.]+)([KMGT]?)\)\s*exceeds available HBM\s*\(([\d.]+)([KMGT]?)\)", text)
  if not found:
    return {"required_bytes": -1, "available_bytes": -1}
  scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
  return {"required_bytes": int(float(found[1]) * scale[found[2]]),
          "available_bytes": int(float(found[3]) * scale[found[4]])}


# ---------------------------------------------------------------------------------------------------- collectives


@dataclasses.dataclass(frozen=True)
class Collective:
  kind: str                 # one of KINDS
  name: str                 # HLO instruction (or megascale rendezvous) name
  computation: str
  bytes: int                # per device per execution: the larger of the operands and the result
  executions: int           # per step (product of enclosing while-loop trip counts)
  group_size: int | None    # devices taking part in each group (None: not read)
  across_slices: bool

  @property
  def bytes_per_step(self) -> int:
    return self.bytes * self.executions


@dataclasses.dataclass(frozen=True)
class CollectiveStats:
  collectives: tuple[Collective, ...]
  unknown_trip_counts: tuple[str, ...] = ()   # while loops counted once because their trip count was not read

  def totals(self) -> dict[str, dict[str, int]]:
    """kind -> {"within_slice", "across_slices"} bytes per step per device, for every kind in KINDS."""
    out = {kind: {"within_slice": 0, "across_slices": 0} for kind in KINDS}
    for c in self.collectives:
      out[c.kind]["across_slices" if c.across_slices else "within_slice"] += c.bytes_per_step
    return out

  def to_dict(self) -> dict[str, Any]:
    return {"totals": self.totals(),
            "collectives": [dict(dataclasses.asdict(c), bytes_per_step=c.bytes_per_step) for c in self.collectives],
            "unknown_trip_counts": list(self.unknown_trip_counts)}


def _iota(dims: str, perm: str | None) -> np.ndarray:
  shape = [int(d) for d in dims.split(",")]
  ids = np.arange(math.prod(shape)).reshape(shape)
  return ids.transpose([int(p) for p in perm.split(",")]) if perm else ids


def _groups(rest: str, num_devices: int) -> list[list[int]] | None:
  """Replica groups of a collective in any of XLA's printed forms (logical device ids), or None."""
  if m := re.search(r"source_target_pairs=\{(.*?)\}\}", rest):
    return [[int(x) for x in pair.split(",")] for pair in re.findall(r"\{([\d,]+)", m[1] + "}")]
  if m := re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest):
    return _iota(m[3], m[4]).reshape(int(m[1]), int(m[2])).tolist()
  if m := re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\((\[[\d,]+\])(?:T\(([\d,]+)\))?\))?\s*"
                    r"\{([^}]*)\}", rest):
    axes = re.findall(r"'(\w+)'=(\d+)", m[1])
    chosen = re.findall(r"'(\w+)'", m[4])
    if not axes or ":" in m[4] or any(c not in dict(axes) for c in chosen):
      return None
    shape = [int(size) for _, size in axes]
    ids = _iota(m[2][1:-1], m[3]) if m[2] else np.arange(math.prod(shape))
    ids = ids.reshape(shape)
    names = [name for name, _ in axes]
    order = [k for k, n in enumerate(names) if n not in chosen] + [names.index(c) for c in chosen]
    size = math.prod(shape[names.index(c)] for c in chosen)
    return ids.transpose(order).reshape(-1, size).tolist()
  if m := re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", rest):
    groups = [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", m[1])]
    return groups or [list(range(num_devices))]
  return None


def _kind(opcode: str) -> str | None:
  base = opcode.removesuffix("-start")
  return base if base in KINDS else None


def collective_stats(compiled_or_text, devices: Sequence | None = None) -> CollectiveStats:
  """Every collective of a compiled executable (or its `as_text()`), with bytes per step per device.

  `devices`: the executable's devices in device-assignment order (`list(mesh.devices.flat)` for a jit over that
  mesh's NamedShardings); used to tell within-slice from across-slice groups when one HLO module spans several
  slices. TPU multislice modules are per slice; their cross-slice traffic is counted from the megascale transfers.
  """
  text = compiled_or_text if isinstance(compiled_or_text, str) else compiled_or_text.as_text()
  computations, entry, header = hlo_text.parse_module(text)
  counts, unknown = hlo_text.executions(computations, entry)
  module_devices = header.get("num_partitions", 1) * header.get("replica_count", 1)
  slice_of = [getattr(d, "slice_index", 0) for d in devices] if devices is not None else []
  spans_slices = len(set(slice_of)) > 1 and module_devices == len(slice_of)
  found: list[Collective] = []
  megascale: dict[str, dict[str, Any]] = {}
  for comp, instrs in computations.items():
    if counts.get(comp, 0) == 0:
      continue
    table = {i.name: i for i in instrs}
    for i in instrs:
      operand_arrays = [a for n in i.operands if n in table for a in table[n].arrays]
      transfer = re.search(r'_xla_megascale_transfer_type="(\w+)"', i.rest)
      if transfer and i.opcode in ("send", "recv"):
        key = re.search(r'_xla_host_transfer_rendezvous="([^"]+)"', i.rest)
        t = megascale.setdefault(key[1] if key else i.name, {
            "kind": transfer[1].lower().replace("_", "-"), "computation": comp, "bytes": 0,
            "executions": counts[comp]})
        sent = operand_arrays if i.opcode == "send" else i.arrays
        t["bytes"] = max(t["bytes"], sum(b for b, rank in sent if rank > 0))
        continue
      kind = _kind(i.opcode)
      if kind is None:
        continue
      operand_bytes = sum(b for b, _ in operand_arrays)
      result_bytes = sum(b for b, rank in i.arrays if rank > 0)
      if i.opcode.endswith("-start") and len(i.arrays) > 1:  # (operands..., results..., context scalars)
        result_bytes -= operand_bytes
      groups = _groups(i.rest, module_devices)
      across = bool(spans_slices and groups and any(len({slice_of[d] for d in g}) > 1 for g in groups))
      found.append(Collective(kind=kind, name=i.name, computation=comp, bytes=max(operand_bytes, result_bytes),
                              executions=counts[comp], group_size=len(groups[0]) if groups else None,
                              across_slices=across))
  for name, t in megascale.items():
    if t["kind"] not in KINDS:
      raise InputError(f"Unknown cross-slice transfer type {t['kind']!r} in the HLO; extend compile_stats.KINDS.")
    found.append(Collective(kind=t["kind"], name=name, computation=t["computation"], bytes=t["bytes"],
                            executions=t["executions"], group_size=None, across_slices=True))
  return CollectiveStats(collectives=tuple(found), unknown_trip_counts=tuple(unknown))


# ------------------------------------------------------------------------------------------ matmul FLOPs


def dot_flops(instr: hlo_text.Instr, table: dict[str, hlo_text.Instr]) -> int:
  """2 x (multiply-adds) of one dot or convolution. A dot's output elements each sum over its lhs contracting
  dimensions; a convolution's over the kernel's input features times the window taps that land on the input: the
  TPU compiler writes batched matmuls as convolutions whose input is dilated by the window size (`lhs_dilate`),
  where one tap per output is real."""
  out = math.prod(hlo_text.array_dims(instr.shape))
  if instr.opcode == "dot":
    lhs = hlo_text.array_dims(table[instr.operands[0]].shape)
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.rest)
    return 2 * out * math.prod(lhs[int(d)] for d in contracting[1].split(",") if d) if contracting else 0
  kernel = hlo_text.array_dims(table[instr.operands[1]].shape)
  labels = re.search(r"dim_labels=\w+_(\w+)->", instr.rest)
  if not labels or len(labels[1]) != len(kernel):
    return 0
  size = re.search(r"\bsize=([\dx]+)", instr.rest)
  dilate = re.search(r"\blhs_dilate=([\dx]+)", instr.rest)
  window = [int(k) for k in size[1].split("x")] if size else []
  dilation = [int(d) for d in dilate[1].split("x")] if dilate else [1] * len(window)
  taps = math.prod(-(-k // d) for k, d in zip(window, dilation))
  groups = re.search(r"batch_group_count=(\d+)", instr.rest)
  return 2 * out * kernel[labels[1].index("i")] * taps // (int(groups[1]) if groups else 1)


def matmul_flops(compiled_or_text) -> tuple[int, tuple[str, ...]]:
  """FLOPs of the dots and convolutions of a compiled executable (or its `as_text()`) per call, per device, with
  each op counted once per execution of its computation (while-loop trips included, which XLA's
  `cost_analysis()` counts once). Returns (FLOPs, the while loops counted once because their trip count was not
  read)."""
  text = compiled_or_text if isinstance(compiled_or_text, str) else compiled_or_text.as_text()
  computations, entry, _ = hlo_text.parse_module(text)
  counts, unknown = hlo_text.executions(computations, entry)
  total = 0
  for comp, instrs in computations.items():
    table = {i.name: i for i in instrs}
    total += counts.get(comp, 0) * sum(dot_flops(i, table) for i in instrs if i.opcode in ("dot", "convolution"))
  return total, tuple(unknown)
