"""Metric output: the trackers of `albert_jax/trackers.py` (`metrics.jsonl`, TensorBoard, W&B) and a console
progress line.

Only process 0 writes (big_vision / flax lm1b). For a `gs://` workdir the files are written to a local
`storage.Mirror` and uploaded whole at every log step: objects cannot be appended to, and one put per file keeps
every visible version complete. Throughput and MFU come from the step time measured on the host between fetched
steps, with FLOPs from `flops.train_flops_per_token` (the `--mode=describe` formula).
"""
from __future__ import annotations

import sys
import time
from typing import Any

import jax
import ml_collections

from albert_jax import storage, trackers
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
