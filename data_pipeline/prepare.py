"""Tokenize a text corpus into sharded ArrayRecord files of documents (`python -m data_pipeline.prepare --help`).

Document i (in input order) goes to a split and shard chosen by a hash of (seed, i): a fraction `eval_fraction`
to "eval" (held out for pretraining evaluation), the rest to "train". The output depends only on the input, the
tokenizer, the seed and the shard counts, not on `--workers`. Each of K worker processes streams the whole input
(reading is cheap next to tokenizing) and tokenizes only the documents of its own shards, so memory stays flat.
Every shard is written under a temporary name and renamed when complete; rerunning after a crash skips finished
shards. `manifest.json` is written last and marks the preparation complete; the SentencePiece model is copied in
as `spiece.model`, so the directory is all a loader needs.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import multiprocessing
import os
import shutil
import sys
import time

from array_record.python.array_record_module import ArrayRecordWriter

from data_pipeline import records, rng, sources
from data_pipeline.sentences import split_sentences
from data_pipeline.sources import Source
from data_pipeline.tokenization import Tokenizer

SPLITS = ("train", "eval")


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

  def source(self) -> Source:
    return Source(self.input, self.format, self.text_field, self.tfds_data_dir, self.max_document_units)

  def shard_counts(self) -> dict[str, int]:
    return {"train": self.num_shards, "eval": self.num_eval_shards}

  def identity(self) -> dict:
    """The settings that fix the output; a resumed run must match them."""
    fields = dataclasses.asdict(self)
    for transient in ("workers", "output_dir"):
      fields.pop(transient)
    return fields


def assign(seed: int, doc_index: int, eval_fraction: float, counts: dict[str, int]) -> tuple[str, int]:
  key = rng.mix(seed, doc_index)
  split = "eval" if (key & 0xFFFFFFFF) < eval_fraction * 2**32 else "train"
  return split, (key >> 32) % counts[split]


def _tokenize(doc, source: Source, tokenizer: Tokenizer, config: PrepareConfig, stats) -> list[list[int]]:
  units = [s for u in doc.units for s in split_sentences(u)] if source.splits_sentences else doc.units
  sentences = []
  for ids in tokenizer.encode_batch(units):
    if not ids:
      stats["empty_sentences"] += 1
    elif len(ids) > config.max_sentence_tokens:
      stats["long_sentences_split"] += 1
      sentences.extend(ids[i:i + config.max_sentence_tokens] for i in range(0, len(ids), config.max_sentence_tokens))
    else:
      sentences.append(ids)
  return sentences


def _write_shards(config: PrepareConfig, shards: list[tuple[str, int]]) -> None:
  """Stream the input once and write the given (split, shard) files."""
  tokenizer = Tokenizer(config.spm_model, config.do_lower_case)
  dtype = records.token_dtype(tokenizer.vocab_size)
  counts, source = config.shard_counts(), config.source()
  final = {s: os.path.join(config.output_dir, records.shard_name(s[0], s[1], counts[s[0]])) for s in shards}
  writers = {s: ArrayRecordWriter(final[s] + ".tmp", "group_size:1") for s in shards}
  stats = {s: collections.Counter() for s in shards}
  for doc_index, doc in enumerate(source.documents()):
    shard = assign(config.seed, doc_index, config.eval_fraction, counts)
    if shard not in writers:
      continue
    st = stats[shard]
    st["non_utf8_lines"] += doc.non_utf8_lines
    st["documents_cut"] += doc.cut
    if doc.unreadable:
      st["unreadable_records"] += 1
      continue
    sentences = _tokenize(doc, source, tokenizer, config, st)
    if not sentences:
      st["empty_documents_skipped"] += 1
      continue
    st["single_sentence_documents"] += len(sentences) == 1
    st["documents"] += 1
    st["sentences"] += len(sentences)
    st["tokens"] += sum(map(len, sentences))
    writers[shard].write(records.encode_document(sentences, dtype))
  for shard in shards:
    writers[shard].close()
    with open(final[shard] + ".stats.tmp", "w") as f:
      json.dump(dict(stats[shard]), f)
    os.replace(final[shard] + ".stats.tmp", final[shard] + ".stats.json")
    os.replace(final[shard] + ".tmp", final[shard])


def _check_or_record_identity(config: PrepareConfig) -> None:
  path = os.path.join(config.output_dir, "prepare_config.json")
  if os.path.exists(path):
    with open(path) as f:
      previous = json.load(f)
    if previous != config.identity():
      changed = sorted(k for k in set(previous) | set(config.identity()) if previous.get(k) != config.identity().get(k))
      raise ValueError(f"{config.output_dir!r} holds a preparation with different settings ({', '.join(changed)}); "
                       "use a new --output_dir, or delete it to start over.")
    return
  os.makedirs(config.output_dir, exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(config.identity(), f, indent=1)
  os.replace(path + ".tmp", path)


def prepare(config: PrepareConfig) -> dict:
  """Write (or finish writing) the shards and the manifest; returns the manifest."""
  tokenizer = Tokenizer(config.spm_model, config.do_lower_case)   # fails early on a bad model path
  if not 0.0 <= config.eval_fraction < 1.0:
    raise ValueError(f"--eval_fraction must be in [0, 1), got {config.eval_fraction}.")
  source = config.source()
  files = [] if source.format == "tfds" else source.files()
  _check_or_record_identity(config)
  counts = config.shard_counts()
  todo = [(split, i) for split in SPLITS for i in range(counts[split])
          if not os.path.exists(os.path.join(config.output_dir, records.shard_name(split, i, counts[split])))]
  start = time.time()
  if todo:
    workers = max(1, min(config.workers, len(todo)))
    if workers == 1:
      _write_shards(config, todo)
    else:
      with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.starmap(_write_shards, [(config, todo[k::workers]) for k in range(workers)])
  model_copy = os.path.join(config.output_dir, records.SPM_MODEL)
  if not (os.path.exists(model_copy) and os.path.samefile(config.spm_model, model_copy)):
    shutil.copyfile(config.spm_model, model_copy)
  manifest = _manifest(config, tokenizer, files)
  manifest["seconds"] = round(time.time() - start, 3)
  if not sum(manifest["splits"][s]["documents"] for s in SPLITS):
    raise ValueError(f"No documents in --input={config.input!r} ({manifest['totals']}); check --format "
                     f"(now {source.format!r}) and that the files hold text.")
  path = os.path.join(config.output_dir, records.MANIFEST)
  with open(path + ".tmp", "w") as f:
    json.dump(manifest, f, indent=1)
  os.replace(path + ".tmp", path)
  return manifest


def _manifest(config: PrepareConfig, tokenizer: Tokenizer, files: list[str]) -> dict:
  counts = config.shard_counts()
  splits, totals = {}, collections.Counter(empty_files=sum(os.path.getsize(f) == 0 for f in files))
  for split in SPLITS:
    shards = []
    for i in range(counts[split]):
      name = records.shard_name(split, i, counts[split])
      with open(os.path.join(config.output_dir, name + ".stats.json")) as f:
        stats = json.load(f)
      shards.append({"file": name, "documents": stats.get("documents", 0)})
      totals.update(stats)
    splits[split] = {"shards": shards, "documents": sum(s["documents"] for s in shards)}
  return {
      "format_version": records.FORMAT_VERSION,
      "tokenizer": {"model": records.SPM_MODEL, "sha256": tokenizer.sha256,
                    "vocab_size": tokenizer.vocab_size, "do_lower_case": config.do_lower_case},
      "token_dtype": records.token_dtype(tokenizer.vocab_size).name,
      "config": config.identity(),
      "input_files": len(files),
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
      parser.add_argument(f"--{field.name}", type=lambda v: v.lower() in ("1", "true", "yes"), default=default)
    else:
      kind = type(default) if default is not None and not required else str
      parser.add_argument(f"--{field.name}", type=kind, default=None if required else default, required=required)
  return PrepareConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> None:
  manifest = prepare(parse_args(sys.argv[1:] if argv is None else argv))
  print(json.dumps({"splits": {s: v["documents"] for s, v in manifest["splits"].items()},
                    "totals": manifest["totals"], "seconds": manifest["seconds"]}, indent=1))


if __name__ == "__main__":
  main()
