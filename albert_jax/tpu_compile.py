"""`--mode=compile`: the exact train step of `--mode=train` (the same `engine.setup`), compiled for a TPU slice on
any host — no TPU needed (after MaxText's `train_compile.py`). It answers, before a pod is booked: does the recipe
fit in HBM, with how much headroom, and what crosses the interconnect and the data-centre network each step.

`--fit` searches the remat policy and the micro batch (hence accumulation) for the fastest setting that fits with
`HEADROOM` to spare: fewest recomputed FLOPs first, then the largest micro batch.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

import jax
import ml_collections

from albert_jax import compile_stats, engine, step_bound, topology
from albert_jax.errors import InputError
from albert_jax.topology import GiB

EXIT_DOES_NOT_FIT = 3
HEADROOM = 0.10   # of the chip's HBM, kept free by `--fit` (fragmentation, the runtime, profiler buffers)
REMAT_BY_RECOMPUTE = ("none", "dots_saveable", "dots_with_no_batch_dims_saveable", "full")  # least recompute first


@dataclasses.dataclass
class Result:
  """One compile of one setting for one slice."""
  fits: bool
  micro_batch: int
  accumulation_steps: int
  remat_policy: str
  scan_unroll: int
  dtype: str
  compile_seconds: float
  required_bytes: int                 # per device: the compiled total, or what the compiler said it needed
  memory: compile_stats.MemoryBreakdown | None = None
  collectives: compile_stats.CollectiveStats | None = None
  matmul_flops: int | None = None     # per step per device, loop trips included (compile_stats.matmul_flops)
  optimal_seconds: float | None = None  # the compiler's ideal for one run, loop bodies counted once (step_bound)
  compiled: Any = dataclasses.field(default=None, repr=False, compare=False)  # with compile_for(keep_compiled=True)

  def overrides(self) -> list[str]:
    return [f"--config.train.micro_batch_size={self.micro_batch}", f"--config.model.remat_policy={self.remat_policy}"]


# The TPU's choice for the model fields that None leaves to the backend the step is traced for (model.flat_matmuls,
# model.scan_unroll, model.fused_qkv): traced here, they would read this host's backend, not the slice's.
ON_THE_SLICE = {"flat_matmuls": False, "scan_unroll": 1, "fused_qkv": False}


def job_for(config: ml_collections.ConfigDict, kind) -> engine.Job:
  """The job `--mode=train` would build on the slice, without reading any data; `kind`: the config's
  `job_kinds.JobKind`, which builds it."""
  undecided = {name: value for name, value in ON_THE_SLICE.items() if config.model[name] is None}
  if undecided:
    config = ml_collections.ConfigDict(config.to_dict())
    config.model.update(undecided)
  return kind.make_job(config)


def with_settings(config: ml_collections.ConfigDict, micro_batch: int, remat_policy: str,
                  scan_unroll: int | None = None) -> ml_collections.ConfigDict:
  changed = ml_collections.ConfigDict(config.to_dict())
  changed.train.micro_batch_size = micro_batch
  changed.model.remat_policy = remat_policy
  if scan_unroll is not None:
    changed.model.scan_unroll = scan_unroll
  return changed


def compile_for(config: ml_collections.ConfigDict, devices: list, kind, keep_compiled: bool = False) -> Result:
  """Compiles `config`'s train step for `devices` (a slice's, from `topology.tpu_devices`; any compile-only
  devices, such as bench.gpu_compile's H100)."""
  processes = len({d.process_index for d in devices})
  s = engine.setup(config, job_for(config, kind), devices=devices, process_count=processes, process_index=0)
  settings = dict(micro_batch=s.split.micro_batch, accumulation_steps=s.split.accumulation_steps,
                  remat_policy=config.model.remat_policy, dtype=config.model.dtype,
                  scan_unroll=config.model.scan_unroll or ON_THE_SLICE["scan_unroll"])
  start = time.perf_counter()
  try:
    lowered = s.lower_train_step()
    with s.context():
      compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    exhausted = compile_stats.out_of_memory(e)
    if exhausted is None:
      raise
    return Result(fits=False, compile_seconds=time.perf_counter() - start,
                  required_bytes=exhausted["required_bytes"], **settings)
  seconds = time.perf_counter() - start
  memory = compile_stats.memory_breakdown(compiled, {"state": s.abstract_state, "batch": s.abstract_batch()})
  return Result(fits=True, compile_seconds=seconds, required_bytes=max(memory.total, memory.peak), memory=memory,
                collectives=compile_stats.collective_stats(compiled, list(s.mesh.devices.flat)),
                matmul_flops=compile_stats.matmul_flops(compiled)[0],
                optimal_seconds=step_bound.optimal_seconds(compiled),
                compiled=compiled if keep_compiled else None, **settings)


def time_bound(config: ml_collections.ConfigDict, result: Result, topo: topology.TpuTopology, devices: list,
               kind) -> step_bound.StepBound | None:
  """The lower bound on the step time and hours of `result`, compiled from `config` (`step_bound`): where its layers
  run in a loop, from one more compile of the same setting with every layer unrolled. None where that does not fit."""
  if not result.fits:
    return None
  model = kind.model_config(config)
  if step_bound.layers_in_a_loop(model, result.scan_unroll):
    unrolled = with_settings(config, result.micro_batch, result.remat_policy, model.num_hidden_layers)
    ideal = compile_for(unrolled, devices, kind).optimal_seconds
  else:
    ideal = result.optimal_seconds
  if ideal is None:
    return None
  job = job_for(config, kind)
  tokens = config.train.global_batch_size * job.tokens_per_example
  ici, dcn = step_bound.collective_seconds(result.collectives.totals(), topo)
  return step_bound.StepBound(
      compute_seconds=result.accumulation_steps * ideal, ici_seconds=ici, dcn_seconds=dcn, tokens_per_step=tokens,
      model_flops_per_step=job.flops_per_token * tokens, devices=len(devices),
      peak_flops_per_device=topo.peak_bf16_flops_per_device, train_steps=int(config.train.num_train_steps))


def _report_time_bound(config, result: Result, topo: topology.TpuTopology, devices: list,
                       kind) -> dict[str, Any] | None:
  bound = time_bound(config, result, topo, devices, kind)
  if bound is None:
    print("No step-time bound: the step with every layer unrolled does not fit the device.", flush=True)
    return None
  for line in bound.lines():
    print(line, flush=True)
  return bound.to_dict()


def shorter_bucket_compiles(config: ml_collections.ConfigDict, devices: list, kind) -> list[dict[str, Any]]:
  """The train steps a fine-tuning run compiles besides the longest one (`compile_for`), one per shorter length
  bucket (`data.length_buckets`): each one's length, bytes per device and compile seconds."""
  lengths = kind.bucket_lengths(config)
  if len(lengths) < 2:
    return []
  from albert_jax import buckets
  job = job_for(config, kind)
  s = engine.setup(config, job, devices=devices, process_count=len({d.process_index for d in devices}),
                   process_index=0)
  compiles = []
  for length in lengths[:-1]:
    example = buckets.cut(job.example_batch(1), length, lengths[-1])
    start = time.perf_counter()
    with s.context():
      compiled = s.lower_train_step(example).compile()
    memory = compile_stats.memory_breakdown(compiled, {"state": s.abstract_state, "batch": s.abstract_batch(example)})
    compiles.append({"length": length, "peak_bytes_per_device": max(memory.total, memory.peak),
                     "compile_seconds": round(time.perf_counter() - start, 2)})
  return compiles


def micro_batch_candidates(config: ml_collections.ConfigDict, devices: list, kind) -> list[int]:
  """Micro batches that divide the per-device share of the global batch, largest first."""
  s = engine.setup(config, job_for(config, kind), devices=devices,
                   process_count=len({d.process_index for d in devices}), process_index=0)
  per_device = s.split.global_batch // s.split.data_parallel
  return [m for m in range(per_device, 0, -1) if per_device % m == 0]


def search(config: ml_collections.ConfigDict, devices: list, hbm_bytes: int,
           kind) -> tuple[Result | None, list[Result]]:
  """The fastest setting that fits with HEADROOM: per remat policy (least recompute first), micro batches from the
  largest down until one fits. Returns (best or None, every candidate tried)."""
  budget = (1 - HEADROOM) * hbm_bytes
  tried = []
  micro_batches = micro_batch_candidates(config, devices, kind)
  for policy in REMAT_BY_RECOMPUTE:
    for micro in micro_batches:
      result = compile_for(with_settings(config, micro, policy), devices, kind)
      tried.append(result)
      print(f"  remat {policy:<34} micro batch {micro:>5}: {_verdict(result, hbm_bytes)}", flush=True)
      if result.fits and result.required_bytes <= budget:
        return result, tried
  return None, tried


def _verdict(result: Result, hbm_bytes: int) -> str:
  need = f"{result.required_bytes / GiB:.2f} GiB of {hbm_bytes / GiB:.2f}"
  if not result.fits:
    return f"does not fit ({need}; compiler refused)"
  return f"fits ({need}, headroom {1 - result.required_bytes / hbm_bytes:.0%}) in {result.compile_seconds:.1f} s"


def print_report(result: Result, topo: topology.TpuTopology, num_slices: int, devices: list) -> None:
  hosts = len({d.process_index for d in devices})
  print(f"{topo.name} ({topo.topology}) x {num_slices} slice(s): {len(devices)} devices of kind "
        f"{devices[0].device_kind!r} on {hosts} hosts")
  print(f"micro batch {result.micro_batch} x {result.accumulation_steps} accumulation step(s) per data-parallel "
        f"device; dtype {result.dtype}; remat {result.remat_policy}; scan_unroll {result.scan_unroll}; "
        f"compiled in {result.compile_seconds:.1f} s")
  if result.matmul_flops:
    print(f"matmul FLOPs per step per device: {result.matmul_flops / 1e12:.3f} T (recomputation included)")
  hbm = topo.hbm_bytes_per_device
  if result.memory is None:
    print(f"DOES NOT FIT: the compiler needs {result.required_bytes / GiB:.2f} GiB per device; the chip has "
          f"{hbm / GiB:.2f} GiB.")
    return
  m = result.memory
  rows = [("parameters + optimizer state", m.argument_groups["state"]), ("batch", m.argument_groups["batch"]),
          ("temporaries (activations, workspace)", m.temporaries), ("total", m.total), ("HBM of the device", hbm),
          ("headroom", hbm - m.total)]
  print(f"{'per device':<40}{'GiB':>10}")
  for name, value in rows:
    print(f"{name:<40}{value / GiB:>10.3f}")
  totals = result.collectives.totals()
  print(f"{'collective, bytes per step per device':<40}{'within slice':>16}{'across slices':>16}")
  for kind, split in totals.items():
    print(f"{kind:<40}{split['within_slice']:>16,}{split['across_slices']:>16,}")
  if result.collectives.unknown_trip_counts:
    print(f"(loops whose trip count was not read, counted once: {len(result.collectives.unknown_trip_counts)})")


def summary(result: Result, topo: topology.TpuTopology, num_slices: int, devices: list) -> dict[str, Any]:
  return {"topology": topo.topology, "name": topo.name, "num_slices": num_slices, "devices": len(devices),
          "fits": result.fits and result.required_bytes <= topo.hbm_bytes_per_device,
          "peak_bytes_per_device": result.required_bytes, "hbm_bytes_per_device": topo.hbm_bytes_per_device,
          "micro_batch": result.micro_batch, "accumulation_steps": result.accumulation_steps,
          "remat_policy": result.remat_policy, "scan_unroll": result.scan_unroll, "dtype": result.dtype,
          "compile_seconds": round(result.compile_seconds, 2), "matmul_flops_per_step": result.matmul_flops,
          "memory": result.memory.to_dict() if result.memory else None,
          "collective_bytes": result.collectives.totals() if result.collectives else None}


def _suggestions(config: ml_collections.ConfigDict, result: Result) -> str:
  tips = []
  if result.remat_policy != "full":
    later = REMAT_BY_RECOMPUTE[REMAT_BY_RECOMPUTE.index(result.remat_policy) + 1:] if (
        result.remat_policy in REMAT_BY_RECOMPUTE) else ("full",)
    tips.append(f"--config.model.remat_policy={later[0]}")
  if result.micro_batch > 1:
    tips.append(f"--config.train.micro_batch_size={max(result.micro_batch // 2, 1)}")
  if config.model.dtype != "bfloat16":
    tips.append("--config.model.dtype=bfloat16")
  return " or ".join(tips) + ", or add --fit to search for the fastest setting that fits"


def _nothing_fits(config: ml_collections.ConfigDict, topo: topology.TpuTopology, num_slices: int) -> str:
  """Past micro batch 1 with full remat, what is left is mostly the parameters and optimizer state, which only fsdp
  or tensor axes split (more slices, with the default mesh.dcn_shape, add data-parallel copies: they free nothing)."""
  sizes = dict(config.mesh.shape)
  if sizes["fsdp"] == sizes["tensor"] == 1:
    advice = ("the data-only mesh copies the parameters and optimizer state to every device: shard them with "
              f"--config.mesh.shape=\"(('data', {num_slices}), ('fsdp', -1), ('tensor', 1))\"")
  else:
    advice = "give the fsdp/tensor axes of --config.mesh.shape more devices (a larger slice)"
  if config.model.dtype != "bfloat16":
    advice += ", and try --config.model.dtype=bfloat16"
  return f"No setting fits {topo.name}, not even micro batch 1 with remat full: {advice}."


def run(config: ml_collections.ConfigDict, args, kind) -> None:
  """`--mode=compile --topology=NAME [--num_slices=N] [--fit]`: prints the report, then one JSON line; exits 3
  when the step does not fit. `kind`: the config's `job_kinds.JobKind`."""
  if not args.topology:
    raise InputError("--mode=compile needs --topology, a Cloud TPU name (v3-256, v4-128, v5litepod-64, v5p-256, "
                     "v6e-64) or a JAX topology string (v3:8x16).")
  engine.check_training_config(config)  # what --mode=train refuses at start-up, refused before the compiler runs
  job_for(config, kind)  # the job's own checks (sequence length, masking), also before the compiler runs
  topo = topology.parse(args.topology)
  devices = topology.tpu_devices(topo, args.num_slices)
  if args.fit:
    print(f"Searching remat policy x micro batch for {topo.name} x {args.num_slices} slice(s) "
          f"({HEADROOM:.0%} HBM headroom kept):", flush=True)
    best, tried = search(config, devices, topo.hbm_bytes_per_device, kind)
    if best is None:
      print(json.dumps({**summary(tried[-1], topo, args.num_slices, devices), "fits": False,
                        "candidates": len(tried)}), flush=True)
      print(_nothing_fits(config, topo, args.num_slices), file=sys.stderr)
      sys.exit(EXIT_DOES_NOT_FIT)
    print_report(best, topo, args.num_slices, devices)
    print("Use: " + " ".join(best.overrides()) + " (without --fit, the same command also bounds the step time and "
          "the hours to train)")
    print(json.dumps({**summary(best, topo, args.num_slices, devices), "candidates": len(tried),
                      "overrides": best.overrides()}), flush=True)
    return
  print(f"Compiling the train step for {topo.name} ({len(devices)} devices)...", flush=True)
  result = compile_for(config, devices, kind)
  print_report(result, topo, args.num_slices, devices)
  report = summary(result, topo, args.num_slices, devices)
  report["time_bound"] = _report_time_bound(config, result, topo, devices, kind) if report["fits"] else None
  shorter = shorter_bucket_compiles(config, devices, kind) if report["fits"] else []
  for bucket in shorter:
    print(f"length bucket {bucket['length']}: {bucket['peak_bytes_per_device'] / GiB:.2f} GiB per device, compiled "
          f"in {bucket['compile_seconds']:.1f} s", flush=True)
  if shorter:
    print(f"{len(shorter) + 1} train steps, one per length bucket; the longest sets the memory above.", flush=True)
  report.update(shorter_buckets=shorter, compiles=len(shorter) + 1)
  print(json.dumps(report), flush=True)
  if not report["fits"]:
    print(f"Does not fit on {topo.name}; try {_suggestions(config, result)}.", file=sys.stderr)
    sys.exit(EXIT_DOES_NOT_FIT)
