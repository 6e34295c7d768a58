"""One training run per workdir: process 0 owns `workdir/run.lock` while it trains.

Two runs in one workdir would overwrite each other's checkpoints and interleave their metrics under the same
steps, both reporting success. The lock names its owner (host, PID, start time) and is refreshed every
`HEARTBEAT_SECONDS`; a second run is refused with the owner's name. A dead owner never leaves the workdir stuck:
on the same host a lock whose PID no longer runs this program is taken over at once (kill -9, then resume), and
from another host a lock whose heartbeat is older than `STALE_SECONDS` is.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

from albert_jax import storage

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


class WorkdirLock:
  """`with WorkdirLock(workdir):` around a training run (a no-op on processes other than 0)."""

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
      raise RuntimeError(f"Workdir {os.path.dirname(self.path)} is in use by a run on host {held.get('host')} "
                         f"(PID {held.get('pid')}, started {since}); wait for it, stop it, or use another --workdir.")
    print(f"Taking over {self.path} from a run that is no longer alive (host {held.get('host')}, PID "
          f"{held.get('pid')}).", flush=True)

  def _heartbeat(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECONDS):
      self._write()

  def __enter__(self) -> "WorkdirLock":
    if self.owner:
      self._check_owner()
      self._write()
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
