"""`--mode=predict --output=PATH.jsonl`: JSON lines whatever the task's own format. GLUE's predictions, a TSV of
labels otherwise, become rows with every class's probability and logit, which a comparison with an export needs
(your own classification data's rows hold the probabilities already); a task whose predictions are not one row
per example (SQuAD, RACE: JSON) refuses the suffix rather than writing its own format under it."""
from __future__ import annotations

import json

import numpy as np

from albert_jax import storage
from albert_jax.errors import InputError
from albert_jax.tasks.base import Split, Task
from albert_jax.tasks.sequence import SequenceClassificationTask

JSONL = ".jsonl"


def _per_class(task: Task) -> bool:
  """A sequence classifier whose own predictions are not JSON lines (GLUE's TSV)."""
  return isinstance(task, SequenceClassificationTask) and task.predictions_suffix != JSONL


def check_output(task: Task, path: str) -> None:
  """Refuses a .jsonl --output for a task that writes another format, before anything is computed."""
  if path.endswith(JSONL) and task.predictions_suffix != JSONL and not _per_class(task):
    raise InputError(f"--output={path}: {task.settings.task} predictions are written as {task.predictions_suffix}, "
                     f"not JSON lines; name the output {path[:-len(JSONL)]}{task.predictions_suffix}.")


def write(task: Task, split: Split, outputs: dict[str, np.ndarray], path: str) -> None:
  """The predictions of `split` from the model's `outputs`: per-class rows where `path` ends in .jsonl and the task
  is `_per_class`, else the task's own format."""
  if not (path.endswith(JSONL) and _per_class(task)):
    task.write_predictions(split, task.postprocess(split, outputs), path)
    return
  logits = np.asarray(outputs["logits"], np.float64)
  with storage.open_atomic(path) as f:
    for example, row in zip(split.examples, logits, strict=True):
      f.write(json.dumps({"id": example.guid, **_row(task, row)}) + "\n")


def _row(task: SequenceClassificationTask, logits: np.ndarray) -> dict:
  """{"score", "logits"} of a regression; {"label", "probabilities", "logits"} by class name otherwise."""
  if task.is_regression:
    return {"score": float(logits[0]), "logits": [float(logits[0])]}
  probabilities = np.exp(logits - logits.max())
  probabilities /= probabilities.sum()
  return {"label": task.labels[int(logits.argmax())],
          "probabilities": dict(zip(task.labels, map(float, probabilities))),
          "logits": dict(zip(task.labels, map(float, logits)))}
