"""Optimizers and schedule, after google-research/albert `optimization.py` and `lamb_optimizer.py`.

The original LAMB and AdamW use Adam moments WITHOUT bias correction and skip weight decay (and, for LAMB, the
trust ratio) for LayerNorm parameters and biases; optax's `scale_by_adam` always bias-corrects, so the faithful
moments are a small transformation here. The learning rate warms up linearly, then decays polynomially from step 0
(so it drops from lr to lr·(1 - W/T) at the end of warmup, as the original; `optax.join_schedules` would not).
`train.adam_bias_correction` swaps AdamW's moments for optax's `adamw`, whose moments are bias-corrected (as torch's
AdamW). `train.layerwise_lr_decay` scales each update by its layer's factor after all of that (ELECTRA's fine-tuning,
google-research/electra `optimization.py`: the clipping, weight decay and schedule are those of every parameter), and
a job's own factors (`engine.Job.update_factors`: ELECTRA's generator rate) come last.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

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


BACKBONE = "albert"  # the encoder's top-level name in every model's parameter tree (model.py, tasks/heads.py)
# The backbone's parts below the first layer: depth 0.
INPUT_PARTS = ("embeddings", "embedding_hidden_mapping_in")
LAYER_PREFIX = "group_"  # with sharing="none", group_<l> holds layer l's own weights alone


def layer_depth(names: Sequence[str], num_layers: int) -> int:
  """ELECTRA's `_get_layer_lrs` depth of the parameter at `names`: the embeddings and the E->H projection at 0,
  layer l at l + 1, anything above the encoder (the task head, and the pooler, which ELECTRA has not) at L + 2."""
  above_encoder = num_layers + 2
  if names[0] != BACKBONE:
    return above_encoder
  part = names[2] if names[1] == "encoder" else names[1]
  if part in INPUT_PARTS:
    return 0
  if part.startswith(LAYER_PREFIX):
    return int(part.removeprefix(LAYER_PREFIX)) + 1
  return above_encoder


def layerwise_factors(params: Any, decay: float, num_layers: int) -> Any:
  """The tree of each parameter's learning-rate factor, decay^(L + 2 - depth) (`layer_depth`)."""
  def factor(path, _):
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    return decay ** (num_layers + 2 - layer_depth(names, num_layers))
  return jax.tree_util.tree_map_with_path(factor, params)


def scale_by_factors(factors_of: Callable[[Any], Any]) -> optax.GradientTransformation:
  """Each update times its parameter's factor in `factors_of(updates)`, a tree of Python floats that the tree's
  names fix (no state)."""
  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, f: u * f, updates, factors_of(updates)), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def layerwise_decay(train_config, model_config) -> list[optax.GradientTransformation]:
  """`train.layerwise_lr_decay`'s transform (none when it is 0); refused where layers share their weights."""
  decay = train_config.get("layerwise_lr_decay", 0.0)
  if not decay:
    return []
  if not 0 < decay <= 1:
    raise InputError(f"train.layerwise_lr_decay={decay} must be in (0, 1] (ELECTRA: 0.8 small and base, 0.9 large); "
                     "0 turns it off.")
  if model_config.sharing != "none":
    raise InputError(f"train.layerwise_lr_decay={decay} needs layers with their own weights, but model.sharing="
                     f"{model_config.sharing!r} shares them across layers; set train.layerwise_lr_decay=0.")
  return [scale_by_factors(lambda tree: layerwise_factors(tree, decay, model_config.num_hidden_layers))]


def bias_corrected(train_config) -> bool:
  """`train.adam_bias_correction`, refused for an optimizer it does not apply to."""
  corrected = train_config.get("adam_bias_correction", False)
  if corrected and train_config.optimizer != "adamw":
    raise InputError(f"train.adam_bias_correction=True applies to train.optimizer='adamw' only, not "
                     f"{train_config.optimizer!r} (optax_lamb's moments are corrected, lamb's are not); set "
                     "train.adam_bias_correction=False.")
  return corrected


def create_optimizer(train_config, model_config=None, update_factors: Callable[[Any], Any] | None = None
                     ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimizer chain named by `train.optimizer`, with global-norm clipping first (as the original), then
  `train.layerwise_lr_decay`'s per-layer factors, which read `model_config`'s layers and sharing, then
  `update_factors` (params -> a tree of factors; None: none)."""
  t = train_config
  if t.optimizer not in OPTIMIZERS:
    raise InputError(f"train.optimizer={t.optimizer!r}; choose one of {OPTIMIZERS}.")
  schedule = learning_rate_schedule(t.learning_rate, t.warmup_steps, t.num_train_steps, t.poly_power)
  clip = [optax.clip_by_global_norm(t.clip_grad_norm)] if t.clip_grad_norm > 0 else []
  after = [*layerwise_decay(t, model_config), *([scale_by_factors(update_factors)] if update_factors else [])]
  corrected = bias_corrected(t)
  if t.optimizer == "optax_lamb":  # bias-corrected moments, trust ratio on every leaf
    return optax.chain(*clip, optax.lamb(schedule, t.b1, t.b2, t.eps, weight_decay=t.weight_decay,
                                         mask=decay_mask), *after), schedule
  if corrected:
    return optax.chain(*clip, optax.adamw(schedule, t.b1, t.b2, t.eps, weight_decay=t.weight_decay,
                                          mask=decay_mask), *after), schedule
  chain = [scale_by_adam_without_bias_correction(t.b1, t.b2, t.eps),
           optax.add_decayed_weights(t.weight_decay, mask=decay_mask)]
  if t.optimizer == "lamb":
    chain.append(optax.masked(optax.scale_by_trust_ratio(), decay_mask))
  return optax.chain(*clip, *chain, optax.scale_by_learning_rate(schedule), *after), schedule
