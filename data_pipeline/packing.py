"""RoBERTa's FULL-SENTENCES inputs (Liu et al. 2019, section 4.2): whole sentences packed back to back.

The split's documents are taken in one order per epoch (the same on every host: `DocumentStream` with one
process), and their sentences fill each sequence of `max_tokens` = max_seq_length - 2 tokens in turn, crossing
document boundaries with a [SEP] between two documents. A sentence that does not fit closes the sequence and opens
the next; one longer than a whole sequence is cut (its rest opens the next sequence). Sequences never cross an
epoch's end, so every token of an epoch is in exactly one of its sequences, and sequence n of epoch e is a pure
function of (seed, e, n): the packing of that epoch's document order from its start; its mask key is
`rng.mix(seed, e, n)`. The iterator's state is the cursor where the next sequence starts.
"""
from __future__ import annotations

from typing import Any, Mapping

import grain
import numpy as np

from data_pipeline import rng
from data_pipeline.instances import Instance

from albert_jax.errors import InputError


class FullSentences(grain.IterDataset):
  """(document index, epoch, document) elements of every document -> packed single-segment Instances.

  Grain's worker processes each take a stride of the sequences (`set_slice`); each worker packs them all."""

  def __init__(self, parent: grain.IterDataset, seed: int, max_tokens: int, sep_id: int):
    super().__init__(parent)
    self._seed, self._max_tokens, self._sep_id = seed, max_tokens, sep_id
    self._slice = 0, 1

  def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
    """Keeps sequences sl.start, sl.start + sl.step, ... (grain's `mp_prefetch` workers)."""
    if sequential_slice:
      raise InputError("FullSentences takes strided slices only (mp_prefetch with sequential_slice=False).")
    start, step = self._slice
    self._slice = start + sl.start * step, step * sl.step

  def __iter__(self) -> "_PackingIterator":
    return _PackingIterator(self._parent.__iter__(), self._seed, self._max_tokens, self._sep_id, self._slice)


class _PackingIterator(grain.DatasetIterator):

  def __init__(self, parent: grain.DatasetIterator, seed: int, max_tokens: int, sep_id: int,
               stride: tuple[int, int]):
    super().__init__(parent)
    self._seed, self._max_tokens, self._step = seed, max_tokens, stride[1]
    self._separator = np.array([sep_id], np.int32)
    self.set_state({"document": 0, "sentence": 0, "token": 0, "sequence": 0})
    for _ in range(stride[0]):
      self._pack()

  def _next_document(self) -> None:
    """Moves the cursor to the start of the next document that has a token."""
    while True:
      _, epoch, (ids, offsets) = next(self._parent)
      self._document += 1
      if offsets[-1] > 0:
        break
    self._ids, self._offsets, self._epoch, self._sentence, self._token = ids, offsets, epoch, 0, 0

  def _pack(self) -> Instance:
    epoch, pieces, used = self._epoch, [], 0
    while True:
      separator = int(used > 0 and self._token == 0)               # before the first tokens of another document
      room = self._max_tokens - used - separator
      # the last sentence end within `room` of the cursor: the whole sentences that fit, taken at once
      end = int(np.searchsorted(self._offsets, self._token + room, side="right")) - 1
      if end > self._sentence:
        taken = self._ids[self._token:self._offsets[end]]
        if len(taken):
          pieces += [self._separator, taken] if separator else [taken]
          used += separator + len(taken)
        self._sentence, self._token = end, int(self._offsets[end])
      elif used == 0:                              # a sentence longer than a sequence: cut
        pieces.append(self._ids[self._token:self._token + self._max_tokens])
        used, self._token = self._max_tokens, self._token + self._max_tokens
      else:
        break
      if self._sentence == len(self._offsets) - 1:
        self._next_document()
        if self._epoch != epoch:
          break
      if used == self._max_tokens:
        break
    key = rng.mix(self._seed, epoch, self._sequence)
    self._sequence = self._sequence + 1 if self._epoch == epoch else 0
    return Instance(key, np.concatenate(pieces).astype(np.int32, copy=False), None, 0)

  def __next__(self) -> Instance:
    instance = self._pack()
    for _ in range(self._step - 1):
      self._pack()
    return instance

  def get_state(self) -> dict[str, Any]:
    return {"document": self._document, "sentence": self._sentence, "token": self._token,
            "sequence": self._sequence}

  def set_state(self, state: Mapping[str, Any]) -> None:
    self._parent.set_state({"next_index": state["document"]})
    self._document = state["document"] - 1
    self._next_document()
    self._sentence, self._token, self._sequence = state["sentence"], state["token"], state["sequence"]
