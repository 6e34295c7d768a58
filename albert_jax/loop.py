"""The training loop, thin (after big_vision `train.py` and flax lm1b `train.py`): resume or initialise, feed
batches to the one jitted step of `engine.setup`, log, evaluate, checkpoint, handle preemption and stop on a
non-finite step. Pretraining and fine-tuning both run through `fit`."""
from __future__ import annotations

import errno
import signal
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from albert_jax import checkpointing, engine, flops, host_memory, metrics as metrics_lib, storage
from albert_jax.errors import InputError, NotFiniteError
from albert_jax.run import Run, config as run_config, provenance
from albert_jax.run.lock import WorkdirLock
from albert_jax.stop_signals import StopSignals


def fetch(device_metrics: Any) -> Any:
  """Device metrics (any tree) -> the same tree of Python floats."""
  return jax.tree.map(float, jax.device_get(device_metrics))


def add(total: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
  """Adds a tree of floats into a running total of the same structure (empty at first)."""
  return jax.tree.map(lambda a, b: a + b, total, new) if total else new


class _Window:
  """Step metrics added over the steps since the last log line, fetched one step late (the host never stalls
  the device) and checked for non-finite values before anything is saved."""

  def __init__(self, checkpointer: checkpointing.Checkpointer):
    self.checkpointer = checkpointer
    self.total, self.steps, self.tokens, self.start, self.pending = {}, 0, 0, time.time(), None

  def push(self, step: int, device_metrics: Any, tokens: int) -> None:
    self.drain()
    self.pending = (step, device_metrics)
    self.tokens += tokens

  def drain(self) -> None:
    if self.pending is not None:
      self.total = add(self.total, _checked(*self.pending, self.checkpointer))
      self.steps += 1
      self.pending = None

  def report(self, s: engine.Setup) -> dict[str, float]:
    """The window's reported metrics (the job's summary, the engine's means, throughput); starts a new window."""
    self.drain()
    job, steps = s.job, self.steps
    out = {**job.summarize(self.total["sums"], steps), "grad_norm": self.total["grad_norm"] / steps,
           "learning_rate": self.total["learning_rate"] / steps,
           **metrics_lib.throughput(steps, time.time() - self.start, s.split.global_batch, self.tokens / steps,
                                    job.flops_per_token, jax.device_count(),
                                    _peak_flops() if job.flops_per_token else None)}
    self.total, self.steps, self.tokens, self.start = {}, 0, 0, time.time()
    return out


def _peak_flops() -> float | None:
  return flops.peak_flops(jax.devices()[0].device_kind)


def _checked(step: int, device_metrics: Any, ckpt: checkpointing.Checkpointer) -> dict[str, Any]:
  """Fetches a step's metrics and stops the run on a non-finite loss or gradient norm."""
  values = fetch(device_metrics)
  if not (np.isfinite(values["loss"]) and np.isfinite(values["grad_norm"])):
    ckpt.wait()
    latest = ckpt.latest_step()
    where = f"step {latest} in {ckpt.directory}" if latest is not None else "none (no checkpoint was saved yet)"
    raise NotFiniteError(f"Loss {values['loss']} / grad norm {values['grad_norm']} at step {step} is not finite. "
                         f"The last good checkpoint is {where}; lower train.learning_rate (or use bf16 with "
                         "float32 params) and restart: the run resumes from it.")
  return values


def _initial_state(s: engine.Setup, ckpt: checkpointing.Checkpointer, config, train_iter, init_rng
                   ) -> engine.TrainState:
  """The workdir's latest checkpoint in `ckpt` (with the loader's position), else a fresh or warm-started state."""
  if ckpt.latest_step() is not None:
    print(f"Restoring the newest checkpoint in {ckpt.directory}...", flush=True)
    latest, (state, data) = ckpt.restore_newest_intact(lambda step: ckpt.restore(step, s.abstract_state),
                                                         move_aside=True)
    _resume_data(train_iter, data, f"Step {latest} in {ckpt.directory}", config)
    print(f"Resumed from step {latest} in {ckpt.directory}", flush=True)
    return state
  state = s.create_state(init_rng)
  if s.job.warm_start is not None:
    params, fresh = s.job.warm_start(jax.device_get(state.params))
    state = state.replace(params=jax.device_put(params, s.state_shardings.params))
    print(f"Warm start from {config.init_checkpoint}; freshly initialised: {fresh or 'none'}", flush=True)
  return state


def _resume_data(train_iter, data: checkpointing.DataStates, where: str, config) -> None:
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
  if not config.get("resume_with_changes", False):
    raise InputError(f"{written}: the data loader keeps a position per process, which means nothing on another "
                     f"process count. Resume with {_processes(data.process_count)}, or pass "
                     "--config.resume_with_changes=True to continue the model from there with the data read from "
                     "its start.")
  if jax.process_index() == 0:
    print(f"{written}; the data loader keeps a position per process, so the data is read from its start "
          "(resume_with_changes).", flush=True)


def _processes(count: int) -> str:
  return f"{count} process{'es' if count > 1 else ''}"


def fit(config: ml_collections.ConfigDict, run: Run, job: engine.Job) -> dict[str, float]:
  """Trains `job` to `train.num_train_steps` or a `job.evaluate` that returns True (early stopping), resuming from
  the run's folder, which it owns meanwhile (process 0 holds its lock). Returns the last logged metrics. `config`
  has passed `engine.check_training_config`."""
  with WorkdirLock(run, owner=jax.process_index() == 0):
    return _train(config, run, job)


def _train(config: ml_collections.ConfigDict, run: Run, job: engine.Job) -> dict[str, float]:
  replaced = run_config.check_resume(run, config)
  s = engine.setup(config, job)
  c = config.checkpoint
  # Opened once every process has passed the check above.
  ckpt = checkpointing.Checkpointer(run.checkpoints, c.every, c.keep, c.async_save)
  total_steps = config.train.num_train_steps
  with s.context():
    train_iter = job.batches("train", s.split)
    init_rng, rng = jax.random.split(jax.random.key(config.seed))
    rng = jax.device_put(rng, s.replicated)
    state = _initial_state(s, ckpt, config, train_iter, init_rng)
    first_step = int(state.step)
    if first_step >= total_steps:
      ckpt.close()
      run_config.keep_replaced(replaced)  # as said
      if jax.process_index() == 0:
        print(f"Nothing to train: {run.workdir} holds step {first_step} and train.num_train_steps={total_steps}; "
              "raise --config.train.num_train_steps to train further.", flush=True)
      return {}
    if host_memory.on_host(s.mesh):  # the step's memory is the host's: checked for the longest batch before writing
      s.step_for(job.example_batch(1))
    run_config.write(run, config, provenance.fingerprint(job.inputs), replaced)
    writer = metrics_lib.MetricWriter(run, total_steps, config)
    signals = StopSignals()
    window, last, stop = _Window(ckpt), {}, False
    try:
      for step in range(first_step, total_steps):
        if step == config.log.profile_start:
          profile = storage.Mirror(run.profile)  # the profiler writes local files only
          jax.profiler.start_trace(profile.local)
        batch = next(train_iter)
        state, step_metrics = s.run_train_step(state, batch, rng)
        done = step + 1
        window.push(done, step_metrics, s.split.global_batch * (
            job.tokens_per_row(batch) if job.tokens_per_row else job.tokens_per_example))
        ckpt.check()  # a failed background save stops the run now, not at the next save
        if config.log.profile_start >= 0 and done == config.log.profile_start + config.log.profile_steps:
          jax.profiler.stop_trace()
          profile.close()
        stop = signals.stop(ckpt, done)
        last_step = done == total_steps
        if done % config.log.every == 0 or last_step or stop:
          last = window.report(s)
          writer.write(done, last)
          writer.progress(done, last, first_step)
        elif done == first_step + 1:
          _say_first_step(window, job, done, config)
        if job.evaluate and config.train.eval_every and (done % config.train.eval_every == 0 or last_step):
          last_step = bool(job.evaluate(done, state.params, s, writer)) or last_step  # True: stop here (early)
        if done % config.checkpoint.every == 0 or last_step or stop:
          window.drain()  # never save parameters produced by a non-finite step
          ckpt.save(done, state, train_iter.get_state(), force=True)
        if stop:
          ckpt.wait()
          if ckpt.latest_step() != done:
            raise RuntimeError(f"Stopping: the checkpoint of step {done} is not in {ckpt.directory} after saving; "
                               "the run resumes from the latest complete one there.")
          reason = "Interrupted" if signals.received == signal.SIGINT else "Preemption"
          print(f"{reason}: saved step {done} in {ckpt.directory}; exiting cleanly (rerun the same command to "
                "resume).", flush=True)
          break
        if last_step:
          break
    except OSError as e:  # a full disk under metrics or TensorBoard: one line naming the checkpoint to resume from
      _close_quietly(ckpt, writer, signals)
      if e.errno != errno.ENOSPC:
        raise
      raise checkpointing.SaveError(f"Writing into {run.workdir} failed ({e}). The last good checkpoint is "
                                    f"{ckpt.last_good()}; free space and rerun: the run resumes from it.") from None
    except BaseException:
      _close_quietly(ckpt, writer, signals)
      raise
    try:
      ckpt.wait()
    except BaseException:
      _close_quietly(ckpt, writer, signals)
      raise
    ckpt.close()
    writer.close()
    signals.restore()
  if stop:  # nothing after training (a fine-tuning run's test predictions) runs on a stopped run
    raise SystemExit(signals.exit_code())
  return last


def _say_first_step(window: _Window, job: engine.Job, step: int, config) -> None:
  """The first step's metrics as soon as it is done (it compiles first): minutes of silence until the first
  progress line would look like a hang. They stay in the window's totals for that line."""
  window.drain()  # waits for the step
  if jax.process_index() == 0:
    shown = ", ".join(f"{k} {v:.4g}" for k, v in job.summarize(window.total["sums"], window.steps).items())
    print(f"step {step}/{config.train.num_train_steps} done in {time.time() - window.start:.1f} s (compiling "
          f"included): {shown}; progress every {config.log.every} steps", file=sys.stderr, flush=True)


def _close_quietly(ckpt: checkpointing.Checkpointer, writer, signals: StopSignals) -> None:
  """Ends the run's resources after a failure, never hiding it behind an error of the clean-up."""
  for close in (ckpt.wait, ckpt.close, writer.close, signals.restore):
    try:
      close()
    except Exception:  # noqa: BLE001 - the failure being raised is the one to report
      pass
