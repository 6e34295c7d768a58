"""`python -m bench.roofline HLO [--trace DIR_OR_FILE]`: a roofline estimate of a compiled step, kernel by kernel,
from its optimized HLO text, so that a change can be judged before a GPU measures it. `bench.train_step --profile
DIR` writes the HLO beside its trace; without a GPU, `compiled.as_text()` of the step compiled for one on the CPU
(`bench.gpu_compile`'s `tpu_compile.compile_for(..., keep_compiled=True)`) is the same text.

Each instruction that launches a kernel (a fusion, a library call such as a cuBLAS GEMM or cuDNN attention, a
copy, ...) counts once per execution of its computation, while-loop trips included (hlo_text.executions; XLA
runs a loop whose trip count it knows without evaluating its condition). Its time is max(FLOPs / peak, bytes / HBM
bandwidth) (+ --launch-us): FLOPs of its dots (compile_stats.dot_flops) or of cuDNN flash attention (4 B heads T T
d forward, 2.5x that backward); bytes are what it must read and write, a lower bound on its HBM traffic: each
operand and result once, no workspace, only the slice a dynamic-slice reads and only the update an in-place
dynamic-update-slice or scatter writes. The defaults are an H200's: 989.4 TFLOP/s dense bf16, 4.8 TB/s.

With --trace, the trace's kernels are matched to the instructions. XLA names a fusion's kernel after it
(`input_scatter_fusion.1` runs as `input_scatter_fusion_1`) or runs the kernel of a fusion alike but for names,
placed by program order; a library kernel (cuBLAS's `nvjet_*`, cuDNN's) or a
memcpy names its instruction in the event's `hlo_op`, or, inside a CUDA graph (`hlo_op` is `command_buffer_N`),
goes to the next instruction of its kind in program order before the next named kernel: the memcpy kernels there
are the loop's async dynamic slices and updates (`fusion-start`). Memsets have no instruction ("other").

  python -m bench.roofline bench/results/profile_base_s128_h200/train_step.hlo.txt.gz \\
      --trace bench/results/profile_base_s128_h200 --output bench/results/roofline_base_s128_h200.json
"""
from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import gzip
import json
import math
import os
import re
from typing import Any, Sequence

from albert_jax import compile_stats, hlo_text
from albert_jax.errors import InputError, MissingFileError, one_line_user_errors
from bench import gpu_trace

CATEGORIES = ("matmul", "attention", "elementwise/loop fusion", "reduction/input fusion", "copies",
              "dynamic slices/updates", "scatter", "other")
H200_TFLOPS = 989.4   # dense bf16 tensor cores (an H100 SXM's too)
H200_TBPS = 4.8       # HBM3e (an H100 SXM: 3.35)
_NO_KERNEL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
              "async-start", "after-all", "add-dependency", "opt-barrier", "partition-id", "replica-id"}
_SLICES = ("dynamic-slice", "slice", "gather")
_IN_PLACE = ("dynamic-update-slice", "scatter")
_LIBRARY = (("attention", re.compile(r"cudnn|fmha|flash|sdpa", re.I)),
            ("matmul", re.compile(r"nvjet|cutlass|cublas|gemm|xmma", re.I)),
            ("memcpy", re.compile(r"^memcpy", re.I)))
_FAMILY_DEFAULT = {"attention": "attention", "matmul": "matmul", "memcpy": "copies"}


@dataclasses.dataclass(frozen=True)
class Launch:
  """One kernel-launching HLO instruction; flops and bytes per execution."""
  name: str
  computation: str
  category: str
  executions: int   # per step
  flops: int
  bytes: int
  fingerprint: str = ""   # a fusion's computation without names: XLA gives fusions alike one kernel

  @property
  def kernel(self) -> str:
    """The name XLA gives the kernel of a fusion."""
    return re.sub(r"[.\-]", "_", self.name)

  @property
  def family(self) -> str | None:
    """What its kernels look like when they are not named after it (see _LIBRARY)."""
    if self.category in ("matmul", "attention"):
      return self.category
    return "memcpy" if self.category in ("copies", "dynamic slices/updates") else None

  def seconds(self, flops_per_s: float, bytes_per_s: float, launch_s: float = 0.0) -> float:
    """One execution's roofline time."""
    return max(self.flops / flops_per_s, self.bytes / bytes_per_s) + launch_s


@dataclasses.dataclass(frozen=True)
class Program:
  launches: dict[str, Launch]   # by instruction name
  order: tuple[str, ...]        # one step's launches in execution order (loop bodies repeated)
  unknown_trip_counts: tuple[str, ...]


def _size(instr: hlo_text.Instr) -> int:
  return sum(b for b, _ in instr.arrays)


def _ints(text: str) -> list[int]:
  return [int(d) for d in re.findall(r"\d+", text)]


def _callees(i: hlo_text.Instr) -> list[str]:
  """The computations a control-flow instruction runs, in order, as kernels of their own; a while loop's once per
  trip (its condition first, unless XLA knows the trip count and runs the body only)."""
  if i.opcode == "while":
    condition = [] if _known_trips(i) else re.findall(r"condition=%([\w.\-]+)", i.rest)
    return condition + re.findall(r"body=%([\w.\-]+)", i.rest)
  if i.opcode == "conditional":   # every branch: an upper bound, as hlo_text.executions counts it
    branches = re.search(r"branch_computations=\{([^}]*)\}", i.rest)
    return (re.findall(r"(?:true|false)_computation=%([\w.\-]+)", i.rest)
            + (re.findall(r"%([\w.\-]+)", branches[1]) if branches else []))
  if i.opcode == "async-start":
    return re.findall(r"\bcalls=%([\w.\-]+)", i.rest)
  return []


def _known_trips(i: hlo_text.Instr) -> bool:
  return '"known_trip_count"' in i.rest


def _fused_flops(name: str, computations: dict[str, list[hlo_text.Instr]]) -> int:
  body = computations[name]
  table = {i.name: i for i in body}
  total = 0
  for i in body:
    if i.opcode in ("dot", "convolution"):
      total += compile_stats.dot_flops(i, table)
    total += sum(_fused_flops(c, computations) for c in re.findall(r"\bcalls=%([\w.\-]+)", i.rest))
  return total


def _fused_bytes(fusion: hlo_text.Instr, table: dict[str, hlo_text.Instr], body: list) -> tuple[int, list]:
  """(bytes read and written, the fusion's outputs) of a fusion with operands in `table` and computation `body`."""
  local = {i.name: i for i in body}
  uses = collections.defaultdict(list)   # name -> [(user, operand index)]
  for i in body:
    for k, operand in enumerate(i.operands):
      uses[operand].append((i, k))

  def users(name: str) -> list:   # looking through bitcasts
    return [u for user, k in uses[name] for u in (users(user.name) if user.opcode == "bitcast" else [(user, k)])]

  def source(name: str) -> hlo_text.Instr:
    i = local[name]
    return source(i.operands[0]) if i.opcode == "bitcast" else i

  root = next(i for i in body if i.root)
  outputs = [source(n) for n in root.operands] if root.opcode == "tuple" else [source(root.name)]
  written, in_place = 0, set()
  for out in outputs:
    target = source(out.operands[0]) if out.opcode in _IN_PLACE else None
    if target is not None and target.opcode == "parameter":
      in_place.add(target.name)
      half = (len(out.operands) + 1) // 2   # scatter(inputs..., indices, updates...)
      updates = out.operands[1:2] if out.opcode == "dynamic-update-slice" else out.operands[half:]
      written += sum(_size(local[u]) for u in updates)
    else:
      written += _size(out)
  read = collections.Counter()   # operand -> bytes (an operand passed twice is read once)
  for p in (i for i in body if i.opcode == "parameter"):
    operand = fusion.operands[int(re.match(r"\s*(\d+)", p.rest)[1])]
    found = users(p.name)
    if p.name in in_place and all(u.opcode in _IN_PLACE and k == 0 for u, k in found):
      size = 0
    elif found and all(u.opcode in _SLICES and k == 0 for u, k in found):
      size = sum(_size(u) for u, _ in found)
    else:
      size = _size(table[operand]) if operand in table else _size(p)
    read[operand] = max(read[operand], size)
  return sum(read.values()) + written, outputs


def _library_flops(i: hlo_text.Instr, table: dict[str, hlo_text.Instr], target: str) -> int:
  if "fmha" in target:   # cuDNN flash attention: Q K^T and P V forward; with S recomputed, dV, dP, dQ, dK backward
    scores = re.search(r'"intermediate_tensor_shape":\{"dimensions":\[([^\]]*)\]', i.rest)
    head = hlo_text.array_dims(table[i.operands[0]].shape)[-1]
    forward = 4 * math.prod(_ints(scores[1])) * head if scores else 0
    return forward * 5 // 2 if "Backward" in target else forward
  contracting = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', i.rest)
  if not contracting:
    return 0
  lhs = hlo_text.array_dims(table[i.operands[0]].shape)
  return 2 * math.prod(hlo_text.array_dims(i.shape)) * math.prod(lhs[d] for d in _ints(contracting[1]))


def _canonical(comp: str, computations: dict[str, list[hlo_text.Instr]]) -> str:
  """A computation's text with its own names numbered and those of the computations it calls replaced by theirs."""
  body = computations[comp]
  number = {b.name: str(k) for k, b in enumerate(body)}

  def name(m: re.Match) -> str:
    if m[1] in number:
      return "%" + number[m[1]]
    return "{" + _canonical(m[1], computations) + "}" if m[1] in computations else m[0]

  return "\n".join(f"{b.opcode} {b.shape} " + re.sub(r"%([\w.\-]+)", name, re.sub(r"metadata=\{[^}]*\}", "", b.rest))
                   for b in body)


def _fingerprint(i: hlo_text.Instr, computations: dict[str, list[hlo_text.Instr]]) -> str:
  """Fusions alike but for names run one kernel, named after one of them (XLA's kernel cache): e.g. the casts of
  the key and value projections' weights run the query's."""
  callee = re.search(r"\bcalls=%([\w.\-]+)", i.rest)[1]
  kind = re.search(r"\bkind=(\w+)", i.rest)[1]
  return f"{i.opcode} {kind} {i.shape}\n{_canonical(callee, computations)}"


def _launch(i: hlo_text.Instr, table: dict, computations: dict) -> tuple[str, int, int]:
  """(category, FLOPs, bytes) of one execution of a kernel-launching instruction."""
  operands = sum(_size(table[n]) for n in dict.fromkeys(i.operands) if n in table)
  if i.opcode in ("fusion", "fusion-start"):
    kind = re.search(r"\bkind=(\w+)", i.rest)
    callee = re.search(r"\bcalls=%([\w.\-]+)", i.rest)[1]
    body = computations[callee]
    flops = _fused_flops(callee, computations)
    moved, outputs = _fused_bytes(i, table, body)
    if flops:
      category = "matmul"
    elif any(b.opcode == "scatter" for b in body):
      category = "scatter"
    elif all(o.opcode in ("dynamic-slice", "dynamic-update-slice") for o in outputs):
      category = "dynamic slices/updates"
    elif kind[1] == "kInput" or kind[1] != "kLoop" and any(b.opcode == "reduce" for b in body):
      category = "reduction/input fusion"   # kInput: a reduction or transpose; kCustom: XLA's Triton emitter
    else:
      category = "elementwise/loop fusion"
    return category, flops, moved
  result = _size(i)
  if i.opcode == "custom-call":
    target = re.search(r'custom_call_target="([^"]+)"', i.rest)
    target = target[1] if target else ""
    if len(i.arrays) > 1 and re.search(r"\b[su]8\[\d+\]\{0\}\)$", i.shape.strip()):
      result -= i.arrays[-1][0]   # the library's workspace
    category = ("attention" if "fmha" in target else
                "matmul" if re.search(r"cublas|gemm|conv", target, re.I) else "other")
    return category, _library_flops(i, table, target) if category != "other" else 0, operands + result
  if i.opcode in ("dot", "convolution"):
    return "matmul", compile_stats.dot_flops(i, table), operands + result
  category = {"copy": "copies", "copy-start": "copies", "dynamic-slice": "dynamic slices/updates",
              "dynamic-update-slice": "dynamic slices/updates", "scatter": "scatter"}.get(i.opcode, "other")
  return category, 0, operands + result


def read_program(text: str) -> Program:
  """Every kernel-launching instruction of an optimized HLO module, with its executions per step, and their order."""
  computations, entry, _ = hlo_text.parse_module(text)
  counts, unknown = hlo_text.executions(computations, entry)
  for comp in computations.values():   # executions() counts a condition once per trip; see _callees
    for i in comp:
      if i.opcode == "while" and _known_trips(i):
        counts.update({c: 0 for c in re.findall(r"condition=%([\w.\-]+)", i.rest)})
  launches: dict[str, Launch] = {}
  order: list[str] = []

  def walk(comp: str) -> None:
    table = {i.name: i for i in computations[comp]}
    for i in computations[comp]:
      if callees := _callees(i):
        trips = (hlo_text.trip_count(i, computations, table) or 1) if i.opcode == "while" else 1
        for _ in range(trips):
          for callee in callees:
            walk(callee)
      elif i.opcode not in _NO_KERNEL and not i.opcode.endswith("-done"):
        if i.name not in launches:
          category, flops, moved = _launch(i, table, computations)
          fingerprint = _fingerprint(i, computations) if i.opcode in ("fusion", "fusion-start") else ""
          launches[i.name] = Launch(i.name, comp, category, counts[comp], flops, moved, fingerprint)
        order.append(i.name)

  walk(entry)
  return Program(launches, tuple(order), tuple(unknown))


# ---------------------------------------------------------------------------------------------------- the trace


def _family(kernel: str) -> str | None:
  return next((family for family, pattern in _LIBRARY if pattern.search(kernel)), None)


def measure(trace: dict[str, Any], program: Program) -> dict[str, Any]:
  """The trace's device kernels per step, by category, and by instruction where a kernel names its fusion."""
  summary = gpu_trace.summarize(trace)
  devices = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "M" and e.get("name") == "process_name"
             and e["args"]["name"].startswith("/device:")}
  kernels = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X" and e["pid"] in devices),
                   key=lambda e: e["ts"])
  names = {e["name"] for e in kernels}
  order = [program.launches[n] for n in program.order]
  reusing = collections.defaultdict(set)   # fingerprint -> fusions that run another's kernel
  for launch in program.launches.values():
    if launch.fingerprint and launch.kernel not in names:
      reusing[launch.fingerprint].add(launch.name)
  runs = {l.kernel: {l.name} | reusing[l.fingerprint] for l in program.launches.values() if l.kernel in names}
  at = {kernel: [k for k, l in enumerate(order) if l.name in mine] for kernel, mine in runs.items()}
  anchors = sorted(k for places in at.values() for k in places)
  time, count = collections.Counter(), collections.Counter()
  by_instruction, calls, unmatched = collections.Counter(), collections.Counter(), collections.Counter()
  place = 0   # in `order`, after the last kernel placed
  for e in kernels:
    name, op = e["name"], e.get("args", {}).get("hlo_op", "")
    place %= len(order)
    launch = program.launches.get(op)
    if launch is None and name in at:
      places = at[name]
      place = places[bisect.bisect_left(places, place) % len(places)] + 1
      launch = order[place - 1]
    if launch is not None:
      by_instruction[launch.name] += e["dur"]
      calls[launch.name] += 1
      category = launch.category
    elif family := _family(name):   # a library kernel or memcpy in a CUDA graph: the next of its kind
      end = anchors[bisect.bisect_left(anchors, place)] if anchors and place <= anchors[-1] else len(order)
      found = next((k for k in range(place, end) if order[k].family == family), None)
      if found is None:
        category = _FAMILY_DEFAULT[family]
        unmatched[name] += e["dur"]
      else:
        category = order[found].category
        if family == "memcpy":   # one per instruction; a library call may run several kernels
          by_instruction[order[found].name] += e["dur"]
          calls[order[found].name] += 1
          found += 1
        place = found
    else:
      category = "other"
      unmatched[name] += e["dur"]
    time[category] += e["dur"]
    count[category] += 1
  steps = summary["steps"]
  return {"steps": steps, "busy_ms": summary["busy_ms_per_step"], "idle_ms": summary["idle_ms_per_step"],
          "kernels": summary["kernels_per_step"],
          "categories": {c: {"kernels": count[c] / steps, "ms": time[c] / 1e3 / steps} for c in CATEGORIES},
          "instructions": {n: {"kernels": calls[n] / steps, "ms": t / 1e3 / steps} for n, t in by_instruction.items()},
          "unmatched": {n: t / 1e3 / steps for n, t in unmatched.most_common()}}


# ---------------------------------------------------------------------------------------------------- the report


def estimate(program: Program, peak_tflops: float = H200_TFLOPS, hbm_tbps: float = H200_TBPS,
             launch_us: float = 0.0, measured: dict[str, Any] | None = None) -> dict[str, Any]:
  """Per category and per instruction: launches, GFLOP, GB and estimated ms per step (+ measured ms if given)."""
  flops_per_s, bytes_per_s, launch_s = peak_tflops * 1e12, hbm_tbps * 1e12, launch_us * 1e-6
  rows = []
  for l in program.launches.values():
    seconds = l.seconds(flops_per_s, bytes_per_s, launch_s)
    rows.append({"instruction": l.name, "computation": l.computation, "category": l.category,
                 "launches": l.executions, "gflop": l.flops * l.executions / 1e9,
                 "gb": l.bytes * l.executions / 1e9, "estimated_ms": seconds * l.executions * 1e3,
                 "bound": "compute" if l.flops / flops_per_s > l.bytes / bytes_per_s else "memory"})
    if measured is not None and l.name in measured["instructions"]:
      rows[-1].update(measured_kernels=measured["instructions"][l.name]["kernels"],
                      measured_ms=measured["instructions"][l.name]["ms"])
  rows.sort(key=lambda r: -r["estimated_ms"])
  categories = {}
  for c in CATEGORIES:
    mine = [r for r in rows if r["category"] == c]
    categories[c] = {k: sum(r[k] for r in mine) for k in ("launches", "gflop", "gb", "estimated_ms")}
    if measured is not None:
      m = measured["categories"][c]
      estimated = categories[c]["estimated_ms"]   # no ratio to an estimate under a microsecond
      categories[c].update(measured_kernels=m["kernels"], measured_ms=m["ms"],
                           ratio=m["ms"] / estimated if estimated >= 1e-3 else None)
  total = {k: sum(c[k] for c in categories.values()) for k in ("launches", "gflop", "gb", "estimated_ms")}
  total.update(compute_ms=total["gflop"] / peak_tflops, memory_ms=total["gb"] / hbm_tbps)
  if measured is not None:
    total.update(measured_kernels=measured["kernels"], measured_ms=measured["busy_ms"],
                 ratio=measured["busy_ms"] / total["estimated_ms"], idle_ms=measured["idle_ms"])
  return {"peak_tflops": peak_tflops, "hbm_tbps": hbm_tbps, "launch_us": launch_us,
          "unknown_trip_counts": list(program.unknown_trip_counts), "categories": categories, "total": total,
          "instructions": rows, **({"unmatched_kernels": measured["unmatched"]} if measured is not None else {})}


def read_text(path: str) -> str:
  """A text file, gzipped or not."""
  if not os.path.isfile(path):
    raise MissingFileError(f"{path}: no such file; pass the optimized HLO text (`bench.train_step --profile DIR` "
                           f"writes DIR/{gpu_trace.HLO_FILE}).")
  with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
    return f.read()


def _print(out: dict[str, Any], top: int) -> None:
  measured = "measured_ms" in out["total"]
  print(f"roofline at {out['peak_tflops']} TFLOP/s and {out['hbm_tbps']} TB/s"
        + (f", {out['launch_us']} us per launch" if out["launch_us"] else ""))
  head = f"{'category':24s} {'launches':>8s} {'GFLOP':>8s} {'GB':>7s} {'est ms':>7s}"
  print(head + (f" {'kernels':>8s} {'meas ms':>8s} {'meas/est':>8s}" if measured else ""))
  for name, c in [*out["categories"].items(), ("total", out["total"])]:
    line = f"{name:24s} {c['launches']:8.0f} {c['gflop']:8.1f} {c['gb']:7.2f} {c['estimated_ms']:7.3f}"
    if measured:
      ratio = f"{c['ratio']:8.2f}" if c["ratio"] is not None else f"{'-':>8s}"
      line += f" {c['measured_kernels']:8.0f} {c['measured_ms']:8.3f} {ratio}"
    print(line)
  t = out["total"]
  print(f"bounds alone: compute {t['compute_ms']:.3f} ms, memory {t['memory_ms']:.3f} ms" + (
      f"; measured {t['measured_ms']:.2f} ms of kernels and {t['idle_ms']:.2f} ms idle a step" if measured else ""))
  rows = out["instructions"]
  lists = [("by estimated time", rows[:top])]
  if measured:   # library calls run unnamed kernels: their time is in their category only
    gap = sorted((r for r in rows if "measured_ms" in r), key=lambda r: r["estimated_ms"] - r["measured_ms"])
    lists.append(("furthest below their roof (measured - estimated)", gap[:top]))
  for title, chosen in lists:
    print(f"{title}:\n{'est ms':>8s}" + (f" {'meas ms':>8s}" if measured else "")
          + f" {'launches':>8s}  instruction (category, bound)")
    for r in chosen:
      meas = f" {r['measured_ms']:8.3f}" if "measured_ms" in r else f" {'-':>8s}"
      print(f"{r['estimated_ms']:8.3f}" + (meas if measured else "")
            + f" {r['launches']:8d}  {r['instruction']} ({r['category']}, {r['bound']})")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("hlo", help="the step's optimized HLO text (.txt or .txt.gz)")
  p.add_argument("--trace", default="", help="a *.trace.json.gz, or the directory `bench.train_step --profile` "
                 "wrote: adds the measured time per category")
  p.add_argument("--peak-tflops", type=float, default=H200_TFLOPS,
                 help="peak matmul rate in TFLOP/s (default %(default)s: an H200's dense bf16, an H100 SXM's too)")
  p.add_argument("--hbm-tbps", type=float, default=H200_TBPS,
                 help="HBM bandwidth in TB/s (default %(default)s: an H200's; an H100 SXM has 3.35)")
  p.add_argument("--launch-us", type=float, default=0.0, help="fixed cost added to each launch, in microseconds")
  p.add_argument("--top", type=int, default=15, help="instructions printed in each list")
  p.add_argument("--output", help="also write the estimate (every instruction) here as JSON")
  args = p.parse_args(argv)
  with one_line_user_errors():
    if min(args.peak_tflops, args.hbm_tbps) <= 0 or args.launch_us < 0:
      raise InputError("--peak-tflops and --hbm-tbps must be positive and --launch-us not negative.")
    program = read_program(read_text(args.hlo))
    measured = None
    if args.trace:
      with gzip.open(gpu_trace.find_trace(args.trace), "rt") as f:
        measured = measure(json.load(f), program)
  out = {"hlo": args.hlo, "trace": args.trace or None,
         **estimate(program, args.peak_tflops, args.hbm_tbps, args.launch_us, measured)}
  _print(out, args.top)
  if args.output:
    with open(args.output, "w") as f:   # to a nanosecond, a kB and a kFLOP
      json.dump(json.loads(json.dumps(out), parse_float=lambda x: round(float(x), 6)), f, indent=1)
    print(f"wrote {args.output}")
  return out


if __name__ == "__main__":
  main()
