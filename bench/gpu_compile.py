"""`python -m bench.gpu_compile`: the real train step compiled for an NVIDIA H100 on a host without a GPU, for its
memory and its kernels, so that a session without a lent GPU can still check what a GPU run would need.

XLA compiles for a GPU from a description of it (`H100` below: a GpuTargetConfig) instead of a device, through
`jax.experimental.topologies`; the step is `--mode=compile`'s (`tpu_compile.compile_for`, `engine.setup`). Checked
against the H100's own compiles of 4b4f3f0 (bench/results/*_h100_before_fix.*): ALBERT-large seq 512 micro batch 32
51.6 GiB here, 48.5 there; ALBERT-base seq 128 micro batch 128 14.4 here, 13.3 there (6-8% high); and against the
H200's of the current step: ALBERT-large seq 512 micro batch 128 (one-layer loop) 53.7 GiB here, 54.4 there (1.3%
low). Read the figures as an estimate within several percent either way. What differs without the GPU: no GEMM autotuning (XLA takes its default Triton
configurations), and cuDNN attention is built without its workspace (jax's cuDNN version and compute-capability
checks, which look for a local GPU and libcudnn, are answered with the H100's here).

Needs jax's CUDA plugin and CUDA's `ptxas`, in an interpreter of their own: the plugin, installed beside the CPU
tests, prints an error at every jax start on a host without a GPU. `bash bench/gpu_compile_env.sh` makes one from
the current venv (DIR/bin/python), then:

  DIR/bin/python -m bench.gpu_compile --size large --seq-len 512 --micro-batch 32 \\
      --variant xla:attention_implementation=xla

Each row also carries the step's matmul forms and its ideal time (`step_bound`: bench.roofline's per-kernel bound
summed over the compiled step), with `--measured` a GPU's measured step of the same setting beside it.
"""
from __future__ import annotations

import collections
import gzip
import json
import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host runs on its CPU; the plugin is loaded to compile only

from albert_jax import flops, hlo_text, job_kinds, pretrain, tpu_compile  # noqa: E402
from albert_jax.errors import InputError, one_line_user_errors  # noqa: E402
from bench import common, roofline, train_step  # noqa: E402

MODULE = "bench.gpu_compile"
GiB = 2 ** 30
# NVIDIA H100 80GB HBM3 (SXM): 132 SMs at 1.98 GHz, 3.35 TB/s, 50 MiB L2, compute capability 9.0; the cuDNN and
# CUDA versions are those of the jax CUDA 13 plugin.
H100 = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000 l2_cache_size: 52428800 clock_rate_ghz: 1.98 device_memory_size: 84929347584
  shared_memory_per_block_optin: 232448 cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 12 }
runtime_version { major: 13 minor: 0 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
H100_NAME = "NVIDIA H100 80GB HBM3"
H100_MEMORY_BYTES = 84_929_347_584
H100_COMPUTE_CAPABILITY = (9, 0)


def h100_devices() -> list:
  """One compile-only H100 (raises with the setup command when the CUDA plugin is missing)."""
  from jax.experimental import topologies
  try:
    return topologies.get_topology_desc(platform="cuda", target_config=H100, topology="1x1x1").devices
  except Exception as e:  # noqa: BLE001 - jax raises several types here, all meaning "no CUDA plugin"
    raise SystemExit(f"Cannot describe an H100 to compile for ({type(e).__name__}: {e}). This needs jax's CUDA "
                     "plugin in an interpreter of its own: bash bench/gpu_compile_env.sh DIR, then DIR/bin/python "
                     f"-m {MODULE}.") from e


def answer_cudnn_checks_for_the_h100() -> None:
  """jax's cuDNN attention asks the local machine for libcudnn's version and the default backend's GPU for its
  compute capability; here there is neither, so both are answered with the target's."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention
  target = H100_COMPUTE_CAPABILITY
  version = lambda capability: tuple(int(part) for part in capability.split("."))
  cudnn_attention.check_cudnn_version = lambda: 91200
  cudnn_attention.check_compute_capability = lambda capability: target >= version(capability)
  cudnn_attention.is_cuda_compute_capability_equal = lambda capability: target == version(capability)


def kernel_counts(hlo: str) -> dict[str, int]:
  """Library calls, scatters and fusions (by kind: kInput a reduction, kLoop elementwise, kCustom a Triton GEMM)
  in a compiled module's text: what a GPU trace would show as their own kernels, once per program (a scan's body
  once, whatever its trip count)."""
  counts = collections.Counter(re.findall(r'custom_call_target="([^"]+)"', hlo))
  counts["scatter"] = len(re.findall(r"\bscatter\(", hlo))
  counts.update(f"fusion {kind}" for kind in re.findall(r"\bfusion\([^\n]*\bkind=(k\w+)", hlo))
  return dict(sorted(counts.items()))


def _plain(shape: str) -> str:
  return re.sub(r"\{[^}]*\}", "", shape).strip()


def matmul_forms(hlo: str, program: roofline.Program) -> list[dict]:
  """The step's matmuls grouped by form (operand and result shapes, layouts left out), with their launches per step
  and FLOPs: where a product such as the fused query/key/value one shows up in the compiled step."""
  computations, _, _ = hlo_text.parse_module(hlo)
  forms = collections.defaultdict(lambda: {"launches": 0, "gflop": 0.0})
  for launch in program.launches.values():
    if launch.category != "matmul":
      continue
    table = {i.name: i for i in computations[launch.computation]}
    instr = table[launch.name]
    callee = re.search(r"\bcalls=%([\w.\-]+)", instr.rest)
    if callee:   # a GEMM fusion: its dot, with the operand shapes the fusion's parameters have
      body = {i.name: i for i in computations[callee[1]]}
      instr = next(i for i in body.values() if i.opcode in ("dot", "convolution"))
      table = body
    operands = " x ".join(_plain(table[o].shape) for o in instr.operands[:2] if o in table)
    form = forms[f"{operands} -> {_plain(instr.shape)}"]
    form["launches"] += launch.executions
    form["gflop"] += launch.flops * launch.executions / 1e9
  return sorted(({"form": k, **v} for k, v in forms.items()), key=lambda f: -f["gflop"])


def step_bound(hlo: str, config, peak_tflops: float, hbm_tbps: float) -> dict:
  """The ideal step time of a compiled GPU step: every kernel at the better of its compute and HBM roofline
  (`bench.roofline`: FLOPs of its dots at the dense bf16 peak, the bytes it must read and write at HBM bandwidth),
  summed in program order with each layer counted (the GPU default unrolls them; a loop counts its trips). The TPU's
  `step_bound` reads the compiler's own `optimal_seconds`, which the GPU compiler does not report
  (`cost_analysis()` is None for a compile-only GPU)."""
  program = roofline.read_program(hlo)
  total = roofline.estimate(program, peak_tflops, hbm_tbps)["total"]
  model = job_kinds.kind_for(config).model_config(config)
  tokens = config.train.micro_batch_size * config.data.max_seq_length
  model_flops = tokens * flops.train_flops_per_token(model, config.data.max_seq_length,
                                                      pretrain.prediction_slots(config.data))
  seconds = total["estimated_ms"] / 1e3
  return {"step_s": seconds, "compute_s": total["compute_ms"] / 1e3, "memory_s": total["memory_ms"] / 1e3,
          "kernels": total["launches"], "tokens_per_s": tokens / seconds,
          "mfu": model_flops / seconds / (peak_tflops * 1e12), "peak_tflops": peak_tflops, "hbm_tbps": hbm_tbps,
          "matmul_forms": matmul_forms(hlo, program)}


def measured_step(spec: str) -> tuple[str, float]:
  """'FILE.json[:ROW]' (a bench.train_step result; ROW default ours_lamb) -> (its description, median step s)."""
  path, _, name = spec.partition(":")
  name = name or "ours_lamb"
  if not os.path.isfile(path):
    raise InputError(f"--measured {spec}: no such file; give a bench.train_step JSON, e.g. "
                     "bench/results/train_step_large_s512_unrolled_h200.json:ours_lamb_unrolled.")
  with open(path) as f:
    rows = {r["name"]: r for r in json.load(f)["rows"]}
  if name not in rows:
    raise InputError(f"--measured {spec}: no row {name!r} there; its rows: {', '.join(rows)}.")
  return f"{path}:{name}", rows[name]["median_s"]


def compile_row(name: str, config, devices: list, args) -> dict:
  result = tpu_compile.compile_for(config, devices, job_kinds.kind_for(config), keep_compiled=True)
  row = {"name": name, "config": common.describe(config),
         "attention": config.model.attention_implementation, "fused_qkv": config.model.fused_qkv,
         "fits": result.fits, "required_gib": result.required_bytes / GiB, "compile_s": result.compile_seconds}
  if result.memory:
    hlo = result.compiled.as_text()
    row.update(temporaries_gib=result.memory.temporaries / GiB, memory=result.memory.to_dict(),
               kernels=kernel_counts(hlo), bound=step_bound(hlo, config, args.peak_tflops, args.hbm_tbps))
    if args.hlo_dir:
      os.makedirs(args.hlo_dir, exist_ok=True)
      with gzip.open(os.path.join(args.hlo_dir, f"{args.name or 'gpu_compile'}_{name}.hlo.txt.gz"), "wt") as f:
        f.write(hlo)
  row["fits_h100"] = result.fits and result.required_bytes <= H100_MEMORY_BYTES
  return row


def main(argv=None) -> dict:
  p = common.parser(__doc__)
  p.add_argument("--attention", default="cudnn", help="model.attention_implementation of the first row (auto "
                 "reads this host's backend, the CPU: name the GPU's choice, cudnn, or xla)")
  p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                 help="also compile with these model fields changed (repeatable)")
  p.add_argument("--peak-tflops", type=float, default=roofline.H200_TFLOPS,
                 help="the step bound's matmul peak, TFLOP/s (default %(default)s: an H200's or H100's dense bf16)")
  p.add_argument("--hbm-tbps", type=float, default=roofline.H200_TBPS,
                 help="the step bound's HBM bandwidth, TB/s (default %(default)s: an H200's; an H100 SXM's 3.35)")
  p.add_argument("--measured", default="", metavar="FILE.json[:ROW]",
                 help="a bench.train_step result of --measured-row's setting on a GPU, set beside its bound")
  p.add_argument("--measured-row", default="ours", help="the row --measured measured (default %(default)s)")
  p.add_argument("--hlo-dir", default="", help="also write each row's optimized HLO here (for bench.roofline)")
  p.set_defaults(dtype="bfloat16")  # what a GPU trains in (cuDNN attention takes half precision only)
  args = p.parse_args(argv)
  with one_line_user_errors():
    measured = measured_step(args.measured) if args.measured else None
  devices = h100_devices()
  answer_cudnn_checks_for_the_h100()
  # flat_matmuls, scan_unroll and fused_qkv: bench_config would decide them by this host's backend (the CPU's
  # choice); the GPU's are off, every layer (--scan-unroll 0) and one product.
  fixed = {"attention_implementation": args.attention, "flat_matmuls": False, "fused_qkv": True}
  if args.scan_unroll is None:
    args.scan_unroll = 0
  configs = [("ours", common.bench_config(args, **fixed))]
  for spec in args.variant:
    name, changes = train_step.parse_variant(spec)
    configs.append((name, common.bench_config(args, **{**fixed, **changes})))
  rows = [compile_row(name, config, devices, args) for name, config in configs]
  for row in rows:
    row["kernels_text"] = ", ".join(f"{k} {v}" for k, v in row.get("kernels", {}).items())
    row.update({f"bound_{k}": v for k, v in row.get("bound", {}).items() if k in ("step_s", "mfu")})
  for row in rows:
    if measured and row["name"] == args.measured_row and "bound" in row:
      row.update(measured=measured[0], measured_step_s=measured[1],
                 measured_over_bound=measured[1] / row["bound"]["step_s"])
      print(f"{row['name']}: measured {measured[1] * 1e3:.2f} ms ({measured[0]}), {row['measured_over_bound']:.2f}x "
            "its bound")
  common.print_table(rows, (("row", "name", ""), ("attention", "attention", ""), ("fused qkv", "fused_qkv", ""),
                            ("GiB", "required_gib", ".2f"), ("temporaries GiB", "temporaries_gib", ".2f"),
                            ("fits", "fits_h100", ""), ("compile s", "compile_s", ".1f"),
                            ("bound s", "bound_step_s", ".4f"), ("bound MFU", "bound_mfu", ".1%"),
                            ("library calls and scatters", "kernels_text", "")),
                     f"Compiled for an {H100_NAME} without one: {common.describe(configs[0][1])}")
  for row in rows:
    print(f"{row['name']}: matmul forms (launches a step, GFLOP)")
    for form in row.get("bound", {}).get("matmul_forms", [])[:12]:
      print(f"  {form['launches']:5d} {form['gflop']:9.1f}  {form['form']}")
  payload = {"device": H100_NAME, "rows": rows}
  common.write_json(args, "gpu_compile", MODULE, payload)
  return payload


if __name__ == "__main__":
  main()
