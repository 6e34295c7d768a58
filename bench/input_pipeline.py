"""`python -m bench.input_pipeline`: is the train step input-bound? The same compiled step fed (a) by the real
loader (data_pipeline.loader.make_pretraining_iterator: fetch + host->device transfer + step, as train.fit does)
and (b) by device-resident synthetic batches, interleaved; the difference as % of the synthetic step time
(PERFORMANCE.md §4.2 wants ≤ 3%), and the loader's standalone examples/s vs what the step consumes. Then, at seq 512
in both short_seq_scope modes, the loader's examples/s next to its example builder's own, interleaved
(bench.data_pipeline.loader_vs_builder_rows: documents from memory, as this small split is read by
default, and from disk).

Data: `--data-dir` (a data_pipeline.prepare output), else the bundled tiny corpus (data_pipeline.tiny, 4000-piece
vocabulary, built once under --tiny-dir). The model's vocab_size is set to the data's.

  python -m bench.input_pipeline --size base --seq-len 128 --micro-batch 8
"""
from __future__ import annotations

import os
import time

import numpy as np

from bench import common
from bench.data_pipeline import loader_vs_builder_lines, loader_vs_builder_rows

MODULE = "bench.input_pipeline"


def loader_iterator(config, path: str):
  from data_pipeline import loader
  data = {**config.data.to_dict(), "kind": "prepared", "path": path}
  return loader.make_pretraining_iterator(data, "train", config.train.global_batch_size, config.seed,
                                          vocab_size=config.model.vocab_size)


def standalone_rate(iterator, batches: int, batch_size: int) -> dict:
  """The loader alone (nothing else running in this process): examples/s over `batches` batches."""
  next(iterator)   # first batch: opens files, fills the first shuffle window
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  seconds = time.perf_counter() - start
  return {"batches": batches, "seconds": seconds, "examples_per_s": batches * batch_size / seconds}


def main(argv=None) -> dict:
  p = common.parser(__doc__)
  p.add_argument("--data-dir", default="", help="prepared data (default: the tiny corpus, built if needed)")
  p.add_argument("--tiny-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "albert_jax", "tiny"))
  p.add_argument("--loader-batches", type=int, default=50, help="batches for the loader's standalone rate")
  p.add_argument("--num-workers", type=int, default=0, help="data.num_workers (grain worker processes)")
  p.add_argument("--compare-blocks", type=int, default=16, help="interleaved blocks of 5 batches of 256 for the "
                 "loader vs example builder rates at seq 512 (0: skip)")
  args = p.parse_args(argv)
  from data_pipeline import records, tiny
  path = args.data_dir or tiny.ensure_tiny_dataset(args.tiny_dir)
  args.vocab_size = records.read_manifest(path)["tokenizer"]["vocab_size"]
  config = common.bench_config(args)
  config.data.num_workers = args.num_workers
  print(common.describe(config), f"data={path}", flush=True)

  alone = standalone_rate(loader_iterator(config, path), args.loader_batches, config.train.global_batch_size)
  ours = common.Ours(config, "synthetic_on_device")
  fed = common.Fed(ours, loader_iterator(config, path), "real_loader")
  rows, peak, source = common.measure([ours, fed], args)
  synthetic, real = rows
  overhead = (real["median_s"] - synthetic["median_s"]) / synthetic["median_s"]
  consumed = synthetic["examples_per_s"]
  common.print_table(common.table_rows(rows), common.STEP_COLUMNS,
                     f"train step fed by the loader vs device-resident batches ({args.steps} steps each, interleaved)")
  lines = [f"input overhead: {overhead:+.1%} of the synthetic step time (median {real['median_s'] * 1e3:.1f} vs "
           f"{synthetic['median_s'] * 1e3:.1f} ms)",
           f"loader alone: {alone['examples_per_s']:.0f} examples/s; the step consumes {consumed:.0f} examples/s "
           f"-> headroom {alone['examples_per_s'] / consumed:.2f}x"]
  builder = loader_vs_builder_rows(path, args.vocab_size, args.predictions, args.compare_blocks) if (
      args.compare_blocks) else []
  lines += loader_vs_builder_lines(builder)
  print("\n".join(lines), flush=True)
  payload = {"config": common.describe(config), "data_path": path, "model": config.model.to_dict(),
             "rows": rows, "peak_flops": peak, "peak_source": source, "overhead_fraction": overhead,
             "loader_standalone": alone, "loader_vs_builder_seq512": builder, "step_consumes_examples_per_s": consumed,
             "headroom": alone["examples_per_s"] / consumed, "summary": lines,
             "p90_overhead_fraction": float(np.subtract(real["p90_s"], synthetic["p90_s"]) / synthetic["p90_s"])}
  common.write_json(args, "input_pipeline", MODULE, payload)
  return payload


if __name__ == "__main__":
  main()
