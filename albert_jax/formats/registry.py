"""The registered weight formats, by name: what `convert --from` (those that read) and `--to` (those that write)
take. A new format is a module declaring its `Format`, listed here."""
from __future__ import annotations

from albert_jax.errors import InputError
from albert_jax.formats import Format, hf, tf1

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
