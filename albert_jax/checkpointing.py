"""Training checkpoints behind one small module (after MaxText `common/checkpointing.py`, slimmed down).

One orbax CheckpointManager with two items per step: `state` (params, optimizer state, step) and `data` (each
process's loader state as JSON, through grain's orbax handler). Orbax writes every step into a temporary directory
and renames it once complete, so a kill -9 at any moment — mid-save included — leaves the last complete checkpoint
intact; unfinished temporary directories are ignored on restore. On `gs://`, which has no rename, orbax marks a
complete step with a `commit_success.txt` object written last instead (the kill -9 test covers both). Saves are
asynchronous; preemption (SIGTERM, or orbax's multi-host preemption notice) forces a save at the next step
boundary.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import traceback
import time
from typing import Any, Callable

import grain
import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers as policies

from albert_jax import storage


class SaveError(RuntimeError):
  """A checkpoint could not be written; the message names the last good one."""


class _DataState:
  """What grain's CheckpointHandler needs: get_state() -> bytes at save, set_state(bytes) at restore."""

  def __init__(self, state: Any = None):
    self.state = state

  def get_state(self) -> bytes:
    return json.dumps(self.state).encode()

  def set_state(self, state: bytes) -> None:
    self.state = json.loads(state)

  def start_prefetch(self) -> None:
    pass


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
    if (record.levelno < logging.ERROR or f"{os.sep}orbax{os.sep}" not in record.pathname
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


_ORBAX_ERRORS = _OrbaxErrors()
logging.getLogger("absl").addFilter(_ORBAX_ERRORS)  # absl.logging, which orbax logs through


def _without_closed_loop_reports(hook: Callable) -> Callable:
  """`hook` (sys.unraisablehook) minus one report: after a failed save orbax closes its event loop, and each of
  the save's writes still pending then completes in tensorstore, whose callback finds the loop closed and reports
  `RuntimeError: Event loop is closed` as unraisable: dozens of tracebacks that say nothing SaveError's line does
  not. The same error raised anywhere else is still reported."""
  def unraisablehook(unraisable):
    frames = [frame.f_code for frame, _ in traceback.walk_tb(unraisable.exc_traceback)][-2:]
    if (unraisable.exc_type is RuntimeError and str(unraisable.exc_value) == "Event loop is closed"
        and [f.co_name for f in frames] == ["call_soon_threadsafe", "_check_closed"]
        and all(f.co_filename == asyncio.base_events.__file__ for f in frames)):
      return
    hook(unraisable)
  unraisablehook.albert_jax_filtered = True
  return unraisablehook


if not getattr(sys.unraisablehook, "albert_jax_filtered", False):
  sys.unraisablehook = _without_closed_loop_reports(sys.unraisablehook)


class Checkpointer:
  def __init__(self, directory: str, every: int, keep: int, async_save: bool = True):
    self.directory = storage.absolute(directory)
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=policies.AnySavePolicy([policies.FixedIntervalPolicy(every),
                                                     policies.PreemptionCheckpointingPolicy()]),
        preservation_policy=policies.LatestN(keep),
        enable_async_checkpointing=async_save,
        create=True)
    self.manager = ocp.CheckpointManager(
        self.directory, item_names=("state", "data"),
        item_handlers={"state": ocp.StandardCheckpointHandler(), "data": grain.checkpoint.CheckpointHandler()},
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
    if _ORBAX_ERRORS.held and not self.manager.is_saving_in_progress():
      _ORBAX_ERRORS.release()

  def _saving(self, action: Callable[[], Any]) -> Any:
    try:
      return action()
    except Exception as e:  # noqa: BLE001 - a full disk, permissions or storage: orbax re-raises what it met
      self.failed = True
      _ORBAX_ERRORS.drop()  # their tracebacks say at length what the line below says
      reason = str(e).strip().splitlines()[0][:1000] if str(e).strip() else type(e).__name__
      raise SaveError(f"Saving a checkpoint failed ({type(e).__name__}: {reason}). The last good checkpoint is "
                      f"{self.last_good()}; free space (or fix the storage) and rerun: the run resumes from it."
                      ) from None

  def last_good(self) -> str:
    """The newest complete checkpoint, in words (for messages after a failure)."""
    self.manager.reload()
    latest = self.latest_step()
    return f"step {latest} in {self.directory}" if latest is not None else "none (no checkpoint was completed)"

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, Any]:
    """Restores into `abstract_state`'s shapes and shardings; returns (state, this process's data state)."""
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(_DataState())))
    return restored["state"], restored["data"].state

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
      raise RuntimeError(f"No checkpoint in {self.directory} can be read ({listed}). Move the directory aside to "
                         "start afresh, or restore it from a copy.")
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
      raise FileNotFoundError(f"No complete checkpoint in {self.directory}.")
    target = local_restore_target(self.manager.item_metadata(step)["state"])
    restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
    return restored["state"]["params"]

  def reached_preemption(self, step: int) -> bool:
    return self.manager.reached_preemption(step)

  def wait(self) -> None:
    self._saving(self.manager.wait_until_finished)
    _ORBAX_ERRORS.release()

  def close(self) -> None:
    """Closes the manager; after a failed save its background machinery may be broken, so closing then cannot
    replace the SaveError that names the last good checkpoint."""
    try:
      self.manager.close()
    except Exception:  # noqa: BLE001
      if not self.failed:
        raise
    finally:
      _ORBAX_ERRORS.release()


def local_restore_target(metadata: Any) -> Any:
  """Shapes and dtypes from a checkpoint's metadata, placed on this host's first device: restores a checkpoint
  written on any mesh or host count (orbax otherwise insists on the writer's topology)."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(workdir, "checkpoints")

