"""The data loader's positions in a checkpoint (its `data` item, one state per process of the run that wrote it):
read back (`read_data_states`) and put into a resumed run's loader (`resume_position`), on the same or another
process count."""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import jax

from albert_jax import storage
from albert_jax.errors import InputError


@dataclasses.dataclass
class DataStates:
  """The loader states of a checkpoint's `data` item: `states[i]` is process i's, of the `process_count` processes
  that wrote it (only this process's is read when the count is unchanged)."""
  process_count: int
  states: dict[int, Any]


_DATA_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


def read_data_states(directory: str) -> DataStates:
  """The states in a step's `data` item, written by grain's handler as `process_<i>-of-<n>.json`. A missing or
  garbled file raises (damage); files written by another process count are read, not refused: whether they fit
  this run is `resume_position`'s decision."""
  data = storage.path(directory)
  index, count = jax.process_index(), jax.process_count()
  own = data / f"process_{index}-of-{count}.json"
  if own.exists():
    return DataStates(count, {index: json.loads(own.read_text())})
  found = [tuple(map(int, m.groups())) for m in (_DATA_FILE.fullmatch(p.name) for p in data.iterdir()) if m]
  counts = {n for _, n in found}
  if len(counts) != 1:
    raise InputError(f"{data} holds no loader state of process {index} of {count}"
                     f"{' and states of several process counts' if counts else ''}.")
  (written,) = counts
  missing = sorted(set(range(written)) - {i for i, _ in found})
  if missing:
    raise InputError(f"{data} lacks the loader state of process {missing[0]} of the {written} that wrote it.")
  return DataStates(written, {i: json.loads((data / f"process_{i}-of-{written}.json").read_text())
                              for i in range(written)})


def resume_position(train_iter, data: DataStates, where: str, resume_with_changes: bool) -> None:
  """Puts the loader at the checkpoint's position. Another process count than the writer's (like another mesh, a
  legitimate change) continues exactly when the loader declares its position global (`position_is_global`: a
  function of the step, the same on every process, as fine-tuning's and synthetic data's, or a place in one global
  stream, as full_sentences pretraining data's); a position kept per process (segment-pair pretraining data, each
  process reading its own share of the documents) is refused, or with resume_with_changes left behind: the data is
  read from its start."""
  count = jax.process_count()
  if data.process_count == count:
    train_iter.set_state(data.states[jax.process_index()])
    return
  written = f"{where} was written by {_processes(data.process_count)} and this run has {count}"
  if getattr(train_iter, "position_is_global", False):
    positions = list(data.states.values())
    if any(position != positions[0] for position in positions):
      raise InputError(f"{written}, and its processes' data positions differ ({positions[0]} vs "
                       f"{next(p for p in positions if p != positions[0])}), so none of them continues the run. "
                       f"Resume with {_processes(data.process_count)}, or use a new --workdir.")
    train_iter.set_state(positions[0])
    if jax.process_index() == 0:
      print(f"{written}; the data position is the same on every process, so the run continues exactly.", flush=True)
    return
  if not resume_with_changes:
    raise InputError(f"{written}: the data loader keeps a position per process, which means nothing on another "
                     f"process count. Resume with {_processes(data.process_count)}, or pass "
                     "--config.resume_with_changes=True to continue the model from there with the data read from "
                     "its start.")
  if jax.process_index() == 0:
    print(f"{written}; the data loader keeps a position per process, so the data is read from its start "
          "(resume_with_changes).", flush=True)


def _processes(count: int) -> str:
  return f"{count} process{'es' if count > 1 else ''}"
