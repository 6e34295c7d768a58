"""Training FLOPs per token and device peaks, for `--mode=describe`, the metrics' MFU and the benchmarks.

Counts every layer application (a shared layer still runs L times), after ../shared/PERFORMANCE.md §3 and
MaxText `calculate_tflops_training_per_device`: forward + backward = 3 x forward, a matmul m*k by k*n costs 2mkn.
"""
from __future__ import annotations

from albert_jax.model_config import ModelConfig

# bf16 dense peak FLOP/s per JAX device, keyed by a prefix of `device.device_kind` (lower-cased).
PEAK_FLOPS = {
    "tpu v3": 123e12 / 2,    # one device per TensorCore, two per chip
    "tpu v4": 275e12,
    "tpu v5 lite": 197e12,   # v5e
    "tpu v5": 459e12,        # v5p
    "tpu v6 lite": 918e12,   # v6e
    "nvidia h100": 989.4e12,
    "nvidia h200": 989.4e12,
    "nvidia a100": 312e12,
}


def encoder_train_flops_per_token(c: ModelConfig, seq_len: int) -> float:
  """L·[6·(4H² + 2HI) + 12·S·H] + 6·E·H (projection): every layer application, no output head."""
  h, i, e = c.hidden_size, c.intermediate_size, c.embedding_size
  layer = 6 * (4 * h * h + 2 * h * i) + 12 * seq_len * h
  projection = 6 * e * h if c.has_embedding_projection else 0
  return c.num_hidden_layers * c.inner_group_num * layer + projection


def train_flops_per_token(c: ModelConfig, seq_len: int, num_predictions: int) -> float:
  """The encoder's + (M/S)·6·(H·E + E·V) (the MLM head at its M rows per sequence, `pretrain.prediction_slots`)."""
  head = num_predictions / seq_len * 6 * (c.hidden_size * c.embedding_size + c.embedding_size * c.vocab_size)
  return encoder_train_flops_per_token(c, seq_len) + head


def peak_flops(device_kind: str) -> float | None:
  kind = device_kind.lower()
  for prefix in sorted(PEAK_FLOPS, key=len, reverse=True):
    if kind.startswith(prefix):
      return PEAK_FLOPS[prefix]
  return None

