"""A task's fixed-shape features in batches: shuffled training epochs (`training_batches`), cut to the length
buckets (`length_buckets`)."""
from __future__ import annotations

import numpy as np

from albert_jax import buckets, engine
from albert_jax.errors import InputError


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


def length_buckets(config, task=None) -> tuple[int, ...]:
  """The lengths batches are cut to (`data.length_buckets`, albert_jax/buckets.py): only max_seq_length for a task
  whose outputs are per token. `--mode=embed` passes no task."""
  max_len = config.data.max_seq_length
  if task is not None and not task.length_buckets_apply:
    return (max_len,)
  return buckets.parse(config.data.get("length_buckets", buckets.DEFAULT), max_len)
