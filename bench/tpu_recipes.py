"""`python -m bench.tpu_recipes`: the README's "Pretraining on TPU" table, measured by the TPU compiler on this host.

Each row compiles the shipped experiment file's exact train step (`--mode=compile`'s code) for a slice and
records memory per device, headroom, the collective bytes per step and the step-time bound (`albert_jax.step_bound`:
one more compile with the layers unrolled); `bench/results/tpu_compile_<row>.json`
holds each row, and the printed Markdown tables are what the README shows. The second table compares the
gradient all-reduce of ALBERT and BERT at the same size (the paper's Table 2 speed-up comes from it).
Takes minutes per row on 2 CPU cores: pick rows with `--only`. `--remat_cost` compiles the rows under each remat
policy instead (same micro batch) and compares their memory and matmul FLOPs per step, recomputation included
(`bench/results/tpu_remat_cost_<row>.json`).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os

import jax

from albert_jax import job_kinds, topology, tpu_compile
from bench import common

GiB = topology.GiB

# name -> (experiment module[:argument], topology, slices, extra config overrides)
ROWS = {
    "base_v3-128": ("pretrain_base", "v3-128", 1, {}),
    "large_v3-256": ("pretrain_large", "v3-256", 1, {}),
    "xlarge_v3-512": ("pretrain_xlarge", "v3-512", 1, {}),
    "xxlarge_v3-1024": ("pretrain_xxlarge", "v3-1024", 1, {}),
    "large_v4-128": ("pretrain_large", "v4-128", 1, {"train.micro_batch_size": 32}),  # `--fit`'s choice there
    "large_v3-128x2": ("pretrain_large", "v3-128", 2, {}),
    "bert_large_v3-256": ("bert_large", "v3-256", 1, {}),
    "xxlarge_v5p-256": ("pretrain_xxlarge", "v5p-256", 1, {}),
    "large_v3-512": ("pretrain_large", "v3-512", 1, {}),
    "bert_large_v3-512": ("bert_large", "v3-512", 1, {}),
    "electra_base_v3-8": ("pretrain_electra:size=base", "v3-8", 1, {}),    # ELECTRA's pair, as `--fit` chose
    "electra_large_v3-256": ("pretrain_electra:size=large", "v3-256", 1, {}),
}
# Fine-tuning recipes on the original's slice (8 TPU v3 cores): the largest batch (MNLI/QQP 128), SQuAD's two v2
# heads and RACE's 4 x 512 tokens per example, at every ALBERT size.
for _size in ("base", "large", "xlarge", "xxlarge"):
  ROWS.update({f"finetune_{name}_{_size}_v3-8": (f"{module}:{arg}size={_size}", "v3-8", 1, {}) for name, module, arg in (
      ("mnli", "glue", "task=mnli,"), ("squad_v1", "squad_v1", ""), ("squad_v2", "squad_v2", ""),
      ("squad_v2_answer_class", "squad_v2", "head=answer_class,"), ("race", "race", ""))})


def row_config(experiment: str, overrides: dict):
  module, _, arg = experiment.partition(":")
  config = importlib.import_module(f"experiments.{module}").get_config(arg or None)
  for dotted, value in overrides.items():
    section, key = dotted.split(".")
    config[section][key] = value
  return config


def measure(name: str, results_dir: str) -> dict:
  module, slice_name, slices, overrides = ROWS[name]
  topo = topology.parse(slice_name)
  devices = topology.tpu_devices(topo, slices)
  config = row_config(module, overrides)
  kind = job_kinds.kind_for(config)
  result = tpu_compile.compile_for(config, devices, kind)
  bound = tpu_compile.time_bound(config, result, topo, devices, kind)
  file, _, arg = module.partition(":")
  record = {"row": name, "experiment": f"experiments/{file}.py" + (f":{arg}" if arg else ""), "overrides": overrides,
            **tpu_compile.summary(result, topo, slices, devices), "time_bound": bound and bound.to_dict()}
  common.write_json(argparse.Namespace(results_dir=results_dir, name=None), f"tpu_compile_{name}",
                    "bench.tpu_recipes", record)
  return record


def remat_cost(name: str, results_dir: str) -> dict:
  """The row compiled under each policy of `tpu_compile.REMAT_BY_RECOMPUTE` at its recipe's micro batch."""
  module, slice_name, slices, overrides = ROWS[name]
  topo = topology.parse(slice_name)
  devices = topology.tpu_devices(topo, slices)
  config = row_config(module, overrides)
  policies = []
  for policy in tpu_compile.REMAT_BY_RECOMPUTE:
    print(f"  {name}: remat {policy}...", flush=True)
    result = tpu_compile.compile_for(tpu_compile.with_settings(config, config.train.micro_batch_size, policy), devices,
                                      job_kinds.kind_for(config))
    policies.append({"remat_policy": policy, "fits": result.fits, "peak_bytes_per_device": result.required_bytes,
                     "matmul_flops_per_step": result.matmul_flops, "micro_batch": result.micro_batch,
                     "compile_seconds": round(result.compile_seconds, 2)})
  record = {"row": name, "experiment": module, "topology": topo.topology, "num_slices": slices, "policies": policies}
  common.write_json(argparse.Namespace(results_dir=results_dir, name=None), f"tpu_remat_cost_{name}",
                    "bench.tpu_recipes", record)
  return record


def print_remat_costs(records: list[dict]) -> None:
  print("| model | slice | remat | micro batch | total GiB | matmul TFLOP/step/device | x none |")
  print("|---|---|---|---|---|---|---|")
  for r in records:
    base = r["policies"][0]["matmul_flops_per_step"]
    for p in r["policies"]:
      flops = p["matmul_flops_per_step"]
      ratio = f"{flops / base:.3f}" if flops and base else "-"
      print(f"| {r['experiment']} | {r['row'].rsplit('_', 1)[-1]} | {p['remat_policy']} | {p['micro_batch']} | "
            f"{_gib(p['peak_bytes_per_device'])} | {flops / 1e12 if flops else 0:.2f} | {ratio} |")


def _gib(value: int | None) -> str:
  return "-" if value is None else f"{value / GiB:.2f}"


def print_tables(records: list[dict]) -> None:
  print("| model | slice | devices | micro batch x accumulation | dtype | remat | state / device GiB | "
        "temporaries GiB | total GiB | HBM GiB | fits | compile s |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in records:
    memory = r["memory"] or {}
    slice_name = r["name"] + (f" x {r['num_slices']}" if r["num_slices"] > 1 else "")
    print(f"| {r['experiment'].split('/')[-1].replace('.py', '')} | {slice_name} | {r['devices']} | {r['micro_batch']} x "
          f"{r['accumulation_steps']} | {r['dtype']} | {r['remat_policy']} | "
          f"{_gib(memory.get('argument_groups', {}).get('state'))} | {_gib(memory.get('temporaries'))} | "
          f"{_gib(r['peak_bytes_per_device'])} | {_gib(r['hbm_bytes_per_device'])} | "
          f"{'yes' if r['fits'] else 'NO'} | {r['compile_seconds']:.0f} |")
  print("\n| model | slice | all-reduce within slice, MB/step/device | across slices | all-gather | reduce-scatter |")
  print("|---|---|---|---|---|---|")
  for r in records:
    c = r["collective_bytes"]
    if c:
      print(f"| {r['experiment'].split('/')[-1].replace('.py', '')} | {r['name']} x {r['num_slices']} | "
            f"{c['all-reduce']['within_slice'] / 1e6:.1f} | {c['all-reduce']['across_slices'] / 1e6:.1f} | "
            f"{sum(c['all-gather'].values()) / 1e6:.1f} | {sum(c['reduce-scatter'].values()) / 1e6:.1f} |")


def print_time_bounds(records: list[dict]) -> None:
  print("\n| model | slice | lower bound s/step | compute | interconnect | tokens/s | MFU | steps | hours |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in records:
    b = r.get("time_bound")
    if b:
      print(f"| {r['experiment'].split('/')[-1].replace('.py', '')} | {r['name']} x {r['num_slices']} | "
            f"{b['step_seconds']:.3f} | {b['compute_seconds']:.3f} | {b['ici_seconds']:.4f} | "
            f"{b['tokens_per_second']:,.0f} | {b['mfu']:.1%} | {b['train_steps']:,} | {b['hours']:.1f} |")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", default="", help=f"comma-separated rows of: {', '.join(ROWS)}")
  parser.add_argument("--table-only", action="store_true", help="print the tables from the saved JSONs")
  parser.add_argument("--results-dir", default=common.RESULTS_DIR)
  parser.add_argument("--remat_cost", action="store_true", help="compile the rows under each remat policy")
  args = parser.parse_args(argv)
  jax.config.update("jax_platforms", "cpu")  # the slices' devices come from libtpu; nothing runs on a chip
  names = [n for n in args.only.split(",") if n] or list(ROWS)
  unknown = sorted(set(names) - set(ROWS))
  if unknown:
    parser.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
  if args.remat_cost:
    print_remat_costs([remat_cost(name, args.results_dir) for name in names])
    return
  records = []
  for name in names:
    path = os.path.join(args.results_dir, f"tpu_compile_{name}.json")
    if args.table_only:
      if os.path.exists(path):
        records.append(json.load(open(path)))
      continue
    print(f"compiling {name}...", flush=True)
    records.append(measure(name, args.results_dir))
  print_tables(records)
  print_time_bounds(records)


if __name__ == "__main__":
  main()
