"""Length buckets: fine-tuning, evaluation and prediction batches padded to the shortest of a few fixed lengths that
holds their rows, instead of to `data.max_seq_length`.

Each example goes to the smallest bucket at least as long as its tokens (`attention_mask`); a batch holds rows of
one bucket, cut to its length, so a run compiles one step per bucket it uses and no more (`data.length_buckets`,
e.g. "64,128,256,512"; "none" pads everything to max_seq_length). A row's outputs do not depend on the padding
after it (the attention mask hides it), so predictions equal the unbucketed ones to float rounding.

Training order (`BucketedBatches`) is a pure function of (seed, epoch), like the unbucketed order: each epoch
shuffles the rows of each bucket, cuts them into global batches, moves the rows left over (fewer than a batch) up
into the next longer bucket, where they fit, and shuffles the order of all the batches. A uniform shuffle of the
batches draws the next batch from a bucket with probability proportional to the batches it has left, so short
and long examples are spread over the epoch as without buckets, and an epoch sees every example once except at
most one batch's worth of the longest rows (without buckets: of any rows).
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from albert_jax.errors import InputError
from albert_jax.tasks.base import MODEL_INPUTS

NONE = ("", "none")
DEFAULT = "64,128,256,512"  # fine-tuning configs' data.length_buckets; --mode=embed's where a config has none


def parse(spec: str | int | None, max_seq_length: int) -> tuple[int, ...]:
  """`data.length_buckets` as sorted lengths ending at max_seq_length: longer ones are dropped, max_seq_length is
  always the last. "none" (or empty) gives (max_seq_length,): one bucket, today's padding."""
  text = str(spec if spec is not None else "").strip().lower()
  if text in NONE:
    return (max_seq_length,)
  try:
    lengths = sorted({int(part) for part in text.split(",") if part.strip()})
  except ValueError:
    raise InputError(f"data.length_buckets={spec!r} is not a comma-separated list of lengths; e.g. "
                     "--config.data.length_buckets=64,128,256,512, or none to pad every batch to "
                     "data.max_seq_length.") from None
  if not lengths or lengths[0] < 2:
    raise InputError(f"data.length_buckets={spec!r}: every length must be at least 2 ([CLS] and [SEP]); e.g. "
                     "64,128,256,512, or none.")
  return tuple(length for length in lengths if length < max_seq_length) + (max_seq_length,)


def row_lengths(features: dict[str, np.ndarray]) -> np.ndarray:
  """Tokens per row: the last position the attention mask covers, over every sequence of a row (the choices of
  a multiple-choice row)."""
  mask = np.asarray(features["attention_mask"])
  positions = np.arange(1, mask.shape[-1] + 1)
  last = (mask != 0) * positions
  return last.reshape(mask.shape[0], -1).max(axis=1)


def assign(lengths: np.ndarray, buckets: tuple[int, ...]) -> np.ndarray:
  """The index of the smallest bucket that holds each row."""
  index = np.searchsorted(np.asarray(buckets), lengths, side="left")
  if len(lengths) and index.max() >= len(buckets):
    raise InputError(f"A row of {int(lengths.max())} tokens is longer than the longest bucket {buckets[-1]}.")
  return index


def cut(features: dict[str, np.ndarray], length: int, full_length: int) -> dict[str, np.ndarray]:
  """The model inputs with their sequence axis (the last, of `full_length` positions) cut to `length`; every other
  array (labels, a multi-label row's classes however many) is kept whole."""
  if length == full_length:
    return features
  return {name: a[..., :length] if name in MODEL_INPUTS else a for name, a in features.items()}


def prediction_groups(features: dict[str, np.ndarray], buckets: tuple[int, ...]) -> Iterator[tuple[int, np.ndarray]]:
  """(bucket length, the rows in it, in their order) for every bucket that holds rows, shortest first."""
  index = assign(row_lengths(features), buckets)
  for b, length in enumerate(buckets):
    rows = np.flatnonzero(index == b)
    if len(rows):
      yield length, rows


def epoch_batches(bucket_of_row: np.ndarray, num_buckets: int, batch_size: int,
                  rng: np.random.Generator) -> list[tuple[int, np.ndarray]]:
  """One epoch's batches as (bucket, rows): see the module docstring. Rows left over in one bucket are carried to
  the next longer one; those of the longest are left out of this epoch."""
  batches, carried = [], np.zeros(0, np.int64)
  for b in range(num_buckets):
    pool = np.concatenate([carried, rng.permutation(np.flatnonzero(bucket_of_row == b))])
    full = len(pool) // batch_size * batch_size
    batches += [(b, pool[i:i + batch_size]) for i in range(0, full, batch_size)]
    carried = pool[full:]
  order = rng.permutation(len(batches))
  return [batches[i] for i in order]


class BucketedBatches:
  """Shuffled epochs of bucketed global batches, a pure function of (seed, step): the resume state is the step,
  the same on every process. Each process yields its rows of the global batch (`split.local`)."""

  position_is_global = True

  def __init__(self, features: dict[str, np.ndarray], buckets: tuple[int, ...], split: Any, seed: int):
    self.features, self.buckets, self.split, self.seed, self.step = features, buckets, split, seed, 0
    self.full_length = buckets[-1]
    self.bucket_of_row = assign(row_lengths(features), buckets)
    num_rows = len(self.bucket_of_row)
    if num_rows < split.global_batch:
      raise InputError(f"The train split has {num_rows} features, fewer than train.global_batch_size="
                       f"{split.global_batch}; lower the batch size.")
    self.steps_per_epoch = len(epoch_batches(self.bucket_of_row, len(buckets), split.global_batch,
                                             np.random.default_rng((seed, 0))))
    self._epoch, self._batches = None, None

  def rows_per_bucket(self) -> dict[int, int]:
    return {length: int((self.bucket_of_row == b).sum()) for b, length in enumerate(self.buckets)}

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    epoch, index = divmod(self.step, self.steps_per_epoch)
    if epoch != self._epoch:
      self._epoch = epoch
      self._batches = epoch_batches(self.bucket_of_row, len(self.buckets), self.split.global_batch,
                                    np.random.default_rng((self.seed, epoch)))
    bucket, rows = self._batches[index]
    rows = self.split.local(rows)
    self.step += 1
    return cut({name: array[rows] for name, array in self.features.items()}, self.buckets[bucket],
               self.full_length)

  def get_state(self) -> dict[str, int]:
    return {"step": self.step}

  def set_state(self, state: dict[str, int]) -> None:
    self.step = int(state["step"])
