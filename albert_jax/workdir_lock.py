"""One training run per workdir: process 0 owns `workdir/run.lock` while it trains.

Two runs in one workdir would overwrite each other's checkpoints and interleave their metrics under the same
steps, both reporting success. The lock names its owner (host, PID, start time) and is refreshed every
`HEARTBEAT_SECONDS`; a second run is refused with the owner's name, on every process of a multi-host run. A dead owner never leaves the workdir stuck:
on the same host a lock whose PID no longer runs this program is taken over at once (kill -9, then resume), and
from another host a lock whose heartbeat is older than `STALE_SECONDS` is.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from albert_jax import storage
from albert_jax.errors import EnvironmentUserError

LOCK_FILE = "run.lock"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 120.0


def _running(pid: int) -> bool:
  """Whether `pid` is a live albert_jax process on this host (a reused PID of another program does not count)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return b"albert_jax" in f.read()
  except OSError:
    return True


class WorkdirInUse(EnvironmentUserError):
  """Another live run holds the workdir's lock."""


class WorkdirLock:
  """`with WorkdirLock(workdir, owner=process 0):` around a training run."""

  def __init__(self, workdir: str, owner: bool = True):
    self.path = os.path.join(workdir, LOCK_FILE)
    self.owner = owner
    self.record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def _read(self) -> dict | None:
    try:
      return json.loads(storage.path(self.path).read_text())
    except (FileNotFoundError, ValueError):  # absent, or a half-written file from a crash
      return None

  def _write(self) -> None:
    storage.write_atomic(self.path, json.dumps({**self.record, "heartbeat": time.time()}))

  def _check_owner(self) -> None:
    held = self._read()
    if held is None:
      return
    if held.get("host") == self.record["host"]:
      alive = _running(int(held.get("pid", -1)))
    else:
      alive = time.time() - float(held.get("heartbeat", 0)) < STALE_SECONDS
    if alive:
      since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(held.get("started", 0))))
      raise WorkdirInUse(f"Workdir {os.path.dirname(self.path)} is in use by a run on host {held.get('host')} "
                         f"(PID {held.get('pid')}, started {since}); wait for it, stop it, or use another --workdir.")
    print(f"Taking over {self.path} from a run that is no longer alive (host {held.get('host')}, PID "
          f"{held.get('pid')}).", flush=True)

  def _heartbeat(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECONDS):
      self._write()

  def __enter__(self) -> "WorkdirLock":
    """Process 0 takes the lock; the other processes learn whether it did, so that a refused run stops on every
    host rather than leaving the others waiting for it in their first collective."""
    failure = None
    if self.owner:
      try:
        self._check_owner()
        self._write()
      except Exception as e:  # noqa: BLE001 - said to the other processes, then raised
        failure = e
    if jax.process_count() > 1 and multihost_utils.broadcast_one_to_all(np.int32(failure is not None)):
      failure = failure or WorkdirInUse(f"Workdir {os.path.dirname(self.path)} could not be locked by process 0 "
                                        "(its error says why); wait for the run using it, stop it, or use another "
                                        "--workdir.")
    if failure is not None:
      raise failure
    if self.owner:
      self._thread = threading.Thread(target=self._heartbeat, name="workdir-lock", daemon=True)
      self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    if self._thread is not None:
      self._stop.set()
      self._thread.join()
      held = self._read()
      if held and held.get("pid") == self.record["pid"] and held.get("host") == self.record["host"]:
        storage.remove(self.path)
