"""Whole-word n-gram masking (google-research/albert `create_masked_lm_predictions`, REFERENCE d.2), vectorized.

The original's greedy loop is kept step for step, but run for a whole batch at once: step k takes the k-th word
of every example's random word order, samples n with p(n) ∝ 1/n (n ≤ `ngram`; reversed when not
favor_shorter_ngram), shrinks n while the span would exceed the budget, skips it if still too long or if it
overlaps an earlier span, else covers it; an example stops once its budget is reached. A word is a start piece plus
the non-start pieces after it, by the tokenizer's own marker (`start_piece_table`): SentencePiece's "▁"
(`is_start_piece`), WordPiece's "##" continuations, byte-level BPE's "Ġ" (where a segment's first word has none, so
a segment's first piece starts a word too: `segment_starts_word`); [CLS], [SEP] and padding are never candidates.
Budget: min(max_predictions_per_seq, max(1, round(0.15 * tokens incl. specials))), or without the cap when
max_predictions_per_seq is 0. Each chosen token independently becomes [MASK] (80%), stays (10%) or becomes a
uniformly random id of the whole vocabulary (10%). Random numbers are hashes of each example's key (data_pipeline.rng),
so an example's mask does not depend on the batch it is in.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from data_pipeline import rng

_PUNCTUATION = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')
_ENGLISH = frozenset("abcdefghijklmnopqrstuvwxyz")


def is_start_piece(piece: str) -> bool:
  """`_is_start_piece_sp`: starts with ▁ or <, is punctuation, or has a character outside a-z and punctuation."""
  return (piece.startswith("\u2581") or piece.startswith("<") or piece in _PUNCTUATION
          or not all(c.lower() in _ENGLISH or c in _PUNCTUATION for c in piece))


def is_wordpiece_start(piece: str) -> bool:
  return not piece.startswith("##")


def is_byte_level_start(piece: str) -> bool:
  """A piece after a space ("Ġ"), or a special token such as <s>."""
  return piece.startswith("\u0120") or (piece.startswith("<") and piece.endswith(">"))


# Each tokenizer kind's word-start rule, and whether the first piece of a segment opens a word whatever it is.
_START_RULES = {"sentencepiece": (is_start_piece, False), "unigram": (is_start_piece, False),
                "wordpiece": (is_wordpiece_start, False), "bpe": (is_byte_level_start, True)}


def start_piece_table(pieces: list[str], kind: str = "sentencepiece") -> np.ndarray:
  """bool [vocab]: whether each piece starts a word, by the rule of the tokenizer `kind`."""
  rule, _ = _START_RULES[kind]
  return np.array([rule(p) for p in pieces], bool)


def segment_starts_word(kind: str) -> bool:
  return _START_RULES[kind][1]


def num_prediction_slots(max_seq_length: int, max_predictions_per_seq: int, masked_lm_prob: float) -> int:
  """P: the cap, or without one max(1, round(prob * max_seq_length)), which the budget of any example fits."""
  return max_predictions_per_seq or max(1, int(round(max_seq_length * masked_lm_prob)))


def word_order(z: np.ndarray, num_words: np.ndarray) -> np.ndarray:
  """uint32 [B, W]: each example's words 0..num_words-1 in a random order (from the high bits of `z`, uint64 [B, W]),
  then its missing words. Sorts (random bits | word index) as uint32, much faster than argsort; missing words get
  all random bits set, so they sort last."""
  width = z.shape[1]
  index_bits = max(int(width - 1).bit_length(), 1)
  words = np.arange(width, dtype=np.uint32)
  order_key = (z >> np.uint64(32 + index_bits)).astype(np.uint32) << np.uint32(index_bits) | words
  order_key[words >= num_words[:, None]] |= np.uint32(0xFFFFFFFF << index_bits & 0xFFFFFFFF)
  return np.sort(order_key, axis=1) & np.uint32((1 << index_bits) - 1)


@dataclasses.dataclass(frozen=True)
class Masker:
  start_table: np.ndarray          # bool [vocab]: is_start_piece of each id
  cls_id: int
  sep_id: int
  mask_id: int
  max_seq_length: int
  max_predictions_per_seq: int = 20
  masked_lm_prob: float = 0.15
  ngram: int = 3
  favor_shorter_ngram: bool = True
  segment_starts_word: bool = False   # the first piece after each [SEP] opens a word (byte-level BPE)

  @property
  def num_slots(self) -> int:
    return num_prediction_slots(self.max_seq_length, self.max_predictions_per_seq, self.masked_lm_prob)

  def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray, keys: np.ndarray) -> dict[str, np.ndarray]:
    masked, _ = self.select(input_ids, attention_mask, keys)
    return self.apply(input_ids, masked, keys)

  def select(self, input_ids: np.ndarray, attention_mask: np.ndarray,
             keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bool [B, S] tokens to predict, int [B, W] words per accepted span at its first word, 0 elsewhere)."""
    batch, ngram = len(input_ids), self.ngram
    candidate = (attention_mask > 0) & (input_ids != self.cls_id) & (input_ids != self.sep_id)
    starts = candidate & self.start_table[input_ids]
    starts[:, 1] = candidate[:, 1]             # the first piece after [CLS] always opens a word
    if self.segment_starts_word:
      starts[:, 1:] |= candidate[:, 1:] & (input_ids[:, :-1] == self.sep_id)
    word_of_token = np.cumsum(starts, axis=1, dtype=np.int32) - 1
    num_words = word_of_token[:, -1] + 1
    width = max(int(num_words.max()), 1)
    rows = np.arange(batch)
    # cum[b, w]: candidate tokens before word w starts (a word's pieces after a [SEP] count towards it, as in the
    # original); cum[b, num_words] = all candidates. A span of words [w, v) has cum[v] - cum[w] tokens.
    before = np.cumsum(candidate, axis=1, dtype=np.int32) - candidate
    cum = np.zeros((batch, width + 1), np.int32)
    r, c = np.nonzero(starts)
    cum[r, word_of_token[r, c]] = before[r, c]
    cum[rows, num_words] = before[:, -1] + candidate[:, -1]

    budget = np.maximum(1, np.round(attention_mask.sum(axis=1) * self.masked_lm_prob)).astype(np.int32)
    if self.max_predictions_per_seq:
      budget = np.minimum(budget, self.max_predictions_per_seq)
    budget[num_words == 0] = 0
    z = rng.bits(keys, 1, width)
    order = np.ascontiguousarray(word_order(z, num_words).T.astype(np.int64))
    pvals = 1.0 / np.arange(1, ngram + 1)
    if not self.favor_shorter_ngram:
      pvals = pvals[::-1]
    u = (z & np.uint64(0xFFFFFFFF)).T.astype(np.float64) * 2.0**-32
    # n of the k-th candidate: 1 + the number of cumulative probabilities (the last one left out) at most u
    sampled_n = 1 + np.searchsorted(np.cumsum(pvals / pvals.sum())[:-1], u, side="right")

    covered = np.zeros((batch, width + ngram), bool)
    accepted = np.zeros((batch, width), np.int64)
    count = np.zeros(batch, np.int32)
    offsets = np.arange(ngram)
    for k in range(width):
      active = (count < budget) & (k < num_words)
      if not active.any():
        break
      start = order[k]
      ends = np.minimum(start[:, None] + offsets + 1, num_words[:, None])       # [B, ngram]: end of an m-gram
      tokens = cum[rows[:, None], ends] - cum[rows, start][:, None]
      # The original shrinks n while the span is over budget; tokens grow with n, so this is the longest fit.
      take = ((offsets < sampled_n[k][:, None]) & (tokens <= (budget - count)[:, None])).sum(axis=1)
      last = np.maximum(take - 1, 0)
      length = np.where(take > 0, ends[rows, last] - start, 0)
      overlap = (covered[rows[:, None], start[:, None] + offsets] & (offsets < length[:, None])).any(axis=1)
      accept = active & (take > 0) & ~overlap
      r, w, n = rows[accept], start[accept], length[accept]
      covered[r[:, None], w[:, None] + offsets] |= offsets < n[:, None]
      accepted[r, w] = n
      count[accept] += tokens[accept, last[accept]]
    masked = candidate & covered[rows[:, None], np.maximum(word_of_token, 0)]
    return masked, accepted

  def apply(self, input_ids: np.ndarray, masked: np.ndarray, keys: np.ndarray) -> dict[str, np.ndarray]:
    """Replace the chosen tokens (80/10/10 per token) and list them in ascending position order."""
    batch, slots = len(input_ids), self.num_slots
    rank = np.cumsum(masked, axis=1, dtype=np.int32) - 1
    row, col = np.nonzero(masked)     # row-major: ascending positions within a row; the budget keeps rank < slots
    slot = rank[row, col]
    positions = np.zeros((batch, slots), np.int32)
    positions[row, slot] = col
    weights = np.zeros((batch, slots), np.float32)
    weights[row, slot] = 1.0
    labels = np.zeros((batch, slots), np.int32)
    labels[row, slot] = input_ids[row, col]
    action, pick = rng.split_uniform(rng.bits(keys, 3, slots)[row, slot])
    random_ids = (pick * len(self.start_table)).astype(np.int32)
    output = input_ids.copy()
    output[row, col] = np.where(action < 0.8, self.mask_id, np.where(action < 0.9, input_ids[row, col], random_ids))
    return {"input_ids": output, "masked_lm_positions": positions, "masked_lm_ids": labels,
            "masked_lm_weights": weights}
