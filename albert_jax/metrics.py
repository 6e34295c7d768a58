"""Metric output: the trackers of `albert_jax/trackers.py` (`metrics.jsonl`, TensorBoard, W&B) and a console
progress line.

Only process 0 writes (big_vision / flax lm1b). For a `gs://` workdir the files are written to a local
`storage.Mirror` and uploaded whole at every log step: objects cannot be appended to, and one put per file keeps
every visible version complete. Throughput and MFU come from the step time measured on the host between fetched
steps, with FLOPs from `flops.train_flops_per_token` (the `--mode=describe` formula). The loop's metrics between
two log lines are a `StepWindow`: each step's fetched one step late, so the host never waits on the device.
"""
from __future__ import annotations

import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from albert_jax import checkpointing, engine, flops, storage, trackers
from albert_jax.errors import NotFiniteError
from albert_jax.run.layout import METRICS_FILE, Run


class MetricWriter:
  """Fans each log step out to the run's trackers; the resolved config goes to them once per start."""

  def __init__(self, run: Run, total_steps: int, config: ml_collections.ConfigDict):
    self.enabled = jax.process_index() == 0
    self.total_steps = total_steps
    self.start_time = time.time()
    if self.enabled:
      self._files = storage.Mirror(run.workdir, resume=(METRICS_FILE,))
      self._trackers = trackers.open_trackers(run.written_in(self._files.local), run, config.log)
      for tracker in self._trackers:
        tracker.hparams(config)
      self._files.sync()

  def write(self, step: int, metrics: dict[str, float], prefix: str = "") -> None:
    if not self.enabled:
      return
    record = {f"{prefix}{k}": float(v) for k, v in metrics.items()}
    for tracker in self._trackers:
      tracker.write(int(step), record)
    self._files.sync()

  def progress(self, step: int, metrics: dict[str, float], first_step: int) -> None:
    """One console line: step, losses, accuracy, throughput, ETA."""
    if not self.enabled:
      return
    elapsed = time.time() - self.start_time
    done = max(step - first_step, 1)
    eta = elapsed / done * (self.total_steps - step)
    keys = ("loss", "mlm_loss", "mlm_accuracy", "sop_accuracy", "nsp_accuracy", "accuracy", "learning_rate")
    shown = " | ".join(f"{k} {metrics[k]:.4g}" for k in keys if k in metrics)
    rate = f"{metrics['tokens_per_sec']:,.0f} tok/s" if "tokens_per_sec" in metrics else ""
    mfu = f" | mfu {metrics['mfu']:.1%}" if "mfu" in metrics else ""
    print(f"step {step}/{self.total_steps} | {shown} | {rate}{mfu} | eta {_hms(eta)}", file=sys.stderr, flush=True)

  def close(self) -> None:
    if self.enabled:
      for tracker in self._trackers:
        tracker.close()
      self._files.close()


def _hms(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def throughput(steps: int, seconds: float, examples_per_step: int, tokens_per_step: float, flops_per_token: float,
               num_devices: int, peak_per_device: float | None) -> dict[str, Any]:
  seconds = max(seconds, 1e-9)
  out = {"step_time": seconds / steps, "examples_per_sec": steps * examples_per_step / seconds,
         "tokens_per_sec": steps * tokens_per_step / seconds}
  if peak_per_device:
    out["mfu"] = out["tokens_per_sec"] * flops_per_token / (peak_per_device * num_devices)
  return out


def fetch(device_metrics: Any) -> Any:
  """Device metrics (any tree) -> the same tree of Python floats."""
  return jax.tree.map(float, jax.device_get(device_metrics))


def add(total: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
  """Adds a tree of floats into a running total of the same structure (empty at first)."""
  return jax.tree.map(lambda a, b: a + b, total, new) if total else new


class StepWindow:
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
           **throughput(steps, time.time() - self.start, s.split.global_batch, self.tokens / steps,
                        job.flops_per_token, jax.device_count(), _peak_flops() if job.flops_per_token else None)}
    self.total, self.steps, self.tokens, self.start = {}, 0, 0, time.time()
    return out

  def say_first_step(self, job: engine.Job, step: int, total_steps: int, log_every: int) -> None:
    """The first step's metrics as soon as it is done (it compiles first): minutes of silence until the first
    progress line would look like a hang. They stay in the window's totals for that line."""
    self.drain()  # waits for the step
    if jax.process_index() == 0:
      shown = ", ".join(f"{k} {v:.4g}" for k, v in job.summarize(self.total["sums"], self.steps).items())
      print(f"step {step}/{total_steps} done in {time.time() - self.start:.1f} s (compiling included): {shown}; "
            f"progress every {log_every} steps", file=sys.stderr, flush=True)


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
