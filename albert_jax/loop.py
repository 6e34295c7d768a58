"""The training loop, thin (after big_vision `train.py` and flax lm1b `train.py`): resume or initialise, feed
batches to the one jitted step of `engine.setup`, log, evaluate, checkpoint, handle preemption and stop on a
non-finite step. Pretraining and fine-tuning both run through `fit`."""
from __future__ import annotations

import errno
import signal

import jax
import ml_collections

from albert_jax import checkpointing, data_states, engine, host_memory, metrics as metrics_lib, storage
from albert_jax.run import Run, config as run_config, provenance
from albert_jax.run.lock import WorkdirLock
from albert_jax.stop_signals import StopSignals


def _initial_state(s: engine.Setup, ckpt: checkpointing.Checkpointer, config, train_iter, init_rng
                   ) -> engine.TrainState:
  """The workdir's latest checkpoint in `ckpt` (with the loader's position), else a fresh or warm-started state."""
  if ckpt.latest_step() is not None:
    print(f"Restoring the newest checkpoint in {ckpt.directory}...", flush=True)
    latest, (state, data) = ckpt.restore_newest_intact(lambda step: ckpt.restore(step, s.abstract_state),
                                                         move_aside=True)
    data_states.resume_position(train_iter, data, f"Step {latest} in {ckpt.directory}",
                                config.get("resume_with_changes", False))
    print(f"Resumed from step {latest} in {ckpt.directory}", flush=True)
    return state
  state = s.create_state(init_rng)
  if s.job.warm_start is not None:
    params, fresh = s.job.warm_start(jax.device_get(state.params))
    state = state.replace(params=jax.device_put(params, s.state_shardings.params))
    print(f"Warm start from {config.init_checkpoint}; freshly initialised: {fresh or 'none'}", flush=True)
  return state


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
    window, last, stop = metrics_lib.StepWindow(ckpt), {}, False
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
          window.say_first_step(job, done, config.train.num_train_steps, config.log.every)
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


def _close_quietly(ckpt: checkpointing.Checkpointer, writer, signals: StopSignals) -> None:
  """Ends the run's resources after a failure, never hiding it behind an error of the clean-up."""
  for close in (ckpt.wait, ckpt.close, writer.close, signals.restore):
    try:
      close()
    except Exception:  # noqa: BLE001 - the failure being raised is the one to report
      pass
