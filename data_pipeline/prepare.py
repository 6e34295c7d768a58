"""Tokenize a text corpus into sharded ArrayRecord files of documents (`python -m data_pipeline.prepare --help`).

Document i (in input order) goes to a split and shard chosen by a hash of (seed, i): a fraction `eval_fraction`
to "eval" (held out for pretraining evaluation), the rest to "train". The output depends only on the input, the
tokenizer, the seed and the shard counts, not on `--workers`. Each of K worker processes streams the whole input
(reading is cheap next to tokenizing) and tokenizes only the documents of its own shards, so memory stays flat.
Every shard is written under a temporary name and renamed when complete (for a gs:// --output_dir: written
locally, then uploaded in one put); rerunning after a crash skips finished shards. `manifest.json` is written last
and marks the preparation complete; like the shards it depends only on the inputs and settings (the time taken is
printed, not recorded), so rerunning a finished preparation leaves it byte-identical and a pretraining run that
recorded its sha256 resumes. The tokenizer (--spm_model: a SentencePiece model, a WordPiece vocab.txt, a byte-level
BPE vocab.json with its merges.txt, or a tokenizer.json; `wordpiece.load_tokenizer`) is copied in under the name
transformers looks for (spiece.model, vocab.txt, vocab.json + merges.txt, tokenizer.json), so the directory is all a
loader needs; the manifest records its kind and each file's sha256.

What may be reused is decided by `prepare_config.json`: the settings plus a fingerprint of every input file (path,
size, the sha256 of its contents; for a TFDS input, every file of the prepared dataset) and the tokenizer's sha256;
paths are recorded absolute, so the same files named from another directory are the same settings. A file whose
size, mtime and first and last MiB are as recorded keeps its recorded sha256 (a rerun reads no more than 2 MiB a
file); otherwise the whole file is hashed, so a corpus copied or checked out again (new mtimes, same bytes) is
reused, and its manifest stays as it was: a pretraining run on it resumes. Different settings are refused (they
are more likely a wrong --output_dir than a wish to lose the old output). The same settings over changed inputs
or a replaced --spm_model mean "prepare these files again", as `make` rebuilds after a source changed: the stale
shards are deleted and everything is prepared anew, said on stderr. A preparation that finds no documents deletes
what it wrote, so the corrected command starts afresh.
Files are only ever written under a fresh temporary name and renamed into place, so a symlink placed in the output
folder is replaced, never written through. Worker processes end themselves when the parent process dies (kill -9
included), so no orphan writes on. One preparation writes a folder at a time: a second is refused naming the first,
which holds `run.lock` there (`data_pipeline.writers`; a killed one does not block), and a folder that is or holds
an input file is refused.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import multiprocessing
import os
import resource
import sys
import threading
import time

from albert_jax import storage
from albert_jax.errors import InputError
from data_pipeline import cli, fingerprints, records, sources, writers
from data_pipeline.prepare_outputs import SPLITS, absolute_paths, check_or_record_identity, delete_outputs, is_done
from data_pipeline.prepare_shards import write_shards
from data_pipeline.sources import Source
from data_pipeline.tokenization import Tokenizer
from data_pipeline.wordpiece import load_tokenizer


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
  input: str
  spm_model: str
  output_dir: str
  format: str = "lines"
  text_field: str = "text"
  tfds_data_dir: str | None = None
  num_shards: int = 8
  num_eval_shards: int = 1
  eval_fraction: float = 0.01
  workers: int = 1
  seed: int = 0
  do_lower_case: bool = True
  max_sentence_tokens: int = 512       # longer sentences are cut into pieces of this many tokens (counted)
  max_document_units: int = 10_000     # longer documents are cut (counted); bounds memory per document
  max_unit_bytes: int = 1 << 20        # longer lines/paragraphs are cut (counted); bounds memory per line

  def __post_init__(self):
    """Every setting checked before anything is written: a bad one must not leave a prepare_config.json behind
    that then refuses the corrected command as "different settings"."""
    for flag in ("num_shards", "num_eval_shards", "workers", "max_sentence_tokens"):
      cli.check_at_least(flag, getattr(self, flag), 1)
    if not 0.0 <= self.eval_fraction < 1.0:
      raise InputError(f"--eval_fraction must be in [0, 1), got {self.eval_fraction}.")
    self._check_open_files()
    self.source()   # checks --format, --max_document_units and --max_unit_bytes

  def _check_open_files(self) -> None:
    """Refuses shard counts that would make a worker hold more files open than the process may (each keeps all
    its shards open while it streams the input): it would fail mid-way with "Too many open files"."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    shards = self.num_shards + self.num_eval_shards
    held = -(-shards // self.workers) + FILES_BESIDE_SHARDS
    if limit != resource.RLIM_INFINITY and held > limit:
      most = max((limit - FILES_BESIDE_SHARDS) * self.workers - self.num_eval_shards, 0)
      raise InputError(f"--num_shards={self.num_shards} and --num_eval_shards={self.num_eval_shards} over "
                       f"--workers={self.workers} make a worker hold {held - FILES_BESIDE_SHARDS:,} shard files open "
                       f"at once, beyond this process's limit of {limit:,} open files (ulimit -n): use at most "
                       f"--num_shards={most:,} with these workers, more --workers, or raise ulimit -n.")

  def source(self) -> Source:
    return Source(self.input, self.format, self.text_field, self.tfds_data_dir, self.max_document_units,
                  self.max_unit_bytes)

  def shard_counts(self) -> dict[str, int]:
    return {"train": self.num_shards, "eval": self.num_eval_shards}

  def identity(self) -> dict:
    """The settings that fix the output, paths made absolute; a resumed run must match them."""
    fields = dataclasses.asdict(self)
    for transient in ("workers", "output_dir"):
      fields.pop(transient)
    return absolute_paths(fields)


FILES_BESIDE_SHARDS = 64  # what else a worker may hold open: the input, the tokenizer, Python's own


def _watch_parent(parent: int) -> None:
  """Runs in each worker: end it as soon as the parent is gone (kill -9 gives the parent no chance to stop it)."""
  def watch():
    while os.getppid() == parent:
      time.sleep(0.2)
    os._exit(1)
  threading.Thread(target=watch, daemon=True).start()


def prepare(config: PrepareConfig) -> dict:
  """Write (or finish writing) the shards and the manifest; returns the manifest. The output folder has one writer
  at a time (`writers.WriterLock`), apart from the inputs."""
  tokenizer = load_tokenizer(config.spm_model, config.do_lower_case)   # fails early on a bad model path
  source = config.source()
  files = source.files("data_pipeline.prepare")
  for file in files:
    writers.check_apart("--output_dir", config.output_dir, "--input", file, "the preparation")
  inputs = [fingerprints.input_fingerprint(f, text=source.format != "tfds") for f in files]
  storage.path(config.output_dir).mkdir(parents=True, exist_ok=True)   # not the lock's: kept, emptied, if no documents
  with writers.WriterLock(os.path.join(config.output_dir, writers.LOCK_FILE), f"--output_dir={config.output_dir}",
                          "--output_dir", cli.on_stderr("data_pipeline.prepare")):
    return _prepare(config, tokenizer, files, inputs)


def _prepare(config: PrepareConfig, tokenizer: Tokenizer, files: list[str], inputs: list[dict]) -> dict:
  identity = check_or_record_identity(config, {**config.identity(), "inputs": inputs,
                                               "tokenizer_sha256": tokenizer.sha256})
  counts = config.shard_counts()
  todo = [(split, i) for split in SPLITS for i in range(counts[split])
          if not is_done(os.path.join(config.output_dir, records.shard_name(split, i, counts[split])))]
  if todo:
    workers = min(config.workers, len(todo))
    print(f"data_pipeline.prepare: {len(files)} input file(s), {sum(i['size'] for i in inputs) / 1e6:,.1f} "
          f"MB -> {len(todo)} shard(s) in {config.output_dir} with {workers} worker(s)...", file=sys.stderr,
          flush=True)
    if workers == 1:
      write_shards(config, todo)
    else:
      with multiprocessing.get_context("spawn").Pool(workers, _watch_parent, (os.getpid(),)) as pool:
        pool.starmap(write_shards, [(config, todo[k::workers], k == 0) for k in range(workers)])
  for file, name in zip(tokenizer.files, records.tokenizer_copy_names(tokenizer.files)):
    copy = os.path.join(config.output_dir, name)
    if not is_done(copy) or fingerprints.sha256(copy) != fingerprints.sha256(file):
      storage.copy_atomic(file, copy)
  manifest_path = os.path.join(config.output_dir, records.MANIFEST)
  complete = not todo and is_done(manifest_path)   # then kept byte for byte: a run that read it resumes
  manifest = (json.loads(storage.path(manifest_path).read_text()) if complete
              else _manifest(config, tokenizer, files, identity["inputs"]))
  if not sum(manifest["splits"][s]["documents"] for s in SPLITS):
    delete_outputs(config)   # nothing worth resuming: the corrected command (another --format) starts afresh
    raise InputError(f"No documents in --input={config.input!r} ({manifest['totals']}); check --format "
                     f"(now {config.source().format!r}) and that the files hold text.")
  for split in SPLITS:
    if not manifest["splits"][split]["documents"]:
      print(f"data_pipeline.prepare: warning: no document went to the {split} split (--eval_fraction="
            f"{config.eval_fraction} of {manifest['totals']['documents']} documents); {_EMPTY_SPLIT[split]}",
            file=sys.stderr, flush=True)
  for line in _corpus_warnings(manifest["totals"]):
    print(f"data_pipeline.prepare: warning: {line}", file=sys.stderr, flush=True)
  if not complete:
    storage.write_atomic(manifest_path, json.dumps(manifest, indent=1))
  return manifest


def _corpus_warnings(totals: dict) -> list[str]:
  """What the counts say of a corpus that prepares but would not pretrain as meant."""
  found = []
  bad, units = totals.get("non_utf8_lines", 0), totals.get("units", 0)
  if units and bad * 10 > units:
    found.append(f"{bad:,} of {units:,} lines hold bytes that are not UTF-8, read as U+FFFD (which tokenizes to "
                 "<unk>): the corpus is likely in another encoding; convert it (e.g. iconv -f latin1 -t utf-8) and "
                 "prepare again.")
  single, documents = totals.get("single_sentence_documents", 0), totals.get("documents", 0)
  if documents and single * 2 > documents:
    found.append(f"{single:,} of {documents:,} documents hold one sentence: sentence-order prediction pairs two "
                 "segments of one document, so it cannot learn from these; keep each document's sentences together "
                 "(one per line) with a blank line between documents.")
  return found


_EMPTY_SPLIT = {
    "train": "pretraining reads it and stops with an error: lower --eval_fraction or add documents.",
    "eval": ("pretraining with held-out evaluation (train.eval_every > 0) needs it and stops with an error: "
             "raise --eval_fraction or add documents, or train with --config.train.eval_every=0 (no held-out "
             "evaluation)."),
}


def _manifest(config: PrepareConfig, tokenizer: Tokenizer, files: list[str], inputs: list[dict]) -> dict:
  """A function of the inputs and settings only (no time taken, no --workers): the same preparation run again
  writes the same bytes, so a pretraining run that checked its sha256 resumes on it."""
  counts, names = config.shard_counts(), records.tokenizer_copy_names(tokenizer.files)
  splits, totals = {}, collections.Counter(empty_files=sum(i["size"] == 0 for i in inputs))
  for split in SPLITS:
    shards = []
    for i in range(counts[split]):
      name = records.shard_name(split, i, counts[split])
      stats = json.loads(storage.path(os.path.join(config.output_dir, name + ".stats.json")).read_text())
      shards.append({"file": name, "documents": stats.get("documents", 0)})
      totals.update(stats)
    splits[split] = {"shards": shards, "documents": sum(s["documents"] for s in shards)}
  return {
      "format_version": records.FORMAT_VERSION,
      "tokenizer": {"model": names[0], "kind": tokenizer.kind, "sha256": tokenizer.sha256,
                    "files": {name: fingerprints.sha256(file) for file, name in zip(tokenizer.files, names)},
                    "vocab_size": tokenizer.vocab_size, "do_lower_case": tokenizer.do_lower_case},
      "token_dtype": records.token_dtype(tokenizer.vocab_size).name,
      "config": config.identity(),
      "input_files": len(files),
      "inputs": [{k: f[k] for k in ("path", "size", "sha256")} for f in inputs],
      "splits": splits,
      "totals": dict(totals),
  }


def parse_args(argv: list[str]) -> PrepareConfig:
  parser = argparse.ArgumentParser(prog="python -m data_pipeline.prepare", description=__doc__,
                                   epilog=sources.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  defaults = PrepareConfig("", "", "")
  for field in dataclasses.fields(PrepareConfig):
    default = getattr(defaults, field.name)
    required = field.name in ("input", "spm_model", "output_dir")
    if isinstance(default, bool):
      parser.add_argument(f"--{field.name}", type=cli.boolean, default=default)
    else:
      kind = type(default) if default is not None and not required else str
      parser.add_argument(f"--{field.name}", type=kind, default=None if required else default, required=required)
  return PrepareConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> None:
  start = time.perf_counter()
  manifest = prepare(parse_args(sys.argv[1:] if argv is None else argv))
  print(json.dumps({"splits": {s: v["documents"] for s, v in manifest["splits"].items()},
                    "totals": manifest["totals"], "seconds": round(time.perf_counter() - start, 3)}, indent=1))


if __name__ == "__main__":
  cli.run("data_pipeline.prepare", main)
