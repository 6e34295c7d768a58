"""A task's predictions: computed over every feature row in micro batches of one length bucket each
(`predict_features`), scored against a split's labels (`evaluate_splits`) and written as the benchmark's file
(`predict_split_file`).

`--mode=predict --output=PATH.jsonl`: JSON lines whatever the task's own format. GLUE's predictions, a TSV of
labels otherwise, become rows with every class's probability and logit, which a comparison with an export needs
(your own classification data's rows hold the probabilities already); a task whose predictions are not one row
per example (SQuAD, RACE: JSON) refuses the suffix rather than writing its own format under it."""
from __future__ import annotations

import dataclasses
import json
from typing import Callable

import jax
import numpy as np

from albert_jax import buckets, engine, storage
from albert_jax.errors import InputError
from albert_jax.tasks.base import Split, Task
from albert_jax.tasks.sequence import SequenceClassificationTask
from data_pipeline.progress import Progress

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
  rows = [_row(task, logits) for logits in np.asarray(outputs["logits"], np.float64)]
  with storage.open_atomic(path) as f:
    for example, row in zip(split.examples, rows, strict=True):
      f.write(json.dumps({"id": example.guid, **row}) + "\n")


def _row(task: SequenceClassificationTask, logits: np.ndarray) -> dict:
  """{"score", "logits"} of a regression; {"label", "probabilities", "logits"} by class name otherwise."""
  if task.is_regression:
    return {"score": float(logits[0]), "logits": [float(logits[0])]}
  probabilities = np.exp(logits - logits.max())
  probabilities /= probabilities.sum()
  return {"label": task.labels[int(logits.argmax())],
          "probabilities": dict(zip(task.labels, map(float, probabilities))),
          "logits": dict(zip(task.labels, map(float, logits)))}


def prediction_split(split: engine.BatchSplit) -> engine.BatchSplit:
  """Batches of prediction: `micro_batch` rows per data-parallel device (`train.micro_batch_size`, the memory of
  one accumulation step of training), not the whole global batch at once."""
  rows = split.micro_batch * split.data_parallel
  if rows % split.process_count:
    raise InputError(f"train.micro_batch_size={split.micro_batch} x {split.data_parallel} data-parallel devices = "
                     f"{rows} rows per prediction call do not divide over {split.process_count} processes; pick a "
                     "micro batch that makes them divide.")
  return dataclasses.replace(split, global_batch=rows, accumulation_steps=1)


def predict_features(predict_fn: Callable, params, features: dict[str, np.ndarray], s: engine.Setup,
                     label: str | None = None, lengths: tuple[int, ...] | None = None) -> dict[str, np.ndarray]:
  """Runs `predict_fn(params, batch)` over every feature row in `prediction_split` batches of one length bucket
  each (`lengths`; default: the rows' full length), the last batch of a bucket padded, padding dropped, outputs
  in row order. A row's outputs depend neither on the rows beside it nor on the padding after it, so the micro
  batch and the buckets change no number beyond float rounding. `label`: show progress under that name on process
  0 (a whole test split takes minutes on a CPU)."""
  predict = jax.jit(predict_fn, out_shardings=s.replicated)
  num_rows = len(next(iter(features.values())))
  full = features["input_ids"].shape[-1]
  split = prediction_split(s.split)
  progress = Progress(label, "rows predicted", (num_rows, "rows")) if label and jax.process_index() == 0 else None
  outputs: dict[str, np.ndarray] = {}
  done = 0
  for length, bucket_rows in buckets.prediction_groups(features, lengths or (full,)):
    bucket = buckets.cut({k: v[bucket_rows] for k, v in features.items()}, length, full)
    for start in range(0, len(bucket_rows), split.global_batch):
      chunk = np.arange(start, start + split.global_batch) % len(bucket_rows)  # wrap to pad the last batch
      batch = s.global_batch({k: v[split.local(chunk)] for k, v in bucket.items()})
      kept = chunk[:len(bucket_rows) - start]
      for name, value in jax.device_get(predict(params, batch)).items():
        if name not in outputs:
          outputs[name] = np.zeros((num_rows, *np.shape(value)[1:]), np.asarray(value).dtype)
        outputs[name][bucket_rows[kept]] = np.asarray(value)[:len(kept)]
      done += len(kept)
      if progress:
        progress.update(done, done)
  if progress:
    progress.done()
  return outputs


def evaluate_splits(task, model, params, splits: dict[str, Split], s: engine.Setup, lengths: tuple[int, ...]):
  """Scores every eval split in batches cut to `lengths`; returns (flat metrics, {split: (split, predictions)})."""
  metrics, predictions = {}, {}
  for name, split in splits.items():
    outputs = predict_features(task.predictor(model), params, split.features, s, lengths=lengths)
    split_predictions = task.postprocess(split, outputs)
    scores = task.score(split, split_predictions)
    prefix = "" if name == "dev" else f"{name}/"
    metrics.update({f"{prefix}{k}": float(v) for k, v in scores.items()})
    predictions[name] = (split, split_predictions)
  return metrics, predictions


def predict_split_file(s: engine.Setup, task, model, params, split: Split, path: str, lengths: tuple[int, ...],
                       label: str | None = None) -> str:
  """Predictions for a whole split (the unlabelled test set, the user's own file) with the replicated `params`,
  in batches cut to `lengths`, written to `path`; `label`: the progress line's (default: the split's name)."""
  outputs = predict_features(task.predictor(model), params, split.features, s,
                             label or f"predicting split {split.name}", lengths)
  if jax.process_index() == 0:
    write(task, split, outputs, path)
  return path
