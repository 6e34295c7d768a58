"""One writer per output, apart from what it reads: the rules every tool that writes a folder or file follows.

Two writers of one output interleave and both report success: two preparations into one --output_dir leave a
manifest that counts documents in shards the other emptied; two training runs in one workdir overwrite each other's
checkpoints. So a writer holds `WriterLock` while it writes: a lock file naming its holder (host, PID, start time),
refreshed every `HEARTBEAT_SECONDS`; a second writer is refused with the holder's name. A dead holder never blocks:
on the same host a lock whose process has ended (kill -9 included; its PID reused by a later process does not
count) is taken over at once, and from another host a lock whose heartbeat is older than `STALE_SECONDS` is. A lock
file that holds no lock record was not written by a writer (each writes it whole, atomically), so it is refused in
one line rather than guessed at. And a tool never writes where it reads (`check_apart`).

Here in the data layer, above only errors and storage, so that the data tools can use it; `albert_jax` takes it
from here (`albert_jax.run.lock` adds the processes of a multi-host run).
"""
from __future__ import annotations

import json
import os
import pathlib
import socket
import threading
import time
from typing import Callable

from albert_jax import storage
from albert_jax.errors import EnvironmentUserError, InputError

LOCK_FILE = "run.lock"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 120.0
_FIELDS = {"host": str, "pid": int, "started": (int, float), "heartbeat": (int, float)}


class InUse(EnvironmentUserError):
  """Another live writer holds the output's lock, or its lock file holds no lock record."""


def _process_start(pid: int) -> int | None:
  """When process `pid` started (clock ticks since boot, from /proc), which tells it from a later process given the
  same PID; None if it is not running (a zombie, killed but not yet reaped, is not). Without /proc, 0 for any PID
  that runs."""
  if not os.path.isdir("/proc/self"):
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return None
    except PermissionError:
      pass
    return 0
  try:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
  except FileNotFoundError:
    return None
  return None if fields[0] == b"Z" else int(fields[19])


def _say(line: str) -> None:
  print(line, flush=True)


class WriterLock:
  """`with WriterLock(path, name, flag):` around the writing of one output; `path` is its lock file (`LOCK_FILE` in
  a folder), `name` the output as the messages call it, `flag` the flag that picks another one, `say` prints the
  line that tells of a takeover."""

  def __init__(self, path: str, name: str, flag: str, say: Callable[[str], None] = _say):
    self.path, self.name, self.flag, self.say = path, name, flag, say
    self.folder = os.path.dirname(path)
    self.record = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid()),
                   "started": time.time()}
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._made_folder = False

  def _read(self) -> dict | None:
    """The holder's record, None without a lock file; InUse for a file that holds no record."""
    try:
      data = storage.path(self.path).read_bytes()
    except FileNotFoundError:
      return None
    try:
      record = json.loads(data)
    except ValueError:  # not JSON, or not UTF-8
      record = None
    if not (isinstance(record, dict) and all(isinstance(record.get(k), t) for k, t in _FIELDS.items())):
      raise InUse(f"{self.path} holds no lock record ({repr(data[:60]) if data.strip() else 'empty'}): delete it if "
                  "no other run is writing there, then run again.")
    return record

  def _text(self) -> str:
    return json.dumps({**self.record, "heartbeat": time.time()})

  def _write(self) -> None:
    storage.write_atomic(self.path, self._text())

  def _create(self) -> bool:
    """Writes the lock file where none is in one step that fails if one is there (a local file opened with mode
    "x"; in a bucket, an upload on the condition that no object exists), so that of two writers starting together
    one holds it; False if one appeared since it was read."""
    if storage.is_remote(self.path):
      return storage.create_new_object(self.path, self._text())
    os.makedirs(self.folder, exist_ok=True)
    try:
      with open(self.path, "x", encoding="utf-8") as f:
        f.write(self._text())
    except FileExistsError:
      if os.path.exists(self.path):
        return False
      self._write()  # a dangling symlink: replaced, not written through
    return True

  def _check_holder(self, held: dict) -> None:
    if held["host"] == self.record["host"]:
      start = _process_start(held["pid"])
      alive = start is not None and start == held.get("process_start", start)  # an older record has no start
    else:
      alive = time.time() - held["heartbeat"] < STALE_SECONDS
    if alive:
      since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held["started"]))
      raise InUse(f"{self.name} is in use by a run on host {held['host']} (PID {held['pid']}, started {since}); "
                  f"wait for it, stop it, or use another {self.flag}{self._clock(held)}.")
    self.say(f"Taking over {self.path} from a run that is no longer alive (host {held['host']}, PID {held['pid']}).")

  def _clock(self, held: dict) -> str:
    """What to say of a heartbeat from the future: the holder's clock runs ahead of this host's, so its lock would
    look alive until this clock catches up, however long ago the holder died."""
    ahead = held["heartbeat"] - time.time()
    if ahead < STALE_SECONDS:
      return ""
    span = f"{ahead / 86400:,.0f} days" if ahead >= 86400 else f"{ahead:,.0f} s"
    return (f"; its heartbeat is {span} ahead of this host's clock: the hosts' clocks disagree, and a dead holder's "
            f"lock looks alive until this clock catches up; set the clocks right (NTP), or delete {self.path} if no "
            "run is writing there")

  def _heartbeat(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECONDS):
      self._write()

  def _claim(self) -> None:
    if (held := self._read()) is not None:
      self._check_holder(held)
      self._write()
    elif not self._create():
      self._claim()  # judges the writer that created it since it was read

  def acquire(self) -> None:
    self._made_folder = not storage.is_remote(self.folder) and not os.path.isdir(self.folder)
    self._claim()
    self._thread = threading.Thread(target=self._heartbeat, name="writer-lock", daemon=True)
    self._thread.start()

  def release(self) -> None:
    """Removes the lock file if this writer still holds it, and the folder that taking it made if nothing else is
    in it (a command that failed before writing leaves nothing behind); nothing if it never took the lock."""
    if self._thread is None:
      return
    self._stop.set()
    self._thread.join()
    try:
      held = self._read()
    except InUse:  # replaced by something that is no lock: not this writer's to remove
      return
    if held and held["pid"] == self.record["pid"] and held["host"] == self.record["host"]:
      storage.remove(self.path)
      if self._made_folder and not os.listdir(self.folder):
        os.rmdir(self.folder)

  def __enter__(self) -> "WriterLock":
    self.acquire()
    return self

  def __exit__(self, *exc) -> None:
    self.release()


def resolved(p: str) -> str:
  """A path as the file system finds it (symlinks followed); a URL normalised."""
  return storage.absolute(p) if storage.is_remote(p) else os.path.realpath(p)


def check_apart(output_flag: str, output: str, source_flag: str, source: str, what: str,
                new: str = "directory") -> None:
  """Refuses an output that is, holds or lies in a path the tool reads: writing would replace or mix with its input
  (and a glob over a folder holding both reads the outputs back). `what` is written, to a `new` path."""
  target, read = resolved(output), resolved(source)
  if target == read:
    raise InputError(f"{output_flag}={output} is {source_flag}; write {what} to a new {new}.")
  for inner, outer, where in ((target, read, "is inside"), (read, target, "holds")):
    if inner.startswith(outer.rstrip("/") + "/"):
      raise InputError(f"{output_flag}={output} {where} {source_flag}={source}; write {what} to a {new} apart from it.")
