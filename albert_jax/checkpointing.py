"""Training checkpoints behind one small module (after MaxText `common/checkpointing.py`, slimmed down).

One orbax CheckpointManager with two items per step: `state` (params, optimizer state, step) and `data` (each
process's loader state as JSON, through grain's orbax handler). Orbax writes every step into a temporary directory
and renames it once complete, so a kill -9 at any moment — mid-save included — leaves the last complete checkpoint
intact; unfinished temporary directories are ignored on restore. On `gs://`, which has no rename, orbax marks a
complete step with a `commit_success.txt` object written last instead (the kill -9 test covers both). Saves are
asynchronous; preemption (SIGTERM; on several processes JAX's preemption sync, which agrees on the step) forces a
save at the next step boundary. The loader states are read back whatever process count wrote them
(`process_<i>-of-<n>.json`): the loop decides whether they fit this run.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import traceback
import time
from typing import Any, Callable

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers as policies

from albert_jax import storage
from albert_jax.data_states import DataStates, read_data_states
from albert_jax.errors import EnvironmentUserError, MissingFileError, UserError


class SaveError(UserError, RuntimeError):
  """A checkpoint could not be written; the message names the last good one."""


class UnreadableCheckpoints(EnvironmentUserError):
  """No step of a checkpoint directory reads back; the message names each one's failure."""


class UnreadableElsewhere(EnvironmentUserError):
  """Another process could not read a step that this one read (its own log says why)."""


class _DataState:
  """What grain's CheckpointHandler saves: get_state() -> bytes (`read_data_states` reads them back)."""

  def __init__(self, state: Any):
    self.state = state

  def get_state(self) -> bytes:
    return json.dumps(self.state).encode()


class _OrbaxErrors(logging.Filter):
  """Orbax logs a failed background save (a full disk, lost permissions) from its threads as ERROR records with
  tracebacks, pages of them, before the loop learns of the failure; the SaveError line then says the same in one
  line. So orbax's ERROR records are held back: dropped once a save has failed, let through (late) as soon as no
  save is in flight and none has failed (then they did not stop anything)."""

  def __init__(self):
    super().__init__()
    self.held: list[logging.LogRecord] = []
    self.dropping = False
    self.lock = threading.Lock()

  def filter(self, record: logging.LogRecord) -> bool:
    if (record.levelno < logging.ERROR or not _from_orbax(record)
        or getattr(record, "albert_jax_released", False)):
      return True
    with self.lock:
      if not self.dropping:
        self.held.append(record)
    return False

  def drop(self) -> None:
    with self.lock:
      self.dropping, self.held = True, []

  def release(self) -> None:
    with self.lock:
      held, self.held = self.held, []
    for record in held:
      record.albert_jax_released = True
      logging.getLogger(record.name).handle(record)


def _from_orbax(record: logging.LogRecord) -> bool:
  """Logged by orbax, or by asyncio, whose only user in a run is orbax's checkpoint I/O: the writes of an abandoned
  save are reported ("Future exception was never retrieved", often with no traceback) when they are collected, as
  late as exit."""
  return f"{os.sep}orbax{os.sep}" in record.pathname or record.name == "asyncio"


ORBAX_ERRORS = _OrbaxErrors()  # installed on the loggers of absl (which orbax logs through) and asyncio


def _said_in_one_line(unraisable) -> bool:
  """Unraisable reports of a failed save or restore, whose failure SaveError, or the restore's "cannot be read"
  line, already states:
  - after a failed save, orbax closes its event loop, and each of the save's writes still pending then completes in
    tensorstore, whose callback finds the loop closed: `RuntimeError: Event loop is closed`, dozens of them;
  - after one array of a restore fails to read, orbax drops the reads of the others, and every one of them that
    fails too is reported as it is dropped: thousands of lines of tensorstore specs."""
  if unraisable.exc_type is RuntimeError and str(unraisable.exc_value) == "Event loop is closed":
    frames = [frame.f_code for frame, _ in traceback.walk_tb(unraisable.exc_traceback)][-2:]
    return ([f.co_name for f in frames] == ["call_soon_threadsafe", "_check_closed"]
            and all(f.co_filename == asyncio.base_events.__file__ for f in frames))
  code = getattr(unraisable.object, "cr_code", None)
  return (code is not None and code.co_name.startswith("_read")
          and code.co_filename.endswith(_ORBAX_SERIALIZATION))


_ORBAX_SERIALIZATION = os.path.join("orbax", "checkpoint", "_src", "serialization", "serialization.py")


def without_reports_said_in_one_line(hook: Callable) -> Callable:
  """`hook` (sys.unraisablehook) minus `_said_in_one_line`'s reports; the same errors from anywhere else are
  still reported."""
  def unraisablehook(unraisable):
    if not _said_in_one_line(unraisable):
      hook(unraisable)
  return unraisablehook



class _Failed:
  """A restore's error, returned rather than raised by `_state_handler`."""

  def __init__(self, error: Exception):
    self.error = error


def _state_handler() -> ocp.StandardCheckpointHandler:
  """orbax's handler, except that a failed restore returns its error instead of raising it. After the handler,
  orbax's manager waits for every process at a barrier, which a process that raised skips: its next attempt (an
  older step) then met the others' barrier, so processes went on from different steps, or the job hung. Returned,
  the error reaches `Checkpointer`, which raises it on every process once they have compared. (The instance's
  method is replaced, not the class, so the checkpoints name orbax's own handler and read without albert_jax.)"""
  handler = ocp.StandardCheckpointHandler()
  restore = handler.restore

  def restore_returning_errors(*args, **kwargs):
    try:
      return restore(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - orbax and tensorstore each raise their own kinds
      return _Failed(e)

  handler.restore = restore_returning_errors
  return handler


def _on_every_process(error: Exception | None) -> None:
  """Raises `error`, or UnreadableElsewhere where another process met one, so that every process drops the same
  step (a collective of all processes: each must call it, the same number of times)."""
  failed = [error is not None]
  if jax.process_count() > 1:
    failed = [bool(f) for f in multihost_utils.process_allgather(np.array(error is not None))]
  if error is not None:
    raise error
  if any(failed):
    processes = [i for i, f in enumerate(failed) if f]
    several = len(processes) > 1
    raise UnreadableElsewhere(f"process{'es' if several else ''} {', '.join(map(str, processes))} of {len(failed)} "
                              f"cannot read it ({'their logs say' if several else 'its log says'} why)")


class _Manager(ocp.CheckpointManager):
  """orbax's manager minus its own calls into JAX's preemption sync (from `save`, and on process 0 from the
  background thread that finalizes a save, with that save's step): JAX's protocol reads the last count passed in
  as the caller's position, so a stale one from that thread could set a sync point a process has already passed.
  Only `Checkpointer.reached_preemption`, once a step, calls it; orbax sees its answer here."""

  preemption_step: int | None = None

  def reached_preemption(self, step: int) -> bool:
    return step == self.preemption_step


_SYNC_CALLS = [0]  # calls of JAX's preemption sync by this process: the count all processes advance alike


class Checkpointer:
  def __init__(self, directory: str, every: int, keep: int, async_save: bool = True):
    self.directory = storage.absolute(directory)
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=policies.AnySavePolicy([policies.FixedIntervalPolicy(every),
                                                     policies.PreemptionCheckpointingPolicy()]),
        preservation_policy=policies.LatestN(keep),
        enable_async_checkpointing=async_save,
        create=True)
    self.manager = _Manager(
        self.directory, item_names=("state", "data"),
        item_handlers={"state": _state_handler(), "data": grain.checkpoint.CheckpointHandler()},
        options=options)
    self.failed = False

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state: Any, data_state: Any, force: bool = False) -> bool:
    return self._saving(lambda: self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(_DataState(data_state))),
        force=force))

  def check(self) -> None:
    """Raises SaveError as soon as a background save has failed (the loop calls it every step)."""
    self._saving(self.manager.check_for_errors)
    if ORBAX_ERRORS.held and not self.manager.is_saving_in_progress():
      ORBAX_ERRORS.release()

  def _saving(self, action: Callable[[], Any]) -> Any:
    try:
      return action()
    except Exception as e:  # noqa: BLE001 - a full disk, permissions or storage: orbax re-raises what it met
      self.failed = True
      ORBAX_ERRORS.drop()  # their tracebacks say at length what the line below says
      reason = str(e).strip().splitlines()[0][:1000] if str(e).strip() else type(e).__name__
      last_good = self.last_good()
      rerun = "it" if self.latest_step() is not None else "its first step"
      raise SaveError(f"Saving a checkpoint failed ({type(e).__name__}: {reason}). The last good checkpoint is "
                      f"{last_good}; free space (or fix the storage) and rerun: the run resumes from {rerun}."
                      ) from None

  def last_good(self) -> str:
    """The newest complete checkpoint, in words (for messages after a failure)."""
    self.manager.reload()
    latest = self.latest_step()
    return f"step {latest} in {self.directory}" if latest is not None else "none (no checkpoint was completed)"

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, DataStates]:
    """Restores into `abstract_state`'s shapes and shardings (any mesh, any process count); returns (state, the
    writer's data states). The loader states are read here, not by grain's handler, which looks for this process
    count's file only and so called an intact checkpoint of another process count unreadable. Raises on every
    process if any process fails to read its part."""
    try:
      data, error = read_data_states(os.path.join(self.directory, str(step), "data")), None
    except Exception as e:  # noqa: BLE001 - a missing or garbled file: damage
      error = e
    _on_every_process(error)
    return self._restore_state(step, abstract_state), data

  def _restore_state(self, step: int, target: Any) -> Any:
    restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]
    _on_every_process(restored.error if isinstance(restored, _Failed) else None)
    return restored

  def restore_newest_intact(self, restore: Callable[[int], Any], move_aside: bool = False
                            ) -> tuple[int, Any] | None:
    """`restore(step)` of the newest step that reads back whole, saying which newer ones were skipped and why
    (a truncated or deleted file, garbled loader state). With `move_aside` (a run that goes on training) the
    skipped steps are renamed `<step>.unreadable`, kept for inspection, so the run can save those steps again.
    None when there is no checkpoint; an error naming every failure when none of them reads, so a workdir full of
    broken checkpoints never restarts from scratch."""
    failures = []
    for step in sorted(self.all_steps(), reverse=True):
      try:
        restored = restore(step)
      except Exception as e:  # noqa: BLE001 - orbax, tensorstore and grain each raise their own kinds
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        failures.append((step, reason))
        print(f"Checkpoint step {step} in {self.directory} cannot be read ({reason}); skipping it.", flush=True)
        continue
      if move_aside and failures:
        self._move_aside([bad for bad, _ in failures])
      return step, restored
    if failures:
      listed = "; ".join(f"step {step}: {reason}" for step, reason in failures)
      raise UnreadableCheckpoints(f"No checkpoint in {self.directory} can be read ({listed}). Move the directory "
                                  "aside to start afresh, or restore it from a copy.")
    return None

  def _move_aside(self, steps: list[int]) -> None:
    if jax.process_index() == 0:
      for step in steps:
        source = storage.path(os.path.join(self.directory, str(step)))
        target = storage.path(os.path.join(self.directory, f"{step}.unreadable.{int(time.time())}"))
        source.rename(target)
        print(f"Moved the unreadable step {step} aside to {target}.", flush=True)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("albert_jax_checkpoints_moved_aside")
    self.manager.reload()

  def restore_params(self, step: int | None = None) -> Any:
    """Only the parameters of a step (latest by default), on this host's first device, whatever the topology
    that wrote them: for warm starts and evaluation."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise MissingFileError(f"No complete checkpoint in {self.directory}.")
    return self._restore_state(step, local_restore_target(self.manager.item_metadata(step)["state"]))["params"]

  def reached_preemption(self, step: int) -> bool:
    """Whether every process stops at `step` (the loop asks once per step, on every process): JAX's preemption
    sync, started by a SIGTERM on any process, agrees on the step after the furthest one any process had reached.
    It is handed this process's count of calls, not the step, so a notice that arrives before the first step (during
    a restore or compilation) still stops the run at its first step; False in a single-process run."""
    _SYNC_CALLS[0] += 1
    try:
      reached = multihost_utils.reached_preemption_sync_point(_SYNC_CALLS[0])
    except RuntimeError:  # the preemption service is off (jax_enable_preemption_service)
      reached = False
    if reached:
      self.manager.preemption_step = step
    return reached

  def wait(self) -> None:
    self._saving(self.manager.wait_until_finished)
    ORBAX_ERRORS.release()

  def close(self) -> None:
    """Closes the manager; after a failed save its background machinery may be broken, so closing then cannot
    replace the SaveError that names the last good checkpoint."""
    try:
      self.manager.close()
    except Exception:  # noqa: BLE001
      if not self.failed:
        raise
    finally:
      ORBAX_ERRORS.release()


def local_restore_target(metadata: Any) -> Any:
  """Shapes and dtypes from a checkpoint's metadata, placed on this host's first device: restores a checkpoint
  written on any mesh or host count (orbax otherwise insists on the writer's topology)."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)

