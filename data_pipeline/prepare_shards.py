"""Each preparation worker's job: stream the whole input once, tokenize the documents that fall in its own shards
(`assign`: a hash of the seed and the document's index) and write those shards. `data_pipeline.prepare` runs the
workers; `config` here is its `PrepareConfig`."""
from __future__ import annotations

import collections
import json
import os
import tempfile

from array_record.python.array_record_module import ArrayRecordWriter

from albert_jax import storage
from data_pipeline import records, rng
from data_pipeline.progress import Progress
from data_pipeline.sentences import split_sentences
from data_pipeline.sources import Source
from data_pipeline.tokenization import Tokenizer
from data_pipeline.wordpiece import load_tokenizer

# A record per chunk, stored uncompressed: the loader reads one random document at a time, and zstd (ArrayRecord's
# default) costs about half of such a read (~15 us a document, ~4% of the loader's rate at seq 512) to save a
# third of the disk.
_SHARD_OPTIONS = "group_size:1,uncompressed"


def assign(seed: int, doc_index: int, eval_fraction: float, counts: dict[str, int]) -> tuple[str, int]:
  key = rng.mix(seed, doc_index)
  split = "eval" if (key & 0xFFFFFFFF) < eval_fraction * 2**32 else "train"
  return split, (key >> 32) % counts[split]


def _tokenize(doc, source: Source, tokenizer: Tokenizer, config, stats) -> list[list[int]]:
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


def write_shards(config, shards: list[tuple[str, int]], reports: bool = True) -> None:
  """Stream the input once and write the given (split, shard) files: locally under a temporary name, then
  renamed, or uploaded for a gs:// output (ArrayRecord writes local files only). `reports`: show progress (one
  worker does, for all: each reads the whole input at about the same pace)."""
  tokenizer = load_tokenizer(config.spm_model, config.do_lower_case)
  dtype = records.token_dtype(tokenizer.vocab_size)
  counts, source = config.shard_counts(), config.source()
  final = {s: os.path.join(config.output_dir, records.shard_name(s[0], s[1], counts[s[0]])) for s in shards}
  staging = tempfile.mkdtemp(prefix="albert_jax_shards_") if storage.is_remote(config.output_dir) else None
  written = {s: os.path.join(staging, os.path.basename(final[s])) if staging else final[s] + ".tmp" for s in shards}
  writers = {s: ArrayRecordWriter(_fresh(written[s]), _SHARD_OPTIONS) for s in shards}
  stats = {s: collections.Counter() for s in shards}
  progress = Progress("data_pipeline.prepare", "documents read", source.total()) if reports else None
  for doc_index, doc in enumerate(source.documents()):
    if progress:
      progress.update(doc_index + 1, doc.position)
    shard = assign(config.seed, doc_index, config.eval_fraction, counts)
    if shard not in writers:
      continue
    st = stats[shard]
    st["non_utf8_lines"] += doc.non_utf8_lines
    st["units"] += len(doc.units)
    st["documents_cut"] += doc.cut
    st["lines_cut"] += doc.lines_cut
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
  if progress:
    progress.done()
  for shard in shards:
    writers[shard].close()
    storage.write_atomic(final[shard] + ".stats.json", json.dumps(dict(stats[shard]), indent=1))
    if staging:
      storage.copy_atomic(written[shard], final[shard])
      os.unlink(written[shard])
    else:
      os.replace(written[shard], final[shard])
  if staging:
    os.rmdir(staging)


def _fresh(path: str) -> str:
  """`path` with whatever was there (a symlink included) removed, so writing to it cannot go through a link."""
  if os.path.lexists(path):
    os.unlink(path)
  return path

