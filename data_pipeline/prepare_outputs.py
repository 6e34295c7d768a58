"""The files a preparation leaves in its --output_dir: which they are, which are finished, deleting them, and the
recorded settings (`prepare_config.json`) that decide whether they may be reused (`data_pipeline.prepare`'s
docstring says when). `config` here is a `data_pipeline.prepare.PrepareConfig`."""
from __future__ import annotations

import json
import os
import sys

from albert_jax import storage
from albert_jax.errors import InputError
from data_pipeline import fingerprints, records
from data_pipeline.sources import absolute_input

SPLITS = ("train", "eval")
CONFIG_FILE = "prepare_config.json"


def absolute_paths(identity: dict) -> dict:
  """`identity` with its local paths made absolute (URLs and tfds: names as they are)."""
  data_dir = identity.get("tfds_data_dir")
  return {**identity, "input": absolute_input(identity["input"]), "spm_model": storage.absolute(identity["spm_model"]),
          "tfds_data_dir": data_dir and storage.absolute(data_dir)}


def is_done(path: str) -> bool:
  """A finished output file; a symlink placed there is not one (it is replaced)."""
  return storage.path(path).is_file() and not os.path.islink(path)


def _outputs(config) -> list[str]:
  """Every file this preparation writes, temporary ones included, in deletion order (manifest first, settings
  last)."""
  counts = config.shard_counts()
  shards = [os.path.join(config.output_dir, records.shard_name(split, i, counts[split]))
            for split in SPLITS for i in range(counts[split])]
  names = (records.MANIFEST,) + records.TOKENIZER_COPIES
  return [os.path.join(config.output_dir, name + suffix) for name in names for suffix in ("", ".tmp")] + [
      shard + suffix for shard in shards for suffix in ("", ".tmp", ".stats.json", ".stats.json.tmp")] + [
      os.path.join(config.output_dir, CONFIG_FILE)]


def delete_outputs(config) -> None:
  for output in _outputs(config):   # the manifest first: an interrupted deletion leaves no complete-looking data
    storage.remove(output)


def check_or_record_identity(config, identity: dict) -> dict:
  """Refuse other settings; over changed inputs or tokenizer, delete the stale outputs (as
  `data_pipeline.prepare`'s docstring says).
  Returns the identity recorded, its inputs' fingerprints with their contents' sha256."""
  path = os.path.join(config.output_dir, CONFIG_FILE)
  previous = None
  if storage.path(path).exists():
    previous = absolute_paths(json.loads(storage.path(path).read_text()))   # earlier versions kept them as given
  identity = {**identity, "inputs": fingerprints.with_contents_sha256(identity["inputs"], previous)}
  if previous == identity:
    return identity
  if previous is not None:
    changed = sorted(k for k in set(previous) | set(identity) if not fingerprints.same_entry(k, previous, identity))
    settings = [k for k in changed if k not in _CONTENT_KEYS]
    if settings:
      raise InputError(f"{config.output_dir!r} holds a preparation with different settings ({', '.join(settings)}); "
                       "use a new --output_dir, or delete it to start over.")
    if changed:
      print(f"data_pipeline.prepare: {fingerprints.describe_change(previous, identity)} since the preparation in "
            f"{config.output_dir!r}; deleting its shards and preparing again.", file=sys.stderr, flush=True)
      delete_outputs(config)
    elif touched := sum(a.get("mtime_ns") != b["mtime_ns"] for a, b in zip(previous["inputs"], identity["inputs"])):
      print(f"data_pipeline.prepare: {touched} input file(s) have new mtimes but the same contents (sha256) as "
            f"when {config.output_dir!r} was prepared; reusing it.", file=sys.stderr, flush=True)
  storage.write_atomic(path, json.dumps(identity, indent=1))
  return identity


_CONTENT_KEYS = ("inputs", "tokenizer_sha256")

