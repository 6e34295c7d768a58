"""Weight formats: other tools' weight folders read into our pretrained-weights folders, ours written out as theirs.

Each format is one module that declares its `Format` (what it can do: read, write); `formats.registry` lists them and
`convert` dispatches over that list. Inside a format, what differs between model families is a column keyed by
`Family.name`: of the name table (`formats.names`) and of the format's own per-family data.
"""
from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Format:
  """One format. `read(src, dst, clear)` converts its folder `src` into our folder `dst` (after `clear()` empties
  dst of an earlier conversion) and returns what it wrote, for the closing line; `write(weights, dst,
  encoder_only, spm_model, clear)` converts our weights (a `weights.Weights`, resolved from a converted folder or
  a training workdir by `weights.resolve_ours`) into its folder and says so."""
  name: str
  summary: str  # what its folders are, for `convert --help`
  read: Callable[..., str] | None = None
  write: Callable[..., None] | None = None
  locate: Callable[[str, str, str, str], str | None] | None = None  # (name, revision, flags): a Hub name's folder
  local: str = ""  # why its folders must be local (gs:// refused), where they must
  recognises: Callable[[str], bool] | None = None  # whether a local path holds its weights (init_checkpoint takes it)
