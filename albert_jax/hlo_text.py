"""The optimised HLO text of a compiled executable (`compiled.as_text()`), parsed: its computations and their
instructions, and how many times each computation runs per call of the executable.

An instruction inside a while loop (`lax.scan` over layers, gradient accumulation) runs once per trip. The trip
count is `known_trip_count` when XLA records it, else read off the loop condition (`counter < N`, counter starting
at a constant); a loop whose count cannot be read counts once, and `executions` names it. Both branches of a
conditional count (an upper bound). Used by the collective and matmul-FLOP counts (`compile_stats`) and the GPU
roofline (`bench/roofline.py`).
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict

from albert_jax.errors import InputError

_BITS = {"pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16,
         "bf16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128}
_ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%(\S+)\s*=\s*(.*?)\s+([a-z][a-z0-9-]*)\((.*)$")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%(\S+)\s.*\{\s*$")


@dataclasses.dataclass
class Instr:
  name: str
  opcode: str
  arrays: list[tuple[int, int]]   # (bytes, rank) of each array in the result shape
  operands: list[str]
  rest: str                       # operands and attributes, as printed
  root: bool
  shape: str = ""                 # the result shape, as printed


def _arrays(shape_text: str) -> list[tuple[int, int]]:
  out = []
  for dtype, dims in _ARRAY.findall(shape_text):
    if dtype in _BITS:
      sizes = [int(d) for d in dims.split(",") if d]
      out.append((math.prod(sizes) * _BITS[dtype] // 8, len(sizes)))
  return out


def _split_call(rest: str) -> tuple[str, str]:
  """'a, b), attrs' -> ('a, b', 'attrs'): the operand list of an instruction and what follows it."""
  depth = 0
  for i, ch in enumerate(rest):
    if ch in "({[":
      depth += 1
    elif ch in ")}]":
      if depth == 0:
        return rest[:i], rest[i + 1:]
      depth -= 1
  return rest, ""


def parse_module(text: str) -> tuple[dict[str, list[Instr]], str, dict[str, int]]:
  computations: dict[str, list[Instr]] = {}
  entry, current = "", None
  header = {}
  for line in text.splitlines():
    if line.startswith("HloModule"):
      header = {k: int(v) for k, v in re.findall(r"\b(num_partitions|replica_count)=(\d+)", line)}
      continue
    if current is None:
      if m := _COMPUTATION.match(line):
        current = m[2]
        computations[current] = []
        if m[1]:
          entry = current
      continue
    if line.startswith("}"):
      current = None
      continue
    if m := _INSTR.match(line):
      operands, _ = _split_call(m[4])
      computations[current].append(Instr(
          name=m[1], opcode=m[3], arrays=_arrays(m[2]), operands=re.findall(r"%([\w.\-]+)", operands),
          rest=m[4], root=line.lstrip().startswith("ROOT"), shape=m[2]))
  if not entry:
    raise InputError("No ENTRY computation in the HLO text; pass `compiled.as_text()` of a compiled executable.")
  return computations, entry, header


def trip_count(while_instr: Instr, computations: dict[str, list[Instr]], table: dict[str, Instr]) -> int | None:
  if m := re.search(r'"known_trip_count":\{"n":"(\d+)"', while_instr.rest):
    return int(m[1])
  cond = re.search(r"condition=%([\w.\-]+)", while_instr.rest)
  body = computations.get(cond[1], []) if cond else []
  local = {i.name: i for i in body}
  root = next((i for i in body if i.root), None)
  if root is None or root.opcode != "compare" or len(root.operands) != 2:
    return None
  direction = re.search(r"direction=(\w+)", root.rest)
  a, b = (local.get(n) for n in root.operands)
  if a is None or b is None or direction is None:
    return None
  flip = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}
  op = direction[1]
  if a.opcode == "constant":  # N > i  ==  i < N
    a, b, op = b, a, flip.get(op, op)
  if b.opcode != "constant" or a.opcode != "get-tuple-element" or op not in ("LT", "LE"):
    return None
  limit = re.match(r"\s*(-?\d+)\)", b.rest)
  index = re.search(r"index=(\d+)", a.rest)
  if not limit or not index:
    return None
  start = 0
  init = table.get(while_instr.operands[0]) if while_instr.operands else None
  if init is not None and init.opcode == "tuple" and int(index[1]) < len(init.operands):
    first = table.get(init.operands[int(index[1])])
    if first is not None and first.opcode == "constant" and (s := re.match(r"\s*(-?\d+)\)", first.rest)):
      start = int(s[1])
  return max(int(limit[1]) - start + (op == "LE"), 0)


def executions(computations, entry) -> tuple[dict[str, int], list[str]]:
  """How many times each computation runs per call of the entry computation."""
  edges: dict[str, list[tuple[str, int]]] = defaultdict(list)
  unknown = []
  for comp, instrs in computations.items():
    table = {i.name: i for i in instrs}
    for i in instrs:
      if i.opcode == "while":
        trips = trip_count(i, computations, table)
        if trips is None:
          unknown.append(i.name)
          trips = 1
        for callee in re.findall(r"(?:body|condition)=%([\w.\-]+)", i.rest):
          edges[comp].append((callee, trips))
      elif i.opcode.endswith("-done") or i.opcode == "async-update":
        continue  # the -start op already called the computation
      else:
        for callee in re.findall(r"(?:calls|true_computation|false_computation)=%([\w.\-]+)", i.rest):
          edges[comp].append((callee, 1))
        if branches := re.search(r"branch_computations=\{([^}]*)\}", i.rest):
          edges[comp].extend((c, 1) for c in re.findall(r"%([\w.\-]+)", branches[1]))
  reachable, stack = {entry}, [entry]
  while stack:
    for callee, _ in edges[stack.pop()]:
      if callee not in reachable:
        reachable.add(callee)
        stack.append(callee)
  indegree = defaultdict(int)
  for comp in reachable:
    for callee, _ in edges[comp]:
      indegree[callee] += 1
  counts = defaultdict(int, {entry: 1})
  ready = [entry]
  while ready:
    comp = ready.pop()
    for callee, factor in edges[comp]:
      counts[callee] += counts[comp] * factor
      indegree[callee] -= 1
      if indegree[callee] == 0:
        ready.append(callee)
  return counts, unknown


def array_dims(shape_text: str) -> list[int]:
  """The dimensions of the first array in a printed shape."""
  found = _ARRAY.search(shape_text)
  return [int(d) for d in found[2].split(",") if d] if found else []
