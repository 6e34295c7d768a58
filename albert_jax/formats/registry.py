"""The registered weight formats, by name: what `convert --from` (those that read) and `--to` (those that write)
take, and what `init_checkpoint` takes besides ours (`converted`). A new format is a module declaring its `Format`,
listed here."""
from __future__ import annotations

import os

from albert_jax import storage
from albert_jax.errors import InputError
from albert_jax.formats import Format, conversions, hf, tf1

FORMATS: dict[str, Format] = {f.name: f for f in (hf.FORMAT, tf1.FORMAT)}


def readers() -> list[str]:
  return [name for name, f in FORMATS.items() if f.read]


def writers() -> list[str]:
  return [name for name, f in FORMATS.items() if f.write]


def get(name: str) -> Format:
  """The format called `name`, refused in one line naming the registered ones."""
  if name not in FORMATS:
    raise InputError(f"No weight format {name!r}; the formats are {', '.join(FORMATS)}.")
  return FORMATS[name]


def converted(value: str, revision: str = "", flag: str = "init_checkpoint") -> str | None:
  """Our folder for the weights of another format that `value` names, converted once into the cache
  (`conversions`): a Hugging Face folder or Hub name (`hf.converted`), a local path that a format `recognises` (a
  TF1 checkpoint); None for ours (a converted folder, a run), read as they are."""
  if folder := hf.converted(value, revision, flag):
    return folder
  if not value or storage.is_remote(value):
    return None
  fmt = next((f for f in FORMATS.values() if f.recognises and f.recognises(value)), None)
  if fmt is None:
    return None
  target = os.path.join(conversions.cache_dir(fmt.name), conversions.folder_key(value))
  return conversions.convert_once(fmt.read, value, target, value, f"{flag}={value}", fmt.name)
