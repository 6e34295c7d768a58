"""One training run per workdir: process 0 holds its `run.lock` while it trains.

Two runs in one workdir would overwrite each other's checkpoints and interleave their metrics under the same
steps, both reporting success. The lock is `data_pipeline.writers.WriterLock` (its docstring has the rules: the
holder named, a dead holder never blocking); here a second run is refused on every process of a multi-host run.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

from albert_jax.run.layout import Run
from data_pipeline.writers import InUse, WriterLock


class WorkdirLock(WriterLock):
  """`with WorkdirLock(run, owner=process 0):` around a training run."""

  def __init__(self, run: Run, owner: bool = True):
    super().__init__(run.lock, f"Workdir {run.workdir}", "--workdir")
    self.owner = owner

  def __enter__(self) -> "WorkdirLock":
    """Process 0 takes the lock; the other processes learn whether it did, so that a refused run stops on every
    host rather than leaving the others waiting for it in their first collective."""
    failure = None
    if self.owner:
      try:
        self.acquire()
      except Exception as e:  # noqa: BLE001 - said to the other processes, then raised
        failure = e
    if jax.process_count() > 1 and multihost_utils.broadcast_one_to_all(np.int32(failure is not None)):
      failure = failure or InUse(f"Workdir {self.folder} could not be locked by process 0 (its error "
                                 "says why); wait for the run using it, stop it, or use another --workdir.")
    if failure is not None:
      raise failure
    return self
