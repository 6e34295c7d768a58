"""Input-pipeline benchmark (PERFORMANCE.md §4.2): tokenization, example building + masking, preparation memory,
and the loader's rate next to the example builder's own at seq 512 in both short_seq_scope modes.

  python -m bench.data_pipeline                      # 30 MB corpus of ../shared/data, writes bench/results/
  python -m bench.data_pipeline --large_corpus_gb=1  # also prepare a generated 1 GB corpus (memory must stay flat)
  python -m bench.data_pipeline --smoke              # seconds: tiny sizes, for the test suite (no timing claims)

Throughputs are per core: one process, no worker processes, divided by the process's CPU time (all its threads;
other load on a shared machine does not count, though it still slows caches). Wall-clock rates are printed too.
Peak memory is the largest process's maximum RSS while `data_pipeline.prepare` runs (in a subprocess).
"Builder" is the loader's own example building (same documents, order, windows and batches, checked byte for byte)
fed from documents decoded once into memory: the loader's reading, decoding and plumbing are the difference. It
is measured in alternating blocks, 16 of each per mode; the median of the block pairs and their range come with it.
"""
from __future__ import annotations

import argparse
import functools
import gc
import glob
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from bench import machine

SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")


def tokenization_mb_per_s(spm_model: str, files: list[str], max_bytes: int) -> float:
  from data_pipeline.tokenization import Tokenizer
  tokenizer = Tokenizer(spm_model)
  lines, size = [], 0
  for path in files:
    for line in open(path, encoding="utf-8"):
      if line.strip() and size < max_bytes:
        lines.append(line)
        size += len(line.encode())
  start = time.process_time()
  for i in range(0, len(lines), 1000):
    tokenizer.encode_batch(lines[i:i + 1000])
  return size / 1e6 / (time.process_time() - start)


_PEAK = """import json, resource, sys
from data_pipeline.prepare import main
main(sys.argv[1:])
usage = [resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(json.dumps(max(usage)))"""


def prepare_peak(input_glob: str, spm_model: str, output_dir: str, workers: int) -> dict:
  """Runs the preparation in a fresh process; returns its time and the peak RSS of its largest process."""
  start = time.perf_counter()
  out = subprocess.run([sys.executable, "-c", _PEAK, f"--input={input_glob}", "--format=paragraphs",
                        f"--spm_model={spm_model}", f"--output_dir={output_dir}", "--num_shards=8",
                        f"--workers={workers}"], check=True, capture_output=True, text=True).stdout
  seconds = time.perf_counter() - start
  size = sum(os.path.getsize(f) for f in glob.glob(input_glob))
  return {"input_mb": round(size / 1e6, 1), "workers": workers, "seconds": round(seconds, 2),
          "mb_per_s_per_worker": round(size / 1e6 / seconds / workers, 2),
          "peak_rss_mb": round(int(out.strip().splitlines()[-1]) / 1024, 1)}


def examples_per_s(path: str, vocab_size: int, max_seq_length: int, max_predictions: int,
                   batches: int) -> tuple[float, float]:
  """(examples per CPU second, examples per wall second) of the loader at host batch 256."""
  from data_pipeline.loader import make_pretraining_iterator
  config = {"kind": "prepared", "path": path, "max_seq_length": max_seq_length,
            "max_predictions_per_seq": max_predictions, "num_workers": 0, "prefetch": 0}
  iterator = make_pretraining_iterator(config, "train", 256, 0, 0, 1, vocab_size=vocab_size)
  next(iterator)
  cpu, wall = time.process_time(), time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return 256 * batches / (time.process_time() - cpu), 256 * batches / (time.perf_counter() - wall)


def _digest(batch: dict) -> str:
  return hashlib.sha256(b"".join(k.encode() + batch[k].tobytes() for k in sorted(batch))).hexdigest()


def loader_vs_builder(path: str, vocab_size: int, max_seq_length: int, max_predictions: int, scope: str,
                      blocks: int, block: int = 5, batch_size: int = 256, seed: int = 0,
                      from_disk: bool = False) -> dict:
  """Examples/s of the loader and of its example builder alone, in alternating blocks of `block` batches (order
  reversed every round) so that other load slows both alike; per CPU second and per wall second. Each round's two
  blocks build the same batches next to each other in time, so the median of their ratios is the figure least
  moved by bursts of other load; its range shows how noisy the run was. The loader reads its documents as it
  would this split by default (a small split from memory), or with `from_disk` every read from the shards, as a
  corpus over DocumentSource.IN_MEMORY_BYTES is."""
  import grain
  from data_pipeline import loader, records
  from data_pipeline.examples import BatchBuilder, ExampleConfig
  from data_pipeline.wordpiece import load_tokenizer

  class Decoded:
    """The split's documents decoded once (bench-sized data), drawn from as `DocumentSource` does."""

    def __init__(self, source: loader.DocumentSource):
      self.docs = [source[i] for i in range(len(source))]

    def __len__(self) -> int:
      return len(self.docs)

    def __getitem__(self, index: int):
      return self.docs[index]

    def other(self, r, doc_index: int):
      return self.docs[loader.DocumentSource.pick_other(r, doc_index, len(self.docs))]

  class Stream(grain.DatasetIterator):
    """`document_stream`'s (document index, epoch, document) elements, the documents taken from memory."""

    def __init__(self, elements: list, documents: Decoded):
      super().__init__()
      self._elements, self._documents, self._next = elements, documents, 0

    def __next__(self):
      doc_index, epoch = self._elements[self._next]
      self._next += 1
      return doc_index, epoch, self._documents[doc_index]

    def get_state(self) -> dict:
      return {"next": self._next}

    def set_state(self, state: dict) -> None:
      self._next = state["next"]

  data = {"kind": "prepared", "path": path, "max_seq_length": max_seq_length,
          "max_predictions_per_seq": max_predictions, "short_seq_scope": scope, "num_workers": 0, "prefetch": 0}
  config = ExampleConfig.from_config(data)
  manifest = records.read_manifest(path)
  source = loader.DocumentSource(records.split_files(path, manifest, "train"), manifest["token_dtype"])
  documents = Decoded(source)
  # Every document gives at least one instance, so this many stream elements cover the batches and a last window.
  needed = (blocks * block + 1) * batch_size + config.shuffle_buffer
  elements = loader.document_stream(source, seed, 0, 1).order(range(needed))
  tokenizer = load_tokenizer(os.path.join(path, manifest["tokenizer"]["model"]),
                             manifest["tokenizer"]["do_lower_case"])
  builder = BatchBuilder(tokenizer, config)
  in_memory_bytes = 0 if from_disk else loader.DocumentSource.IN_MEMORY_BYTES
  iterators = {"loader": loader.make_pretraining_iterator(data, "train", batch_size, seed, 0, 1, vocab_size,
                                                          in_memory_bytes),
               "builder": loader._BatchIterator(Stream(elements, documents), functools.partial(
                                                    loader.document_pairs, documents, builder, seed),
                                                builder, batch_size, slice(None))}
  digests = {name: [_digest(next(it))] for name, it in iterators.items()}   # opens files, fills the first window
  # The collector's full passes (2-3 per mode, 30-55 ms each over the setup's ~100k objects) are set off by
  # allocations that loader and builder make alike (the same instance building and shuffle buffer) and land in
  # whichever block runs then: noise in the ratio, up to half of one block. Frozen, the setup's objects are not
  # scanned and the passes cost next to nothing.
  cpu, wall, names = {name: [] for name in iterators}, dict.fromkeys(iterators, 0.0), list(iterators)
  gc.freeze()
  try:
    for _ in range(blocks):
      for name in names:
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        batches = [next(iterators[name]) for _ in range(block)]
        cpu[name].append(time.process_time() - start_cpu)
        wall[name] += time.perf_counter() - start_wall
        digests[name].extend(map(_digest, batches))
      names.reverse()
  finally:
    gc.unfreeze()
  paired = sorted(b / a for a, b in zip(cpu["loader"], cpu["builder"]))
  examples = blocks * block * batch_size
  out = {"short_seq_scope": scope, "documents_from": "memory" if source.in_memory and not from_disk else "disk",
         "max_seq_length": max_seq_length, "max_predictions": max_predictions,
         "examples_each": examples, "block_batches": block, "batch_size": batch_size,
         "identical_batches": digests["loader"] == digests["builder"]}
  for name in iterators:
    out[f"{name}_examples_per_s_per_core"] = round(examples / sum(cpu[name]))
    out[f"{name}_examples_per_s_wall"] = round(examples / wall[name])
  out["loader_fraction_per_core"] = round(sum(cpu["builder"]) / sum(cpu["loader"]), 3)
  out["loader_fraction_wall"] = round(wall["builder"] / wall["loader"], 3)
  out["loader_fraction_per_core_blocks"] = {"median": round(statistics.median(paired), 3),
                                            "min": round(paired[0], 3), "max": round(paired[-1], 3)}
  return out


def loader_vs_builder_rows(path: str, vocab_size: int, max_predictions: int, blocks: int, block: int = 5) -> list:
  """`loader_vs_builder` at seq 512 in both short_seq_scope modes, documents read as by default and from disk
  (one row per mode when the split is read from disk anyway)."""
  rows = []
  for scope in ("document", "chunk"):
    rows.append(loader_vs_builder(path, vocab_size, 512, max_predictions, scope, blocks, block))
    if rows[-1]["documents_from"] == "memory":
      rows.append(loader_vs_builder(path, vocab_size, 512, max_predictions, scope, blocks, block, from_disk=True))
  return rows


def loader_vs_builder_lines(rows: list[dict]) -> list[str]:
  lines = []
  for r in rows:
    pairs = r["loader_fraction_per_core_blocks"]
    lines.append(f"seq {r['max_seq_length']} short_seq_scope={r['short_seq_scope']}, documents from "
                 f"{r['documents_from']}: loader "
                 f"{r['loader_examples_per_s_per_core']} vs builder {r['builder_examples_per_s_per_core']} examples "
                 f"per CPU second = {r['loader_fraction_per_core']:.1%} (block pairs: median {pairs['median']:.1%}, "
                 f"range {pairs['min']:.1%}-{pairs['max']:.1%}; wall {r['loader_fraction_wall']:.1%}); identical "
                 f"batches: {r['identical_batches']}")
  return lines


def generate_corpus(files: list[str], directory: str, gigabytes: float) -> str:
  """Copies of the corpus books until `gigabytes`, one file per copy and book."""
  target, written, copy = gigabytes * 1e9, 0, 0
  while written < target:
    for path in files:
      data = open(path, "rb").read()
      with open(os.path.join(directory, f"copy{copy:03d}_{os.path.basename(path)}"), "wb") as f:
        f.write(data)
      written += len(data)
    copy += 1
  return os.path.join(directory, "*.txt")


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--shared_data", default=SHARED)
  parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (test suite)")
  parser.add_argument("--large_corpus_gb", type=float, default=0.0, help="also prepare a generated corpus this big")
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                        "data_pipeline.json"))
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  spm_model = os.path.join(args.shared_data, "albert_spm", "spiece.model")
  books = sorted(glob.glob(os.path.join(args.shared_data, "corpus", "*.txt")))
  corpus_glob = books[0] if args.smoke else os.path.join(args.shared_data, "corpus", "*.txt")
  batches = 2 if args.smoke else 40
  results = {"host": platform.node(), "cpu_count": os.cpu_count(), "smoke": args.smoke}
  results["tokenization_mb_per_s_per_core"] = round(
      tokenization_mb_per_s(spm_model, books[:1] if args.smoke else books, 10**5 if args.smoke else 2 * 10**7), 2)
  with tempfile.TemporaryDirectory() as tmp:
    prepared = os.path.join(tmp, "prepared")
    results["prepare_corpus"] = prepare_peak(corpus_glob, spm_model, prepared, args.workers)
    for seq, preds in ((128, 20), (512, 20), (512, 0)):
      per_cpu, per_wall = examples_per_s(prepared, 30000, seq, preds, batches)
      results[f"examples_per_s_per_core_seq{seq}_pred{preds or 'free'}"] = round(per_cpu)
      results[f"examples_per_s_wall_seq{seq}_pred{preds or 'free'}"] = round(per_wall)
    results["loader_vs_builder_seq512"] = loader_vs_builder_rows(prepared, 30000, 20, 1 if args.smoke else 16,
                                                                 1 if args.smoke else 5)
    if args.large_corpus_gb:
      os.makedirs(os.path.join(tmp, "large"))
      large = generate_corpus(books, os.path.join(tmp, "large"), args.large_corpus_gb)
      results["prepare_large"] = prepare_peak(large, spm_model, os.path.join(tmp, "large_prepared"), args.workers)
  results["machine"] = machine.report()
  os.makedirs(os.path.dirname(args.output), exist_ok=True)
  with open(args.output, "w") as f:
    json.dump(results, f, indent=1)
  width = max(map(len, results))
  for key, value in results.items():
    print(f"{key:<{width}}  {value}")
  note = results["machine"]["noisy"]
  print("\n".join(loader_vs_builder_lines(results["loader_vs_builder_seq512"]) + ([note] if note else [])))
  return results


if __name__ == "__main__":
  main()
