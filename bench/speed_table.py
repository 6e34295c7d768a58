"""`python -m bench.speed_table`: the ALBERT paper's Table 2 speed column on one device: BERT and ALBERT sizes at
the same sequence length and batch, interleaved, throughput relative to BERT-large next to the paper's and next to
what equal MFU would give (the ratio of FLOPs per token). `--max-batch` adds the largest micro batch per size with
and without remat, by binary search on XLA's compiled memory estimate against the device's memory (or
--memory-cap-gb; on CPU without a cap it is n/a).

On one device there is no gradient all-reduce, so expect ALBERT-large ≈ BERT-large (equal FLOPs per token), not
the paper's 1.7x: see EXPLANATION below and ../shared/PERFORMANCE.md §2. On CPU use --scale to shrink every
model's depth (the table says so); the relative numbers then follow the scaled FLOPs.

  python -m bench.speed_table --seq-len 512 --micro-batch 8                          # accelerator
  python -m bench.speed_table --scale 0.25 --seq-len 64 --micro-batch 2 --steps 5    # CPU
"""
from __future__ import annotations

import argparse

import jax

from albert_jax import flops, pretrain
from albert_jax.model_config import model_config_from
from bench import common

MODULE = "bench.speed_table"
# Lan et al. 2020, Table 2 "Speedup" (data throughput relative to BERT-large, same TPUs).
PAPER = {"bert_base": 4.7, "bert_large": 1.0, "base": 5.6, "large": 1.7, "xlarge": 0.6, "xxlarge": 0.3}
EXPLANATION = """\
Why the gaps: ALBERT-large and BERT-large do the same arithmetic per token (sharing reuses weights, every layer
still runs), so on one device with no gradient exchange their speeds match up to the cheaper E=128 MLM head. The
paper's 1.7x came from 64-512 TPU chips where BERT-large's 334M-parameter all-reduce and optimizer traffic
dominated; ALBERT's 18M parameters remove that communication (its authors: "less communication and fewer
computations"). Relative to BERT-large every ALBERT size reached 1.6-2.4x more FLOP/s on those TPUs (§2 of
../shared/PERFORMANCE.md). Here the 'equal-MFU' column (FLOPs ratio) is the single-device expectation; deviations
from it are MFU differences (small H underfills the matmul units, large H fills them)."""


def config_for(args: argparse.Namespace, size: str, **changes):
  """The size at the common seq/batch, depth scaled by --scale, dropout off for every size (a speed comparison)."""
  run_args = argparse.Namespace(**{**vars(args), "size": size, **changes})
  config = common.bench_config(run_args)
  config.model.num_hidden_layers = max(1, round(config.model.num_hidden_layers * args.scale))
  config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = 0.0
  return config


def largest_micro_batch(args, size: str, remat: str, cap: float) -> int:
  """Largest micro batch whose compiled step fits in `cap` bytes (doubling, then bisection; ≤ --max-batch-limit)."""
  def fits(batch: int) -> bool:
    used = common.step_memory_bytes(config_for(args, size, micro_batch=batch, accumulation=1, remat=remat))
    return used is not None and used <= cap
  if not fits(1):
    return 0
  low, high = 1, 2
  while high <= args.max_batch_limit and fits(high):
    low, high = high, high * 2
  if high > args.max_batch_limit:
    return low
  while high - low > 1:
    middle = (low + high) // 2
    low, high = (middle, high) if fits(middle) else (low, middle)
  return low


def memory_cap(args) -> float | None:
  if args.memory_cap_gb:
    return args.memory_cap_gb * 2**30
  stats = jax.devices()[0].memory_stats()
  return float(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def main(argv=None) -> dict:
  p = common.parser(__doc__)
  p.add_argument("--sizes", default="bert_base,bert_large,base,large,xlarge,xxlarge")
  p.add_argument("--scale", type=float, default=1.0, help="multiply every model's depth (CPU: e.g. 0.25)")
  p.add_argument("--max-batch", action="store_true", help="also search the largest micro batch per size")
  p.add_argument("--remat-policies", default="none,full", help="for --max-batch")
  p.add_argument("--memory-cap-gb", type=float, default=0.0, help="memory to fit in (default: the device's)")
  p.add_argument("--max-batch-limit", type=int, default=4096)
  args = p.parse_args(argv)
  sizes = args.sizes.split(",")
  configs = {size: config_for(args, size) for size in sizes}
  runners = [common.Ours(configs[size], size) for size in sizes]
  matmul = [common.Matmul(args.matmul_size)] if args.matmul_size else []
  rows, peak, source = common.measure(runners + matmul, args)
  rows = [r for r in rows if r["name"] in configs]
  reference = next((r for r in rows if r["name"] == "bert_large"), rows[0])
  for row in rows:
    m = configs[row["name"]].model
    row.update(layers=m.num_hidden_layers, hidden=m.hidden_size, paper=PAPER.get(row["name"]),
               relative=row["tokens_per_s"] / reference["tokens_per_s"],
               equal_mfu=reference["flops_per_token"] / row["flops_per_token"],
               gflops_per_token=row["flops_per_token"] / 1e9)
  cap = memory_cap(args) if args.max_batch else None
  policies = args.remat_policies.split(",")
  for row in rows:
    for remat in policies:
      row[f"max_batch_{remat}"] = largest_micro_batch(args, row["name"], remat, cap) if cap else "n/a"
  scaled = f", depth x{args.scale} (REDUCED SIZES)" if args.scale != 1 else ""
  columns = [("size", "name", ""), ("L", "layers", "d"), ("H", "hidden", "d"), ("GFLOP/token", "gflops_per_token",
             ".3f"), ("median ms", "median_ms", ".1f"), ("tokens/s", "tokens_per_s", ".0f"), ("MFU", "mfu", ".1%"),
             (f"vs {reference['name']}", "relative", ".2f"), ("equal-MFU", "equal_mfu", ".2f"),
             ("paper", "paper", ".1f")]
  columns += [(f"max batch remat={r}", f"max_batch_{r}", "") for r in policies] if args.max_batch else []
  common.print_table(common.table_rows(rows), columns,
                     f"speed table: seq {args.seq_len}, micro batch {args.micro_batch}, {args.dtype}, one "
                     f"{jax.devices()[0].device_kind}{scaled}; MFU vs {source}")
  print(EXPLANATION, flush=True)
  full_depth = argparse.Namespace(**{**vars(args), "scale": 1.0})
  full_depth_flops = {}
  for s in sizes:
    c = config_for(full_depth, s)
    full_depth_flops[s] = flops.train_flops_per_token(model_config_from(c), args.seq_len,
                                                      pretrain.prediction_slots(c.data))
  payload = {"seq_len": args.seq_len, "micro_batch": args.micro_batch, "scale": args.scale,
             "reduced_sizes": args.scale != 1, "reference": reference["name"], "rows": rows, "paper": PAPER,
             "peak_flops": peak, "peak_source": source, "memory_cap_bytes": cap, "explanation": EXPLANATION,
             "flops_per_token_full_depth": full_depth_flops}
  common.write_json(args, "speed_table", MODULE, payload)
  return payload


if __name__ == "__main__":
  main()
