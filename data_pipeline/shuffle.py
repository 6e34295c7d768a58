"""grain's global shuffle order (`MapDataset.shuffle`: `index_shuffle(i, n - 1, seed, rounds=4)`), an epoch at once.

grain computes each element's position with one C++ call: a 4-round Simon cipher on a block of at least 16 bits,
cycle-walked until it lands in [0, n). On a few thousand documents that is ~20 cycles, ~20 us per document, about
as long as reading the document. Here the same cipher runs vectorized over the epoch, so the loader keeps grain's
order, and with it checkpoints written by the grain pipeline, at ~1 us per document. Below 2^14 documents the
block is the 16-bit minimum and walks average 2^16 / n steps: there the cipher is tabulated over the whole block
and the walks are shortened by pointer doubling (a few passes over the table), then finished by the starts alone,
which keeps a small corpus's epoch from costing more to order than to read.
tests/test_data_stream.py checks it against grain's own function.
"""
from __future__ import annotations

import math

import numpy as np

_ROUNDS = 4
_MIN_BLOCK_BITS = 16
_MASK32 = 0xFFFFFFFF


def _round_keys(seed: int) -> list[int]:
  """std::seed_seq{seed}.generate(4 words): the C++ standard's algorithm, which grain uses as its key schedule."""
  n, out = _ROUNDS, [0x8B8B8B8B] * _ROUNDS           # n output words from s = 1 input word
  t = (n - 1) // 2                                    # the standard's t for n < 7
  p, q, m = (n - t) // 2, (n - t) // 2 + t, max(1 + 1, n)

  def scramble(x: int) -> int:
    return x ^ (x >> 27)

  for k in range(m):
    r1 = (1664525 * scramble(out[k % n] ^ out[(k + p) % n] ^ out[(k - 1) % n])) & _MASK32
    r2 = (r1 + (1 if k == 0 else k % n + seed if k == 1 else k % n)) & _MASK32   # s, then k % n + v[k - 1]
    out[(k + p) % n] = (out[(k + p) % n] + r1) & _MASK32
    out[(k + q) % n] = (out[(k + q) % n] + r2) & _MASK32
    out[k % n] = r2
  for k in range(m, m + n):
    r3 = (1566083941 * scramble((out[k % n] + out[(k + p) % n] + out[(k - 1) % n]) & _MASK32)) & _MASK32
    r4 = (r3 - k % n) & _MASK32
    out[(k + p) % n] ^= r3
    out[(k + q) % n] ^= r4
    out[k % n] = r4
  return out


def _block16(seed: int) -> np.ndarray:
  """The cipher on every 16-bit block, uint16 [65536]: 8-bit halves, whose round function is a 256-entry table."""
  keys = [k & 0xFF for k in _round_keys(seed)]
  half = np.arange(256, dtype=np.uint16)
  rotate = lambda x, r: ((x << r) & 0xFF) | (x >> (8 - r))
  round_function = (rotate(half, 1) & half) ^ rotate(half, 2)      # a rotation by 8 is the identity on 8 bits
  left, right = np.repeat(half, 256), np.tile(half, 256)
  for i in range(0, _ROUNDS, 2):
    left = left ^ round_function[right] ^ keys[i]
    right = right ^ round_function[left] ^ keys[i + 1]
  return (left << 8) | right


def _walk_table(table: np.ndarray, count: int) -> np.ndarray:
  """For each i < count, the first element below count on i's cycle after i (`table` is a permutation).

  Pointer doubling first: each pass over the whole table doubles the jump of every entry that has not landed below
  count. It stops once a jump covers about a sixteenth of the average walk (2^16 / count steps); the count starts
  then walk the rest on their own, a few dozen jumps over only the starts still short of their landing."""
  ahead = table.copy()
  for _ in range(max(1, round(math.log2(table.size / count)) - 4)):
    np.copyto(ahead, ahead.take(ahead), where=ahead >= count)
  landing = ahead[:count].astype(np.int64)
  walking = np.flatnonzero(landing >= count)
  while walking.size:
    landing[walking] = ahead[landing[walking]]
    walking = walking[landing[walking] >= count]
  return landing


def permutation(count: int, seed: int) -> np.ndarray:
  """int64 [count]: element i is grain's `index_shuffle(i, max_index=count - 1, seed=seed, rounds=4)`."""
  if count == 1:
    return np.zeros(1, np.int64)
  bits = math.ceil(math.log2(count - 1))
  word = max(bits + bits % 2, _MIN_BLOCK_BITS) // 2
  if (1 << (2 * word)) > 4 * count:                   # only at the 16-bit minimum: long walks
    return _walk_table(_block16(seed % 2**32), count)
  mask, shift = np.uint64((1 << word) - 1), np.uint64(word)
  keys = [np.uint64(k) & mask for k in _round_keys(seed % 2**32)]

  def rotate(x: np.ndarray, r: int) -> np.ndarray:
    return ((x << np.uint64(r)) & mask) | (x >> np.uint64(word - r))

  def encrypt(x: np.ndarray) -> np.ndarray:
    left, right = (x >> shift) & mask, x & mask      # the C++ bitsets keep the low 2 * word bits
    for i in range(0, _ROUNDS, 2):
      left = left ^ (rotate(right, 1) & rotate(right, 8)) ^ rotate(right, 2) ^ keys[i]
      right = right ^ (rotate(left, 1) & rotate(left, 8)) ^ rotate(left, 2) ^ keys[i + 1]
    return (left << shift) | right

  out, todo = np.arange(count, dtype=np.uint64), np.arange(count)
  while todo.size:                                    # cycle-walk every element until it lands below count
    out[todo] = encrypt(out[todo])
    todo = todo[out[todo] >= count]
  return out.astype(np.int64)
