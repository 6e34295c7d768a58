"""JAX's persistent compilation cache for a run: where it lives, its entries checked at start-up, its hits counted.

A preempted or restarted job finds the train step it compiled before in `workdir/compilation_cache` (or
`compilation_cache_dir`) and starts without recompiling it.
"""
from __future__ import annotations

import json
import os

import jax
import ml_collections

from albert_jax import storage
from albert_jax.run import Run


class _HitCounter:
  """Counts the persistent cache's hits in this process, so that the compile line can say a step came from it."""

  def __init__(self):
    self.count = 0
    self.listening = False

  def listen(self) -> None:
    if not self.listening:
      jax.monitoring.register_event_listener(self._on_event)
      self.listening = True

  def _on_event(self, event: str, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
      self.count += 1


_HITS = _HitCounter()


def hits() -> int:
  """Persistent-cache hits in this process since `use` turned the cache on (0 without it)."""
  return _HITS.count


def use(config: ml_collections.ConfigDict, run: Run) -> str | None:
  """Turns on JAX's persistent compilation cache (`compilation_cache_dir`, default the run's `compilation_cache`),
  so that a preempted or restarted job skips recompiling the step. "none" turns it off, and so does a local folder
  that cannot be written (the read-only workdir of predict or embed), with one line saying so."""
  directory = config.get("compilation_cache_dir", "") or run.compilation_cache
  if directory == "none":
    return None
  if not storage.is_remote(directory) and not _can_write(directory):
    if jax.process_index() == 0:
      print(f"Compilation cache off: {directory} cannot be written; pass --config.compilation_cache_dir=DIR to "
            "keep one elsewhere.", flush=True)
    return None
  _HITS.listen()
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  if not storage.is_remote(directory) and jax.process_index() == 0:  # only process 0 writes entries
    remove_unreadable_entries(directory)
  return directory


def _can_write(directory: str) -> bool:
  """Whether `directory`, or the nearest folder above it that exists (where it would be made), is writable."""
  existing = os.path.abspath(directory)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  return os.access(existing, os.W_OK | os.X_OK)


CHECKED_ENTRIES = "albert_jax_checked.json"


def remove_unreadable_entries(directory: str) -> list[str]:
  """JAX writes a compilation-cache entry in place and never replaces one that exists, so an entry cut short by a
  kill -9 during its write would fail to read at every later start (a warning, then the full compile, each time).
  Entries not seen before are decompressed once here (`albert_jax_checked.json` remembers size and mtime of
  those that read whole); unreadable ones are removed, and the next compile writes them again. Returns their
  names. A local cache only: an object store shows an upload only once complete."""
  from jax._src import compilation_cache as jax_cache  # the decompression jax applies when it reads an entry
  memo = os.path.join(directory, CHECKED_ENTRIES)
  try:
    checked = json.loads(storage.path(memo).read_text())
  except (FileNotFoundError, ValueError):  # none yet, or cut short itself
    checked = {}
  readable, removed = {}, []
  for entry in storage.glob(os.path.join(directory, "*-cache")):
    name = os.path.basename(entry)
    try:
      stamp = list(storage.size_and_mtime_ns(entry))
      data = None if checked.get(name) == stamp else storage.path(entry).read_bytes()
    except OSError:  # evicted meanwhile, or not readable by us: left to jax
      continue
    if data is not None:
      try:
        jax_cache.decompress_executable(data)
      except Exception:  # noqa: BLE001 - zlib and zstd each raise their own error for a truncated stream
        try:
          storage.remove(entry)
        except OSError:
          continue
        removed.append(name)
        print(f"Removed the compilation cache entry {entry}: it does not read back whole (a run was killed while "
              "writing it); it is compiled and written again.", flush=True)
        continue
    readable[name] = stamp
  if readable != checked:
    try:
      storage.write_atomic(memo, json.dumps(readable))
    except OSError:  # another process sharing the cache wrote it at the same moment: checked again next time
      pass
  return removed
