"""Optimizers and schedule, after google-research/albert `optimization.py` and `lamb_optimizer.py`.

The original LAMB and AdamW use Adam moments WITHOUT bias correction and skip weight decay (and, for LAMB, the
trust ratio) for LayerNorm parameters and biases; optax's `scale_by_adam` always bias-corrects, so the faithful
moments are a small transformation here. The learning rate warms up linearly, then decays polynomially from step 0
(so it drops from lr to lr·(1 - W/T) at the end of warmup, as the original; `optax.join_schedules` would not).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from albert_jax.errors import InputError

OPTIMIZERS = ("lamb", "optax_lamb", "adamw")


def learning_rate_problem(rate: float) -> str | None:
  """Why `rate` cannot train (None if it can): the schedule runs in float32, where a rate below its smallest
  normal number is 0 (XLA flushes subnormals) and one beyond its largest is infinite. 0 itself is a frozen run."""
  if not math.isfinite(rate):
    return f"{rate} is not a finite number"
  if rate < 0:
    return f"{rate} is negative (that is gradient ascent)"
  smallest, largest = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
  if 0 < rate < smallest:
    return f"{rate} is 0 in float32 (below its smallest normal number, {smallest:g}), so nothing would train"
  if rate > largest:
    return f"{rate} is infinite in float32 (beyond {largest:g})"
  return None


def learning_rate_schedule(lr: float, warmup_steps: int, total_steps: int, power: float = 1.0) -> optax.Schedule:
  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    decayed = lr * (1.0 - jnp.minimum(step, total_steps) / total_steps) ** power
    if warmup_steps <= 0:
      return decayed
    return jnp.where(step < warmup_steps, lr * step / warmup_steps, decayed)
  return schedule


def decay_mask(params: Any) -> Any:
  """True where weight decay (and LAMB's trust ratio) applies: not LayerNorm, not any bias."""
  def decayed(path, _):
    names = [getattr(k, "key", getattr(k, "name", "")) for k in path]
    return not any(n == "LayerNorm" or n == "bias" or "layer_norm" in str(n) for n in names)
  return jax.tree_util.tree_map_with_path(decayed, params)


class AdamMomentsState(NamedTuple):
  mu: Any
  nu: Any


def scale_by_adam_without_bias_correction(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """u = m / (sqrt(v) + eps) with m, v the raw exponential moving averages (the original's Adam/LAMB)."""
  def init(params):
    return AdamMomentsState(mu=jax.tree.map(jnp.zeros_like, params), nu=jax.tree.map(jnp.zeros_like, params))

  def update(grads, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, grads)
    updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return updates, AdamMomentsState(mu, nu)

  return optax.GradientTransformation(init, update)


def create_optimizer(train_config) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimizer chain named by `train.optimizer`, with global-norm clipping first (as the original)."""
  t = train_config
  if t.optimizer not in OPTIMIZERS:
    raise InputError(f"train.optimizer={t.optimizer!r}; choose one of {OPTIMIZERS}.")
  schedule = learning_rate_schedule(t.learning_rate, t.warmup_steps, t.num_train_steps, t.poly_power)
  clip = [optax.clip_by_global_norm(t.clip_grad_norm)] if t.clip_grad_norm > 0 else []
  if t.optimizer == "optax_lamb":  # bias-corrected moments, trust ratio on every leaf
    return optax.chain(*clip, optax.lamb(schedule, t.b1, t.b2, t.eps, weight_decay=t.weight_decay,
                                         mask=decay_mask)), schedule
  chain = [scale_by_adam_without_bias_correction(t.b1, t.b2, t.eps),
           optax.add_decayed_weights(t.weight_decay, mask=decay_mask)]
  if t.optimizer == "lamb":
    chain.append(optax.masked(optax.scale_by_trust_ratio(), decay_mask))
  return optax.chain(*clip, *chain, optax.scale_by_learning_rate(schedule)), schedule
