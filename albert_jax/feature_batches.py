"""A task's fixed-shape features in batches: shuffled training epochs (`training_batches`), and prediction over every
row (`predict_features`) in micro batches (`prediction_split`), cut to the length buckets (`length_buckets`)."""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from albert_jax import buckets, engine
from albert_jax.errors import InputError
from data_pipeline.progress import Progress


class FeatureBatches:
  """Shuffled epochs over fixed-shape features, a pure function of (seed, step): the resume state is the step."""

  position_is_global = True  # the same on every process: a resume on another process count is exact

  def __init__(self, features: dict[str, np.ndarray], split: engine.BatchSplit, seed: int):
    self.features, self.split, self.seed, self.step = features, split, seed, 0
    self.num_rows = len(next(iter(features.values())))
    if self.num_rows < split.global_batch:
      raise InputError(f"The train split has {self.num_rows} features, fewer than train.global_batch_size="
                       f"{split.global_batch}; lower the batch size.")
    self.steps_per_epoch = self.num_rows // split.global_batch

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    epoch, index = divmod(self.step, self.steps_per_epoch)
    order = np.random.default_rng((self.seed, epoch)).permutation(self.num_rows)
    rows = self.split.local(order[index * self.split.global_batch:(index + 1) * self.split.global_batch])
    self.step += 1
    return {name: array[rows] for name, array in self.features.items()}

  def get_state(self) -> dict[str, int]:
    return {"step": self.step}

  def set_state(self, state: dict[str, int]) -> None:
    self.step = int(state["step"])


def training_batches(features: dict[str, np.ndarray], lengths: tuple[int, ...], split: engine.BatchSplit,
                     seed: int):
  """Shuffled epochs of `features` for training: cut to `lengths` (`buckets.BucketedBatches`), or at their one
  length (`FeatureBatches`)."""
  if len(lengths) == 1:
    return FeatureBatches(features, split, seed)
  return buckets.BucketedBatches(features, lengths, split, seed)


def prediction_split(split: engine.BatchSplit) -> engine.BatchSplit:
  """Batches of prediction: `micro_batch` rows per data-parallel device (`train.micro_batch_size`, the memory of
  one accumulation step of training), not the whole global batch at once."""
  rows = split.micro_batch * split.data_parallel
  if rows % split.process_count:
    raise InputError(f"train.micro_batch_size={split.micro_batch} x {split.data_parallel} data-parallel devices = "
                     f"{rows} rows per prediction call do not divide over {split.process_count} processes; pick a "
                     "micro batch that makes them divide.")
  return dataclasses.replace(split, global_batch=rows, accumulation_steps=1)


def length_buckets(config, task=None) -> tuple[int, ...]:
  """The lengths batches are cut to (`data.length_buckets`, albert_jax/buckets.py): only max_seq_length for a task
  whose outputs are per token. `--mode=embed` passes no task."""
  max_len = config.data.max_seq_length
  if task is not None and not task.length_buckets_apply:
    return (max_len,)
  return buckets.parse(config.data.get("length_buckets", buckets.DEFAULT), max_len)


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
