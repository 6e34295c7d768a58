"""`python -m bench.compile_depth`: compile time of the train step against depth. With `nn.scan` over the one
shared layer the HLO holds the layer once, so L=24 should compile about as fast as L=12; the Python-loop path
(scan_layers=False) and the fully unrolled scan (scan_unroll=L, faster steps on CPU) hold L copies and grow with L.
Lowering (tracing) and XLA compilation are reported apart.

  python -m bench.compile_depth --size base --depths 12,24
"""
from __future__ import annotations

from bench import common

MODULE = "bench.compile_depth"


def main(argv=None) -> dict:
  p = common.parser(__doc__)
  p.add_argument("--depths", default="12,24", help="comma-separated num_hidden_layers")
  p.add_argument("--repeats", type=int, default=2, help="compiles per case, alternating order; the fastest counts")
  args = p.parse_args(argv)
  depths = [int(d) for d in args.depths.split(",")]
  paths = {"scan": dict(scan_layers=True, scan_unroll=1), "scan unrolled": dict(scan_layers=True),
           "python loop": dict(scan_layers=False, scan_unroll=1)}
  cases = [(path, depth) for path in paths for depth in depths]
  best: dict = {}
  for repeat in range(args.repeats):   # alternate the order: the process's first compile also warms up XLA
    for path, depth in (cases if repeat % 2 == 0 else cases[::-1]):
      changes = {"scan_unroll": depth, **paths[path], "num_hidden_layers": depth}
      _, lower_s, compile_s = common.compile_step(common.build_step(common.bench_config(args, **changes)))
      print(f"  {path:13s} L={depth:3d}: lower {lower_s:.2f} s, compile {compile_s:.2f} s", flush=True)
      if (path, depth) not in best or lower_s + compile_s < sum(best[path, depth]):
        best[path, depth] = (lower_s, compile_s)
  rows = [{"path": path, "layers": depth, "lower_s": best[path, depth][0], "compile_s": best[path, depth][1],
           "total_s": sum(best[path, depth])} for path, depth in cases]
  for row in rows:
    first = next(r for r in rows if r["path"] == row["path"])
    row["vs_shallowest"] = row["total_s"] / first["total_s"]
  common.print_table(rows, (("path", "path", ""), ("layers", "layers", "d"), ("lower s", "lower_s", ".2f"),
                            ("compile s", "compile_s", ".2f"), ("total s", "total_s", ".2f"),
                            (f"vs L={depths[0]}", "vs_shallowest", ".2f")),
                     f"train-step compile time vs depth: {common.describe(common.bench_config(args))}")
  payload = {"repeats": args.repeats, "config": common.describe(common.bench_config(args)), "depths": depths,
             "rows": rows}
  common.write_json(args, "compile_depth", MODULE, payload)
  return payload


if __name__ == "__main__":
  main()
