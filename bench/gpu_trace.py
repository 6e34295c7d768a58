"""`python -m bench.gpu_trace DIR_OR_TRACE`: the device kernels of a jax.profiler trace, summed over its steps. A
lent GPU's minutes are few; its trace comes back as one file and is read here: per kernel the time and calls per
step, the share of the device's busy time, and the HLO op it ran for, with the busy and idle time per step.

`bench.train_step --profile DIR` traces 5 steps, each inside a "train" step annotation, into
DIR/plugins/profile/<run>/<host>.trace.json.gz (Chrome trace format), and writes the compiled step's HLO beside it
(DIR/train_step.hlo.txt). XLA names a fusion's kernel after the fusion (`input_scatter_fusion.1` runs as
`input_scatter_fusion_1`), so the HLO gives most kernels the `op_name` of the model code they came from (library
matmuls such as cuBLAS's `nvjet_*` keep their own names). On an H100 that put the token-type embedding's gradient,
a scatter-add into 2 rows, at 146 of ALBERT-base's 196 ms (docs/profiling.md "GPU").

  python -m bench.gpu_trace /tmp/prof --top 25 --output bench/results/gpu_trace_base_s128.json
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
from typing import Any, Sequence

STEP_ANNOTATION = "train"   # bench.train_step.profile's jax.profiler.StepTraceAnnotation


def find_trace(path: str) -> str:
  """A .trace.json.gz itself, or the newest one under a profile directory."""
  if os.path.isfile(path):
    return path
  found = glob.glob(os.path.join(path, "**", "*.trace.json.gz"), recursive=True)
  if not found:
    raise SystemExit(f"no *.trace.json.gz under {path}: give the directory bench.train_step --profile wrote")
  return max(found, key=os.path.getmtime)


HLO_FILE = "train_step.hlo.txt"   # what bench.train_step.profile writes beside the trace
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = .*?metadata=\{op_name="([^"]*)"', re.M)


def op_names(hlo_text: str) -> dict[str, str]:
  """Kernel name -> the op_name of the HLO instruction it runs, for instructions whose name becomes the kernel's
  with "." and "-" as "_"."""
  names = {}
  for name, op_name in _INSTRUCTION.findall(hlo_text):
    names.setdefault(re.sub(r"[.\-]", "_", name), op_name)
  return names


def summarize(trace: dict[str, Any], steps: int | None = None, names: dict[str, str] | None = None) -> dict[str, Any]:
  """Kernels on the device processes (named "/device:..."), per step; steps from the "train" annotations; each
  kernel's op_name from `names` (`op_names`) where it has one."""
  events = trace["traceEvents"]
  devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
             and e["args"]["name"].startswith("/device:")}
  kernels = sorted((e for e in events if e.get("ph") == "X" and e["pid"] in devices), key=lambda e: e["ts"])
  if not kernels:
    raise SystemExit("the trace has no device kernels: was it taken on a GPU or TPU?")
  steps = steps or sum(1 for e in events if e.get("ph") == "X" and e["pid"] not in devices
                       and e["name"] == STEP_ANNOTATION) or 1
  time, calls, ops = collections.Counter(), collections.Counter(), {}
  for e in kernels:
    time[e["name"]] += e["dur"]
    calls[e["name"]] += 1
    ops.setdefault(e["name"], e.get("args", {}).get("hlo_op", ""))
  busy = sum(time.values())
  idle, end = 0.0, kernels[0]["ts"]
  for e in kernels:   # gaps while no kernel runs, between the first kernel's start and the last one's end
    idle += max(0.0, e["ts"] - end)
    end = max(end, e["ts"] + e["dur"])
  names = names or {}
  rows = [{"kernel": name, "hlo_op": ops[name], "op_name": names.get(name), "ms_per_step": t / 1e3 / steps,
           "calls_per_step": calls[name] / steps, "share": t / busy} for name, t in time.most_common()]
  return {"steps": steps, "busy_ms_per_step": busy / 1e3 / steps, "idle_ms_per_step": idle / 1e3 / steps,
          "kernels_per_step": len(kernels) / steps, "rows": rows}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("trace", help="a *.trace.json.gz, or the directory `bench.train_step --profile` wrote")
  p.add_argument("--steps", type=int, default=0, help="steps in the trace (0: count its 'train' annotations)")
  p.add_argument("--top", type=int, default=20, help="kernels printed")
  p.add_argument("--hlo", default="", help=f"the step's optimized HLO text (default: {HLO_FILE} in the directory "
                 "given, if there): names each kernel's model code")
  p.add_argument("--output", help="also write the summary (every kernel) here as JSON")
  args = p.parse_args(argv)
  path = find_trace(args.trace)
  hlo = args.hlo or (os.path.join(args.trace, HLO_FILE) if os.path.isdir(args.trace) else "")
  names = {}
  if hlo and os.path.exists(hlo):
    with open(hlo) as f:
      names = op_names(f.read())
  elif args.hlo:
    raise SystemExit(f"--hlo {args.hlo}: no such file")
  with gzip.open(path, "rt") as f:
    out = {"trace": path, "hlo": hlo if names else None, **summarize(json.load(f), args.steps or None, names)}
  print(f"{path}: {out['steps']} steps, {out['kernels_per_step']:.0f} kernels per step; device busy "
        f"{out['busy_ms_per_step']:.2f} ms and idle {out['idle_ms_per_step']:.2f} ms per step")
  print(f"{'ms/step':>9} {'calls':>6} {'share':>6}  kernel: op_name (or the HLO op the trace names)")
  for row in out["rows"][:args.top]:
    where = row["op_name"] or (row["hlo_op"] if row["hlo_op"] != row["kernel"] else "")
    print(f"{row['ms_per_step']:9.3f} {row['calls_per_step']:6.0f} {row['share']:6.1%}  {row['kernel']}"
          + (f": {where}" if where else ""))
  if args.output:
    with open(args.output, "w") as f:
      json.dump(out, f, indent=1)
    print(f"wrote {args.output}")
  return out


if __name__ == "__main__":
  main()
