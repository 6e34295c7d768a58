"""Preemption notices and Ctrl-C during training: a stop at a step boundary, agreed by every process, with a
checkpoint saved first; a second Ctrl-C stops at once."""
from __future__ import annotations

import os
import signal

import jax

from albert_jax import checkpointing

_held: list[int] | None = None  # the signals a whole process received (`hold_for_the_process`); None: not held


def hold_for_the_process() -> None:
  """For a command that runs several trainings one after another (albert_jax.seeds): from now on SIGTERM and a
  first Ctrl-C never end the process between or around training loops; they are recorded (`held_signal`), a loop
  that starts after one stops at its first step boundary (saving), and the command starts no further run. A
  second Ctrl-C stops at once."""
  global _held
  _held = []
  for signum in (signal.SIGINT, signal.SIGTERM):  # SIGTERM last: once it is held, both are
    signal.signal(signum, _hold)


def held_signal() -> int | None:
  """The first SIGTERM or SIGINT received since `hold_for_the_process`, None if none (or not held)."""
  return _held[0] if _held else None


def exit_code(signum: int | None) -> int:
  """0 after a preemption notice (the job ended cleanly and resumes), 130 after Ctrl-C (the shell's code)."""
  return 128 + signal.SIGINT if signum == signal.SIGINT else 0


def _hold(signum, frame) -> None:
  del frame
  _record(signum)
  if signum == signal.SIGINT:
    print("\nCtrl-C: the running training saves a checkpoint at the end of its step and no further run starts "
          "(Ctrl-C again stops now, without saving).", flush=True)


def _record(signum: int) -> None:
  """Keeps `signum` for the whole process when it is held; after a first Ctrl-C a second one raises
  KeyboardInterrupt."""
  if _held is not None:
    _held.append(signum)
  if signum == signal.SIGINT:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class StopSignals:
  """SIGTERM (a TPU VM preemption notice) and a first Ctrl-C (SIGINT) set a flag: the loop saves at the next step
  boundary and exits. A second Ctrl-C stops at once, without saving.

  With several processes a flag of one process cannot decide the stop: the others would go on into the next
  step's collectives while it saves, and the job hangs; notices reach a pod's hosts at different steps. So SIGTERM
  is left to JAX's preemption notifier (jax.distributed.initialize installs it; a Python handler would replace
  it), whose sync agrees on one step for all processes (`Checkpointer.reached_preemption`), and a first Ctrl-C is
  passed on to it as a SIGTERM of this process. A second Ctrl-C ends this process at once (exit 130); the others
  fail when they miss it (at once if it was process 0, which holds the coordinator, else after JAX's heartbeat
  timeout), as after a kill. With jax_enable_preemption_service off both signals keep their defaults."""

  def __init__(self):
    self.received: int | None = held_signal()  # one that arrived before this loop: stop at its first step
    self.agreed = jax.process_count() > 1
    if not self.agreed:
      signums = (signal.SIGTERM,) if self.received == signal.SIGINT else (signal.SIGTERM, signal.SIGINT)
    elif jax.config.jax_enable_preemption_service:
      signums = (signal.SIGINT,)
    else:  # no agreement to be had: SIGTERM and Ctrl-C keep their defaults and end this process, saving nothing
      signums = ()
    self._previous = {signum: signal.signal(signum, self._handle) for signum in signums}

  def _handle(self, signum, frame):
    del frame
    self.received = signum
    if not self.agreed:
      _record(signum)  # and for the process, when it holds its signals
      if signum == signal.SIGINT:
        print("\nCtrl-C: saving a checkpoint at the end of this step (Ctrl-C again stops now, without saving).",
              flush=True)
      return
    if signum == signal.SIGINT:
      signal.signal(signal.SIGINT, _exit_now)
      print("\nCtrl-C: every process saves a checkpoint at a step they agree on, then exits (Ctrl-C again stops "
            "this process now, without saving).", flush=True)
      signal.raise_signal(signal.SIGTERM)  # to JAX's notifier, which starts the preemption sync of all processes

  def stop(self, ckpt: checkpointing.Checkpointer, done: int) -> bool:
    """Whether to save at `done` and exit; with several processes, the same answer on every one."""
    if self.agreed:
      return ckpt.reached_preemption(done)
    return self.received is not None or ckpt.reached_preemption(done)

  def exit_code(self) -> int:
    return exit_code(self.received)

  def restore(self):
    """The handlers from before the loop; a Ctrl-C received meanwhile leaves the next one stopping at once."""
    for signum, handler in self._previous.items():
      stopping_now = signum == signal.SIGINT and signal.SIGINT in (_held or ())
      signal.signal(signum, signal.default_int_handler if stopping_now else handler)


def _exit_now(signum, frame) -> None:
  """A second Ctrl-C of a multi-process run: ends this process at once. A KeyboardInterrupt would leave it waiting
  minutes in JAX's shutdown barrier for processes that wait for it in a collective."""
  del signum, frame
  print("\nCtrl-C again: stopping this process now, without saving.", flush=True)
  os._exit(128 + signal.SIGINT)
