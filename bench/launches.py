"""`python -m bench.launches RESULT.json ...`: several launches of one benchmark command (`bench.train_step`,
`bench.compile_depth`, `bench.speed_table` or `bench.step_parts`) summarized as the README quotes them: per row the
median and range of its figures (tokens/s or ms, and the fraction of the same-run `jnp.dot` rate; compile times;
speed relative to BERT-large), the median and range of every ratio and derived figure, and how quiet the machine
was (the other processes' CPU share, the load).

  python -m bench.launches bench/results/train_step_base_cpu_run{1,2,3}.json
  python -m bench.launches bench/results/compile_depth_run{1,2,3}.json
  python -m bench.launches bench/results/step_parts_tiny256_run{1,2,3}.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from typing import Any, Sequence

# Per benchmark, the row figures summarized: (field, how it is printed).
FIGURES = {"train_step": (("tokens_per_s", ",.0f", " tokens/s"), ("fraction_of_matmul", ".1%", " of jnp.dot")),
           "compile_depth": (("compile_s", ".2f", " s compile"), ("total_s", ".2f", " s with lowering"),
                             ("vs_shallowest", ".2f", "x the shallowest")),
           "speed_table": (("tokens_per_s", ",.0f", " tokens/s"), ("fraction_of_matmul", ".1%", " of jnp.dot"),
                           ("relative", ".2f", "x BERT-large")),
           "step_parts": (("median_ms", ",.1f", " ms"), ("fraction_of_matmul", ".1%", " of jnp.dot"))}


def spread(values: Sequence[float]) -> dict[str, float]:
  return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def row_name(row: dict[str, Any]) -> str:
  return row["name"] if "name" in row else f"{row['path']} L={row['layers']}"


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Launches of one command -> {runners: {row: {figure: spread}}, ratios, machine}."""
  commands = {r["environment"]["command"].rsplit(" --name", 1)[0] for r in records}
  if len(commands) != 1:
    raise SystemExit(f"the results come from different commands: {sorted(commands)}")
  benchmark = records[0].get("benchmark", "train_step")
  rows = [{row_name(row): row for row in r["rows"]} for r in records]
  runners = {}
  for name in rows[0]:
    figures = {}
    for field, _, _ in FIGURES[benchmark]:
      values = [r[name][field] for r in rows if r[name].get(field) is not None]
      if values:   # the matmul rows have no tokens/s: their rate is in `machine`
        figures[field] = spread(values)
    if figures:
      runners[name] = figures
  machines = [r["environment"]["machine"] for r in records]
  rates = [m["matmul_tflops_per_s"] for m in machines if m.get("matmul_tflops_per_s")]
  return {"launches": len(records), "command": commands.pop(), "benchmark": benchmark, "runners": runners,
          "ratios": {k: spread([r["ratios"][k] for r in records]) for k in records[0].get("ratios", {})},
          "derived": {k: spread([r["derived"][k] for r in records]) for k in records[0].get("derived", {})},
          "machine": {"other_cpu_share_during_run": spread([m["other_cpu_share_during_run"] for m in machines]),
                      "loadavg_1min_at_start": spread([m["start"]["loadavg"][0] for m in machines]),
                      "matmul_tflops_per_s": spread(rates) if rates else None}}


def fmt(s: dict[str, float], spec: str) -> str:
  return f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("results", nargs="+", help="benchmark JSON files, one per launch of the same command")
  p.add_argument("--output", help="also write the summary here as JSON")
  args = p.parse_args(argv)
  records = []
  for path in args.results:
    with open(path) as f:
      records.append(json.load(f))
  out = summarize(records)
  print(f"{out['launches']} launches of: {out['command']}")
  print("median (min-max) over the launches")
  for name, figures in out["runners"].items():
    print(f"  {name:22s} " + ", ".join(f"{fmt(figures[field], spec)}{unit}"
                                        for field, spec, unit in FIGURES[out["benchmark"]] if field in figures))
  for name, ratio in out["ratios"].items():
    print(f"  {name:45s} {fmt(ratio, '.2f')}x")
  for name, value in out["derived"].items():
    print(f"  {name:45s} {fmt(value, '.3g')}")
  m = out["machine"]
  matmul = f", jnp.dot {fmt(m['matmul_tflops_per_s'], '.3f')} TFLOP/s" if m["matmul_tflops_per_s"] else ""
  print(f"  machine: other processes {fmt(m['other_cpu_share_during_run'], '.2f')} cores during the runs, 1-min "
        f"load at start {fmt(m['loadavg_1min_at_start'], '.2f')}{matmul}")
  if args.output:
    with open(args.output, "w") as f:
      json.dump(out, f, indent=2)
  return out


if __name__ == "__main__":
  main()
