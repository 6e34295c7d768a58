"""The best dev checkpoint of a fine-tuning run: `best/step_N/` with its dev predictions, named by `best/best.json`,
decided alike on every process."""
from __future__ import annotations

import json
import os
from typing import Any

import jax
from jax.experimental import multihost_utils
import numpy as np

from albert_jax import storage
from albert_jax.run.best import read_best
from albert_jax.run.layout import Run
from albert_jax.tasks import Split
from albert_jax.weights import store


class BestKeeper:
  """Keeps the best checkpoint by the task metric: `best/step_N/` (weights), then `best/best.json` names it.
  The pointer is written only after the weights are complete, and older steps are deleted after it.

  A run that continues from checkpoint step `resume_step` (0: a fresh start) scores every later step again, so
  a record of a later step is dropped: those weights belong to a run that died before its checkpoint (perhaps
  with another seed or learning rate), and keeping them would report and predict with them. `patience`: the
  evaluations, `eval_every` steps apart, after the best without a better one that stop the run (0: never)."""

  def __init__(self, run: Run, task, model_config, resume_step: int, patience: int = 0, eval_every: int = 0):
    self.run, self.patience, self.eval_every = run, patience, eval_every
    self.directory = run.best
    self.task, self.model_config = task, model_config
    self.record = read_best(run)
    if _on_every_process(self.record is not None and self.record["step"] > resume_step):
      if jax.process_index() == 0:
        print(f"Dropping {self.directory} (step {self.record['step']}): this run continues from step "
              f"{resume_step} and scores the steps after it again.", flush=True)
        storage.path(self.run.best_record).unlink(missing_ok=True)  # the pointer first
        self._remove_steps_except(None)
      self.record = None

  def is_better(self, value: float) -> bool:
    """A record by another metric (a tagging run from before tag sets other than entities were scored by word
    accuracy) is replaced by the first score: the two numbers do not compare."""
    if self.record is None or self.record["metric"] != self.task.metric_name:
      return True
    return value > self.record["value"] if self.task.higher_is_better else value < self.record["value"]

  def update(self, step: int, metrics: dict[str, float], params: Any, predictions: dict[str, tuple[Split, Any]]):
    value = metrics[self.task.metric_name]
    if not _on_every_process(self.is_better(value)):
      return
    step_dir = self.run.best_step(step)
    store.save_pretrained(step_dir, self.model_config, params)  # collective: every process enters it
    # Every process keeps the same record, so the next decision (and its collective save) agrees across hosts.
    self.record = {"step": step, "metric": self.task.metric_name, "value": value, "metrics": metrics,
                   "weights": step_dir, "head": self.task.identity(),
                   "selection": "best dev checkpoint of one run, scored every train.eval_every steps"}
    if jax.process_index() == 0:
      self.task.tune(predictions, step_dir)
      for split_name, (split, split_predictions) in predictions.items():
        self.task.write_predictions(split, split_predictions,
                                    os.path.join(step_dir, self.task.predictions_name(split_name)))
      storage.write_atomic(self.run.best_record, json.dumps(self.record, indent=2))
      self._remove_steps_except(os.path.basename(step_dir))

  def stops_early(self, step: int) -> bool:
    """`patience` evaluations since the best found none better (said); a rerun stops as it did."""
    patience = self.patience
    stop = bool(patience and self.record and step - self.record["step"] >= patience * self.eval_every)
    if stop and jax.process_index() == 0:
      print(f"Early stopping at step {step}: no better dev {self.record['metric']} than step {self.record['step']}'s "
            f"{self.record['value']:.4f} in train.early_stopping_patience={patience} evaluations.", flush=True)
    return stop

  def _remove_steps_except(self, keep: str | None) -> None:
    if storage.path(self.directory).is_dir():
      for old in storage.path(self.directory).glob("step_*"):
        if old.name != keep:
          old.rmtree(missing_ok=True)


def _on_every_process(decision: bool) -> bool:
  """Process 0's decision, on every process: a collective save entered by some processes only deadlocks, and a
  metric that differs in its last bit between hosts (host-side postprocessing) must not split the decision."""
  if jax.process_count() == 1:
    return decision
  return bool(multihost_utils.broadcast_one_to_all(np.int32(decision)))
