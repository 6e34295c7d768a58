"""Sentence-pair construction (google-research/albert `create_instances_from_document`, REFERENCE d.1), online.

Per document: a target length of max_seq_length - 3 tokens, or with probability `short_seq_prob` a uniform one in
[2, max_seq_length - 3]; whole sentences are accumulated until the target is reached (or the document ends), then
split at a random sentence boundary into A and B. SOP swaps A and B with p=0.5 (label 1). A chunk of one sentence
cannot be split: as in the original, B is then text from a random other document (label 1) and the sentences not
used are "put back" (REFERENCE d.1, albert#234), so SOP data also holds ~NSP-style negatives; NSP (the original's
random_next_sentence) uses a random document for B with p=0.5. "none" builds single-segment `[CLS] A [SEP]`
examples (label 0). The longer side is truncated one token at a time from a random end (`truncate_pair`).

`short_seq_scope`: "chunk" (default) draws the target per chunk, so that `short_seq_prob` of the examples get a
short target. "document" draws it once per document, as the original does: with long documents a short target
yields many short chunks, so far more examples are short (on Gutenberg chapters at S=512: 37% of examples under 256
tokens instead of 13%, which wastes about a third of the compute on padding). Use it to reproduce the released data.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable, NamedTuple

import numpy as np

from data_pipeline import rng

from albert_jax.errors import InputError

SENTENCE_TASKS = ("sop", "nsp", "none")
SHORT_SEQ_SCOPES = ("document", "chunk")


class Instance(NamedTuple):
  key: int               # seeds this example's masking
  a: np.ndarray          # int32 token ids of segment A (views into the document)
  b: np.ndarray | None   # segment B, None for sentence_task="none"
  label: int             # 1 = swapped (SOP) or random B (NSP / one-sentence chunk), 0 = in order


@dataclasses.dataclass(frozen=True)
class PairConfig:
  max_seq_length: int = 512
  short_seq_prob: float = 0.1
  short_seq_scope: str = "chunk"
  sentence_task: str = "sop"

  def __post_init__(self):
    if self.sentence_task not in SENTENCE_TASKS:
      raise InputError(f"sentence_task={self.sentence_task!r}; choose one of {SENTENCE_TASKS}.")
    if self.short_seq_scope not in SHORT_SEQ_SCOPES:
      raise InputError(f"short_seq_scope={self.short_seq_scope!r}; choose one of {SHORT_SEQ_SCOPES}.")
    if self.max_seq_length < 5:
      raise InputError(f"max_seq_length={self.max_seq_length} leaves no room for [CLS] A [SEP] B [SEP].")

  @property
  def max_tokens(self) -> int:
    return self.max_seq_length - (2 if self.sentence_task == "none" else 3)


Document = tuple[np.ndarray, np.ndarray]           # (token ids, sentence offsets), see records.document_view
# (random generator, this document's index) -> another document, whose ids may be in any integer dtype (e.g. a view
# of the stored record, records.document_view): only the B segment taken from it is converted to int32.
OtherDocument = Callable[[random.Random, int], Document]


def truncate_pair(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
  """Lengths after the original's loop "drop one token from the longer side (B on ties) until they fit"."""
  excess = len_a + len_b - max_tokens
  if excess <= 0:
    return len_a, len_b
  if len_a > len_b and excess <= len_a - len_b:
    return len_a - excess, len_b
  if len_b >= len_a and excess <= len_b - len_a:
    return len_a, len_b - excess
  rest = excess - abs(len_a - len_b)          # both sides now equal; B, A, B, ... lose one token each
  low = min(len_a, len_b)
  return low - rest // 2, low - (rest + 1) // 2


def _trim(ids: np.ndarray, keep: int, r: random.Random) -> np.ndarray:
  """Keep `keep` tokens; each dropped token came from the front with p=0.5 (a Binomial(dropped, 1/2) split)."""
  dropped = len(ids) - keep
  front = bin(r.getrandbits(dropped)).count("1") if dropped else 0
  return ids[front:front + keep]


def _random_segment(r: random.Random, doc: Document, target: int) -> np.ndarray:
  """Whole sentences of `doc` from a random one on, until at least `target` tokens (or the document ends), int32."""
  ids, offsets = doc
  start = r.randint(0, len(offsets) - 2)
  end = np.searchsorted(offsets, offsets[start] + target, side="left")
  end = min(max(int(end), start + 1), len(offsets) - 1)
  return ids[offsets[start]:offsets[end]].astype(np.int32, copy=False)


def document_instances(doc: Document, doc_index: int, key: int, config: PairConfig,
                       other_document: OtherDocument) -> list[Instance]:
  """All instances of one document; a pure function of (doc, doc_index, key)."""
  ids, offsets = doc
  r = random.Random(key)
  num_sentences = len(offsets) - 1
  max_tokens = config.max_tokens

  def draw_target() -> int:
    return r.randint(2, max_tokens) if r.random() < config.short_seq_prob else max_tokens

  target = draw_target()
  instances: list[Instance] = []
  chunk_start, length, i = 0, 0, 0
  while i < num_sentences:
    length += int(offsets[i + 1] - offsets[i])
    if i == num_sentences - 1 or length >= target:
      chunk_len = i + 1 - chunk_start
      if config.sentence_task == "none":
        a, b, label = ids[offsets[chunk_start]:offsets[i + 1]], ids[:0], 0
      else:
        a_end = chunk_start + (r.randint(1, chunk_len - 1) if chunk_len >= 2 else 1)
        a = ids[offsets[chunk_start]:offsets[a_end]]
        if chunk_len == 1 or (config.sentence_task == "nsp" and r.random() < 0.5):
          b, label = _random_segment(r, other_document(r, doc_index), target - len(a)), 1
          i = a_end - 1                                  # put the unused sentences back
        else:
          b = ids[offsets[a_end]:offsets[i + 1]]
          label = int(config.sentence_task == "sop" and r.random() < 0.5)
          if label:
            a, b = b, a
      keep_a, keep_b = truncate_pair(len(a), len(b), max_tokens)
      a, b = _trim(a, keep_a, r), _trim(b, keep_b, r)
      instances.append(Instance(rng.mix(key, len(instances)), a, None if config.sentence_task == "none" else b,
                                label))
      chunk_start, length = i + 1, 0
      if config.short_seq_scope == "chunk":
        target = draw_target()
    i += 1
  return instances


def assemble(instances: list[Instance], max_seq_length: int, cls_id: int, sep_id: int) -> dict[str, np.ndarray]:
  """`[CLS] A [SEP] B [SEP]` (or `[CLS] A [SEP]`), right-padded with 0; segment ids 0 up to the first [SEP]."""
  batch = len(instances)
  input_ids = np.zeros((batch, max_seq_length), np.int32)
  len_a = np.fromiter((len(x.a) for x in instances), np.int64, batch)
  len_b = np.fromiter((0 if x.b is None else len(x.b) for x in instances), np.int64, batch)
  pair = np.fromiter((x.b is not None for x in instances), bool, batch)
  for row, x in enumerate(instances):
    input_ids[row, 1:1 + len(x.a)] = x.a
    if x.b is not None:
      input_ids[row, 2 + len(x.a):2 + len(x.a) + len(x.b)] = x.b
  rows = np.arange(batch)
  input_ids[:, 0] = cls_id
  input_ids[rows, 1 + len_a] = sep_id
  input_ids[rows[pair], (2 + len_a + len_b)[pair]] = sep_id
  total = 2 + len_a + len_b + pair
  positions = np.arange(max_seq_length)
  attention_mask = positions < total[:, None]
  token_type_ids = (positions >= (2 + len_a)[:, None]) & attention_mask
  return {"input_ids": input_ids, "attention_mask": attention_mask.astype(np.int32),
          "token_type_ids": token_type_ids.astype(np.int32),
          "sentence_order_label": np.fromiter((x.label for x in instances), np.int32, batch)}
