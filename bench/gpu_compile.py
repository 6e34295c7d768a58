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
"""
from __future__ import annotations

import collections
import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host runs on its CPU; the plugin is loaded to compile only

from albert_jax import job_kinds, tpu_compile  # noqa: E402
from bench import common, train_step  # noqa: E402

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


def compile_row(name: str, config, devices: list) -> dict:
  result = tpu_compile.compile_for(config, devices, job_kinds.kind_for(config), keep_compiled=True)
  row = {"name": name, "config": common.describe(config),
         "attention": config.model.attention_implementation, "fits": result.fits,
         "required_gib": result.required_bytes / GiB, "compile_s": result.compile_seconds}
  if result.memory:
    row.update(temporaries_gib=result.memory.temporaries / GiB, memory=result.memory.to_dict(),
               kernels=kernel_counts(result.compiled.as_text()))
  row["fits_h100"] = result.fits and result.required_bytes <= H100_MEMORY_BYTES
  return row


def main(argv=None) -> dict:
  p = common.parser(__doc__)
  p.add_argument("--attention", default="cudnn", help="model.attention_implementation of the first row (auto "
                 "reads this host's backend, the CPU: name the GPU's choice, cudnn, or xla)")
  p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                 help="also compile with these model fields changed (repeatable)")
  p.set_defaults(dtype="bfloat16")  # what a GPU trains in (cuDNN attention takes half precision only)
  args = p.parse_args(argv)
  devices = h100_devices()
  answer_cudnn_checks_for_the_h100()
  # flat_matmuls and scan_unroll: bench_config would decide them by this host's backend (the CPU's choice); the
  # GPU's are off and every layer (--scan-unroll 0).
  fixed = {"attention_implementation": args.attention, "flat_matmuls": False}
  if args.scan_unroll is None:
    args.scan_unroll = 0
  configs = [("ours", common.bench_config(args, **fixed))]
  for spec in args.variant:
    name, changes = train_step.parse_variant(spec)
    configs.append((name, common.bench_config(args, **{**fixed, **changes})))
  rows = [compile_row(name, config, devices) for name, config in configs]
  for row in rows:
    row["kernels_text"] = ", ".join(f"{k} {v}" for k, v in row.get("kernels", {}).items())
  common.print_table(rows, (("row", "name", ""), ("attention", "attention", ""), ("GiB", "required_gib", ".2f"),
                            ("temporaries GiB", "temporaries_gib", ".2f"), ("fits", "fits_h100", ""),
                            ("compile s", "compile_s", ".1f"), ("library calls and scatters", "kernels_text", "")),
                     f"Compiled for an {H100_NAME} without one: {common.describe(configs[0][1])}")
  payload = {"device": H100_NAME, "rows": rows}
  common.write_json(args, "gpu_compile", MODULE, payload)
  return payload


if __name__ == "__main__":
  main()
