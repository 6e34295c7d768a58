"""`python -m bench.launches RESULT.json ...`: several launches of one `bench.train_step` command summarized as the
README quotes them: per runner the median and range of tokens/s and of the fraction of the same-run `jnp.dot` rate,
the median and range of every ratio, and how quiet the machine was (the other processes' CPU share, the load).

  python -m bench.launches bench/results/train_step_base_cpu_run{1,2,3}.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from typing import Any, Sequence


def spread(values: Sequence[float]) -> dict[str, float]:
  return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Launches of one command -> {runners: {name: {tokens_per_s, fraction_of_matmul}}, ratios, machine}."""
  commands = {r["environment"]["command"].rsplit(" --name", 1)[0] for r in records}
  if len(commands) != 1:
    raise SystemExit(f"the results come from different commands: {sorted(commands)}")
  names = [row["name"] for row in records[0]["rows"]]
  rows = [{row["name"]: row for row in r["rows"]} for r in records]
  runners = {}
  for name in names:
    tokens = [r[name]["tokens_per_s"] for r in rows if r[name].get("tokens_per_s")]
    if not tokens:  # the matmul rows: their rate is in `machine`
      continue
    runners[name] = {"tokens_per_s": spread(tokens)}
    fractions = [r[name]["fraction_of_matmul"] for r in rows if r[name].get("fraction_of_matmul")]
    if fractions:
      runners[name]["fraction_of_matmul"] = spread(fractions)
  machines = [r["environment"]["machine"] for r in records]
  return {"launches": len(records), "command": commands.pop(), "runners": runners,
          "ratios": {k: spread([r["ratios"][k] for r in records]) for k in records[0]["ratios"]},
          "machine": {"other_cpu_share_during_run": spread([m["other_cpu_share_during_run"] for m in machines]),
                      "loadavg_1min_at_start": spread([m["start"]["loadavg"][0] for m in machines]),
                      "matmul_tflops_per_s": spread([m["matmul_tflops_per_s"] for m in machines])}}


def fmt(s: dict[str, float], spec: str) -> str:
  return f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("results", nargs="+", help="bench.train_step JSON files, one per launch of the same command")
  p.add_argument("--output", help="also write the summary here as JSON")
  args = p.parse_args(argv)
  records = []
  for path in args.results:
    with open(path) as f:
      records.append(json.load(f))
  out = summarize(records)
  print(f"{out['launches']} launches of: {out['command']}")
  print("median (min-max) over the launches")
  for name, fields in out["runners"].items():
    matmul = f", {fmt(fields['fraction_of_matmul'], '.1%')} of jnp.dot" if "fraction_of_matmul" in fields else ""
    print(f"  {name:22s} {fmt(fields['tokens_per_s'], ',.0f')} tokens/s{matmul}")
  for name, ratio in out["ratios"].items():
    print(f"  {name:45s} {fmt(ratio, '.2f')}x")
  m = out["machine"]
  print(f"  machine: other processes {fmt(m['other_cpu_share_during_run'], '.2f')} cores during the runs, 1-min "
        f"load at start {fmt(m['loadavg_1min_at_start'], '.2f')}, jnp.dot {fmt(m['matmul_tflops_per_s'], '.3f')} "
        "TFLOP/s")
  if args.output:
    with open(args.output, "w") as f:
      json.dump(out, f, indent=2)
  return out


if __name__ == "__main__":
  main()
