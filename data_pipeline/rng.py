"""Counter-based randomness: every random choice is a hash of (seed, what, where), never a stream position.

That makes each document's examples and each example's mask a pure function of its key, so results do not depend
on batch composition, worker count or how far an iterator got before a checkpoint.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def _finalize(z: int) -> int:
  z = ((z ^ (z >> 30)) * _M1) & _MASK64
  z = ((z ^ (z >> 27)) * _M2) & _MASK64
  return z ^ (z >> 31)


def mix(*values: int) -> int:
  """A 64-bit key from integers (splitmix64 chained over the values)."""
  z = 0
  for v in values:
    z = _finalize((z + _GOLDEN + (int(v) & _MASK64)) & _MASK64)
  return z


def bits(keys: np.ndarray, stream: int, width: int) -> np.ndarray:
  """Random uint64, shape [len(keys), width]: element [b, j] depends only on (keys[b], stream, j)."""
  with np.errstate(over="ignore"):
    z = keys.astype(np.uint64)[:, None] ^ np.uint64(mix(stream))
    z = z + np.arange(1, width + 1, dtype=np.uint64) * np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def split_uniform(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Two independent uniform [0, 1) arrays (float64, 32 random bits each) from the two halves of `bits`."""
  return (z >> np.uint64(32)).astype(np.float64) * 2.0**-32, (z & np.uint64(0xFFFFFFFF)).astype(np.float64) * 2.0**-32
