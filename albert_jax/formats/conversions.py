"""Weights of another format read where ours are (`init_checkpoint`): converted once into our layout under
`cache_dir(format)`, one folder per state of the source's files (or per Hub commit), and read from there after
(`registry.converted` chooses the format).
"""
from __future__ import annotations

import hashlib
import os
import shutil
from typing import Callable

import jax

from albert_jax.errors import InputError
from albert_jax.weights import store


def cache_dir(format_name: str) -> str:
  """Where converted weights of `format_name` are kept: $XDG_CACHE_HOME/albert_jax/FORMAT (default ~/.cache)."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "albert_jax", format_name)


def folder_key(path: str) -> str:
  """A local source's conversion key: its path and the name, size and modification time of each file of its folder
  (of the folder holding it, for a checkpoint prefix), so that a source saved again is converted again."""
  folder = path if os.path.isdir(path) else os.path.dirname(path)
  digest = hashlib.sha256(os.path.realpath(path).encode())
  for entry in sorted(os.scandir(folder), key=lambda e: e.name):
    if entry.is_file():
      stat = entry.stat()
      digest.update(f"\0{entry.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
  return f"{os.path.basename(path.rstrip('/')) or 'folder'}-{digest.hexdigest()[:16]}"


def convert_once(read: Callable[[str, str], str], source: str, target: str, origin: str, named: str,
                 format_name: str) -> str:
  """`target`, our folder of `source` converted by `read(source, folder)` unless an earlier run converted it;
  `origin` names the source and `named` the flag and value that asked, in the lines said. Several processes are
  refused: each host would convert into its own cache."""
  if jax.process_count() > 1:
    raise InputError(f"{named} is a model of the {format_name} format, converted on the fly by a single process "
                     f"only: convert it once (python -m albert_jax.convert --from={format_name} --src=... "
                     "--dst=gs://BUCKET/DIR) and pass that folder.")
  if store.is_pretrained_dir(target):
    print(f"{named}: reading its conversion in {target}", flush=True)
    return target
  partial = f"{target}.partial-{os.getpid()}"
  try:
    said = read(source, partial)
    try:
      os.rename(partial, target)  # whole or not at all; a conversion that another process finished first stays
    except OSError:
      if not store.is_pretrained_dir(target):
        raise
  finally:
    shutil.rmtree(partial, ignore_errors=True)
  print(f"{named}: converted {origin} into {target} ({said}); later runs read it from there (delete it to free the "
        "space)", flush=True)
  return target
