"""What identifies an input file of a preparation: a cheap fingerprint (size, mtime, a hash of the first and last
MiB) read at every run, and the sha256 of the whole file, read only when the cheap fingerprint is not as recorded.
Equal bytes are the same input whatever the mtime, so a corpus copied or checked out again is not prepared again."""
from __future__ import annotations

import hashlib

from albert_jax import storage
from data_pipeline.sources import binary_file_error

SAMPLE_BYTES = 1 << 20   # hashed at each end of an input file


def input_fingerprint(path: str, text: bool = True) -> dict:
  """Size, mtime and a hash of the first and last MiB: cheap on a corpus of many GB, and it changes when a file
  is replaced, appended to or edited at either end. `text`: refuse a binary file (a NUL byte in those bytes)."""
  size, mtime_ns = storage.size_and_mtime_ns(path)
  digest = hashlib.sha256(str(size).encode())
  with storage.path(path).open("rb") as f:
    for start in sorted({0, max(0, size - SAMPLE_BYTES)}):
      f.seek(start)
      sample = f.read(SAMPLE_BYTES)
      if text and b"\0" in sample:
        raise binary_file_error(path, start + sample.index(b"\0"))
      digest.update(sample)
  return {"path": storage.absolute(path), "size": size, "mtime_ns": mtime_ns,
          "sample_sha256": digest.hexdigest()}


def with_contents_sha256(inputs: list[dict], previous: dict | None) -> list[dict]:
  """Each fingerprint with the sha256 of the whole file: the recorded one where the cheap fingerprint is as
  recorded, else read anew (a file with a new mtime may still hold the same bytes)."""
  known = {f["path"]: f for f in (previous or {}).get("inputs", []) if "sha256" in f}
  def recorded(f):
    before = known.get(f["path"], {})
    return before.get("sha256") if {k: v for k, v in before.items() if k != "sha256"} == f else None
  return [{**f, "sha256": recorded(f) or sha256(f["path"])} for f in inputs]


def same_input(before: dict, now: dict) -> bool:
  """The same path and bytes; a record written before contents were hashed compares its cheap fingerprint."""
  if "sha256" in before:
    return (before["path"], before["size"], before["sha256"]) == (now["path"], now["size"], now["sha256"])
  return before == {k: now[k] for k in before}


def sha256(path: str) -> str:
  """Of the whole file, read in pieces of 16 MiB (a corpus file may not fit in memory)."""
  digest = hashlib.sha256()
  with storage.path(path).open("rb") as f:
    while chunk := f.read(1 << 24):
      digest.update(chunk)
  return digest.hexdigest()


def same_entry(key: str, previous: dict, identity: dict) -> bool:
  """Whether entry `key` of two recorded identities (prepare_config.json) means the same preparation."""
  if key != "inputs":
    return previous.get(key) == identity.get(key)
  before, now = previous.get("inputs", []), identity["inputs"]
  return len(before) == len(now) and all(map(same_input, before, now))


def describe_change(previous: dict, identity: dict) -> str:
  """What made a preparation stale, in words: the tokenizer, or how many inputs changed and one of them."""
  if previous.get("tokenizer_sha256") != identity["tokenizer_sha256"]:
    return f"--spm_model {identity['spm_model']} changed (sha256)"
  before = {f["path"]: f for f in previous.get("inputs", [])}
  now = {f["path"]: f for f in identity["inputs"]}
  changed = sorted(p for p in set(before) | set(now) if p not in before or p not in now
                   or not same_input(before[p], now[p]))
  return f"{len(changed)} input file(s) changed, e.g. {changed[0]}" if changed else "the inputs changed"
