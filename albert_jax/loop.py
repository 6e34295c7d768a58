"""The training loop, thin (after big_vision `train.py` and flax lm1b `train.py`): resume or initialise, feed
batches to the one jitted step of `engine.setup`, log, evaluate, checkpoint, handle preemption and stop on a
non-finite step. Pretraining and fine-tuning both run through `fit`."""
from __future__ import annotations

import errno
import itertools
import json
import os
import signal
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from albert_jax import checkpointing, engine, flops, metrics as metrics_lib, provenance, storage
from albert_jax.errors import InputError, NotFiniteError
from albert_jax.run import Run
from albert_jax.workdir_lock import WorkdirLock

# Fields that fix the shapes of the parameters: a workdir's saved run must agree on them to resume.
SHAPE_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "num_hidden_groups", "inner_group_num", "max_position_embeddings",
                "type_vocab_size", "sharing", "embedding_projection")


# Settings whose change breaks an exact resume (data order, dropout, the function the weights compute, what a step
# means): refused unless `resume_with_changes` is set. Every other change (schedule length, logging, checkpoints,
# mesh, micro batch) is legitimate: said on the console and recorded.
EXACT_RESUME_FIELDS = ("seed", "train.global_batch_size", "train.optimizer", "data.", "model.hidden_act",
                       "model.layer_norm_eps", "model.hidden_dropout_prob", "model.attention_probs_dropout_prob")


def _flat(tree: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def check_workdir_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Before a run writes into `workdir`: refuses a different model shape, and settings changed in ways that break
  an exact resume; says and records legitimate changes (the previous resolved config is kept as
  `config.<step>.json`, or `config.<step>.<n>.json` after earlier resumes at that step). Every process must decide
  alike (opening the checkpoints is a barrier), so the new config.json is written later, by
  `write_workdir_config`, once all of them are past this check."""
  path = storage.path(Run(workdir).config)
  latest = latest_step(workdir) if path.exists() else None
  if latest is not None:
    text = path.read_text()
    saved = json.loads(text)
    model = saved.get("model", {})   # without the fields of a later albert_jax, whose defaults keep the shapes
    diffs = {k: (model[k], config.model.get(k)) for k in SHAPE_FIELDS if k in model and model[k] != config.model.get(k)}
    if diffs:
      listed = ", ".join(f"model.{k}: saved {a!r} vs now {b!r}" for k, (a, b) in diffs.items())
      raise InputError(f"Workdir {workdir} holds checkpoints of a different model ({listed}). Use a new --workdir, "
                       "or the saved config (config.json there) to resume.")
    before, now = _flat(saved), _flat(json.loads(config.to_json_best_effort()))
    changed = {k: (before.get(k), now.get(k)) for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)}
    if changed:
      listed = ", ".join(f"{k}: {a!r} -> {b!r}" if k in before else f"{k}: {b!r} (new field)" for k, (a, b) in
                         changed.items())   # a field of a later albert_jax: no saved value to restore, not refused
      breaking = [k for k in changed if k.startswith(EXACT_RESUME_FIELDS) and k in before and k in now]
      if breaking and not config.get("resume_with_changes", False):
        raise InputError(f"Resuming {workdir} at step {latest} with changed {', '.join(breaking)} would not continue "
                         f"the same run (data order, dropout or step size change). Restore the saved values "
                         f"(config.json there), use a new --workdir, or pass --config.resume_with_changes=True.")
      if jax.process_index() == 0:
        print(f"Resuming at step {latest} with changed settings: {listed} (the previous config is kept as "
              f"{_keep_config(workdir, latest, text)}).", flush=True)


def _keep_config(workdir: str, step: int, text: str) -> str:
  """The name of the file that keeps `text`, the config.json a resume with changes replaces: the first free one of
  `config.<step>.json`, `config.<step>.1.json`, ..., since writing over an earlier one would lose its settings
  (unless one of them holds `text` already)."""
  for n in itertools.count():
    kept = storage.path(Run(workdir).config_history(step, n))
    if not kept.exists():
      storage.write_atomic(os.fspath(kept), text)
      return kept.name
    if kept.read_text() == text:
      return kept.name


def latest_step(workdir: str) -> int | None:
  """The step of the workdir's newest checkpoint, None without one (opening the checkpoints is a barrier of all
  processes; a workdir without checkpoints/ is left without it)."""
  directory = checkpointing.checkpoint_dir(workdir)
  return checkpointing.Checkpointer(directory, 1, 1).latest_step() if storage.path(directory).is_dir() else None


def write_workdir_config(workdir: str, config: ml_collections.ConfigDict, made_of: dict | None = None) -> None:
  if jax.process_index() == 0:
    storage.write_atomic(Run(workdir).config, config.to_json_best_effort(indent=2))
    provenance.record(workdir, made_of or {})  # what it is made from (`provenance`), with the config


class _StopSignals:
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
    self.received: int | None = None
    self.agreed = jax.process_count() > 1
    if not self.agreed:
      signums = (signal.SIGTERM, signal.SIGINT)
    elif jax.config.jax_enable_preemption_service:
      signums = (signal.SIGINT,)
    else:  # no agreement to be had: SIGTERM and Ctrl-C keep their defaults and end this process, saving nothing
      signums = ()
    self._previous = {signum: signal.signal(signum, self._handle) for signum in signums}

  def _handle(self, signum, frame):
    del frame
    self.received = signum
    if signum == signal.SIGINT:
      if not self.agreed:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\nCtrl-C: saving a checkpoint at the end of this step (Ctrl-C again stops now, without saving).",
              flush=True)
        return
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
    """0 after a preemption notice (the job ended cleanly and resumes), 130 after Ctrl-C (the shell's code)."""
    return 128 + signal.SIGINT if self.received == signal.SIGINT else 0

  def restore(self):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)


def _exit_now(signum, frame) -> None:
  """A second Ctrl-C of a multi-process run: ends this process at once. A KeyboardInterrupt would leave it waiting
  minutes in JAX's shutdown barrier for processes that wait for it in a collective."""
  del signum, frame
  print("\nCtrl-C again: stopping this process now, without saving.", flush=True)
  os._exit(128 + signal.SIGINT)


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


def _initial_state(s: engine.Setup, config, train_iter, init_rng) -> engine.TrainState:
  """The workdir's latest checkpoint (with the loader's position), else a fresh or warm-started state."""
  ckpt = s.checkpointer
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


def fit(config: ml_collections.ConfigDict, workdir: str, job: engine.Job) -> dict[str, float]:
  """Trains `job` to `train.num_train_steps` or a `job.evaluate` that returns True (early stopping), resuming from
  the workdir, which it owns meanwhile (process 0 holds its lock). Returns the last logged metrics."""
  engine.check_training_config(config)
  with WorkdirLock(workdir, owner=jax.process_index() == 0):
    return _train(config, workdir, job)


def _train(config: ml_collections.ConfigDict, workdir: str, job: engine.Job) -> dict[str, float]:
  check_workdir_config(workdir, config)
  s = engine.setup(config, job, workdir)  # opening the checkpoints: every process has passed the check
  ckpt = s.checkpointer
  total_steps = config.train.num_train_steps
  with s.context():
    train_iter = job.batches("train", s.split)
    init_rng, rng = jax.random.split(jax.random.key(config.seed))
    rng = jax.device_put(rng, s.replicated)
    state = _initial_state(s, config, train_iter, init_rng)
    first_step = int(state.step)
    if first_step >= total_steps:
      ckpt.close()
      if jax.process_index() == 0:
        print(f"Nothing to train: {workdir} holds step {first_step} and train.num_train_steps={total_steps}; "
              "raise --config.train.num_train_steps to train further.", flush=True)
      return {}
    write_workdir_config(workdir, config, provenance.fingerprint(job.inputs))
    train_step = _StepPerShape(s)
    writer = metrics_lib.MetricWriter(workdir, total_steps, config)
    signals = _StopSignals()
    window, last, stop = _Window(ckpt), {}, False
    try:
      for step in range(first_step, total_steps):
        if step == config.log.profile_start:
          profile = storage.Mirror(Run(workdir).profile)  # the profiler writes local files only
          jax.profiler.start_trace(profile.local)
        batch = next(train_iter)
        state, step_metrics = train_step(state, batch, rng)
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
      raise checkpointing.SaveError(f"Writing into {workdir} failed ({e}). The last good checkpoint is "
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


class _StepPerShape:
  """The train step, compiled ahead of time once for each batch shape the data yields (one per length bucket of
  fine-tuning; one in all for pretraining)."""

  def __init__(self, s: engine.Setup):
    self.s, self.compiled = s, {}

  def __call__(self, state: engine.TrainState, host_batch: dict[str, np.ndarray], rng: jax.Array):
    shape = tuple((name, array.shape[1:]) for name, array in sorted(host_batch.items()))
    if shape not in self.compiled:
      self.compiled[shape] = self.s.compile_train_step(host_batch)
    return self.compiled[shape](state, self.s.global_batch(host_batch), rng)


def _close_quietly(ckpt: checkpointing.Checkpointer, writer, signals: _StopSignals) -> None:
  """Ends the run's resources after a failure, never hiding it behind an error of the clean-up."""
  for close in (ckpt.wait, ckpt.close, writer.close, signals.restore):
    try:
      close()
    except Exception:  # noqa: BLE001 - the failure being raised is the one to report
      pass
