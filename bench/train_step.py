"""`python -m bench.train_step`: the real train step (the configured optimizer, LAMB by default; donated sharded
state; one jit with shardings; device-resident synthetic batches) timed apart from its compile: median and p10/p90
step time, examples/s, tokens/s, MFU (flops.train_flops_per_token), memory.

`--peer` adds transformers' PyTorch AlbertForPreTraining with AdamW (torch has no LAMB) and ours with AdamW for an
apples-to-apples ratio, interleaved in this one process (PERFORMANCE.md §4.3). On CPU, MFU is measured against the
float32 matmul rate timed in the same interleaving (`matmul_jax`; with --peer also `matmul_torch`, which tells the
matmul kernels apart from the framework). `--profile DIR` then traces 5 of our steps (docs/profiling.md).

  python -m bench.train_step --size base --seq-len 128 --micro-batch 8 --peer
  python -m bench.train_step --size base --scan-unroll 0 --variant rolled:scan_unroll=1   # A/B of a model field
"""
from __future__ import annotations

import ast
import os

import jax

from bench import common, gpu_trace

MODULE = "bench.train_step"


def add_peer_args(p) -> None:
  p.add_argument("--peer", action="store_true", help="also time the PyTorch peer and ours with AdamW")
  p.add_argument("--peer-compile", default="auto", choices=("auto", "off", "on", "both"),
                 help="torch.compile the peer: auto = both on GPU, off on CPU (compiling takes minutes there)")
  p.add_argument("--peer-threads", type=int, default=0, help="torch threads (0 = the cores XLA uses)")
  p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                 help="also time ours with these model fields changed, interleaved with the rest (repeatable), "
                      "e.g. --variant rolled:scan_unroll=1")


def parse_variant(spec: str) -> tuple[str, dict]:
  """'rolled:scan_unroll=1,remat_policy=full' -> ('rolled', {'scan_unroll': 1, 'remat_policy': 'full'})."""
  name, _, fields = spec.partition(":")
  changes = {}
  for item in filter(None, fields.split(",")):
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise SystemExit(f"--variant {spec!r}: expected NAME:KEY=VALUE[,KEY=VALUE...]")
    try:
      changes[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      changes[key] = value   # a bare string such as dots_saveable
  if not name or not changes:
    raise SystemExit(f"--variant {spec!r}: expected NAME:KEY=VALUE[,KEY=VALUE...]")
  return name, changes


def build_runners(args, config, failed_variants: dict[str, str]) -> list:
  """Ours (configured optimizer); with --peer: ours with AdamW, the peer(s) and the torch matmul; the matmul(s).
  A --variant that fails to build is left out and recorded in `failed_variants` (spec -> error)."""
  runners = [common.Ours(config, f"ours_{config.train.optimizer}")]
  for spec in args.variant:
    name, changes = parse_variant(spec)
    try:
      runners.append(common.Ours(common.bench_config(args, **changes), f"ours_{config.train.optimizer}_{name}"))
    except Exception as e:  # noqa: BLE001 - one variant that cannot compile here must not cost the other rows
      print(f"variant {spec!r} left out: {type(e).__name__}: {str(e)[:500]}", flush=True)
      failed_variants[spec] = f"{type(e).__name__}: {e}"
  if args.peer:
    if config.train.optimizer != "adamw":
      runners.append(common.Ours(common.with_optimizer(config, "adamw"), "ours_adamw"))
    on_gpu = jax.devices()[0].platform == "gpu"
    compiles = {"auto": (False, True) if on_gpu else (False,), "off": (False,), "on": (True,),
                "both": (False, True)}[args.peer_compile]
    runners += [common.Peer(config, "peer_adamw_compiled" if c else "peer_adamw", compile=c,
                           threads=args.peer_threads or None) for c in compiles]
  if args.matmul_size:
    runners.append(common.Matmul(args.matmul_size, "jax"))
    if args.peer:
      runners.append(common.Matmul(args.matmul_size, "torch"))
  return runners


def ratios(rows) -> dict[str, float]:
  """tokens/s of each of our runners over each peer's (the issue's headline ratio), and of each --variant over
  the unchanged configuration."""
  ours = [r for r in rows if r["name"].startswith("ours") and "tokens_per_s" in r]
  peers = [r for r in rows if r["name"].startswith("peer")]
  out = {f"{a['name']}/{b['name']}": a["tokens_per_s"] / b["tokens_per_s"] for a in ours for b in peers}
  base = ours[0]
  out.update({f"{a['name']}/{base['name']}": a["tokens_per_s"] / base["tokens_per_s"]
              for a in ours[1:] if a["name"].startswith(base["name"] + "_")})
  return out


def profile(runner, directory: str, steps: int = 5) -> None:
  """A trace of `steps` steps, and the compiled step's HLO beside it (`bench.gpu_trace` names kernels from it)."""
  with jax.profiler.trace(directory):
    for i in range(steps):
      with jax.profiler.StepTraceAnnotation("train", step_num=i):
        runner.step()
  with open(os.path.join(directory, gpu_trace.HLO_FILE), "w") as f:
    f.write(runner.compiled.as_text())
  print(f"profile of {steps} steps written to {directory} (open with TensorBoard/XProf or Perfetto; on a GPU, "
        f"`python -m bench.gpu_trace {directory}` sums its kernels)", flush=True)


def main(argv=None) -> dict:
  p = common.parser(__doc__)
  add_peer_args(p)
  p.add_argument("--profile", default="", help="after timing, write a jax.profiler trace of 5 steps here")
  args = p.parse_args(argv)
  config = common.bench_config(args)
  print(common.describe(config), flush=True)
  failed_variants: dict[str, str] = {}
  runners = build_runners(args, config, failed_variants)
  rows, peak, source = common.measure(runners, args)
  common.print_table(common.table_rows(rows), common.STEP_COLUMNS,
                     f"train step, {args.steps} timed steps per runner, interleaved in blocks of {args.block}; "
                     f"MFU vs {source}: {peak / 1e12 if peak else float('nan'):.3f} TFLOP/s")
  found = ratios(rows)
  for key, value in found.items():
    print(f"tokens/s ratio {key}: {value:.2f}x", flush=True)
  for row in rows:
    if row.get("fraction_of_matmul") is not None:
      print(f"{row['name']}: {row['fraction_of_matmul']:.1%} of the measured jnp.dot rate", flush=True)
    if row.get("first_step_loss") is not None:
      print(f"{row['name']}: first step's loss {row['first_step_loss']:.6f}", flush=True)
  if args.profile:
    profile(runners[0], args.profile)
  payload = {"config": common.describe(config), "model": config.model.to_dict(), "seq_len": args.seq_len,
             "micro_batch": args.micro_batch, "accumulation": args.accumulation, "predictions": args.predictions,
             "peak_flops": peak, "peak_source": source, "rows": rows, "ratios": found,
             "failed_variants": failed_variants,
             "notes": ["peer uses AdamW (torch has no LAMB); ours_adamw is the like-for-like comparison",
                       "peer's hidden_act is gelu_pytorch_tanh: the same tanh-GELU as our gelu_new, fused",
                       "FLOPs: one formula for both (sparse MLM head at M positions); the peer's all-position "
                       "logits are overhead, not credited"]}
  common.write_json(args, "train_step", MODULE, payload)
  return payload


if __name__ == "__main__":
  main()
