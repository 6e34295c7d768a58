"""LayerNorm, GELU and the attention softmax with backward passes written out, so that each keeps for the backward
one array per call (its input, or its output) as fused kernels do.

Autodiff of the plain jnp code keeps whatever its backward formulas touch: LayerNorm three float32 [B, T, H]
arrays, the tanh GELU four [B, T, 4H] intermediates beside its input, the masked softmax the masked logits in
float32 beside its output and a [B, heads, T, S] boolean mask. Under `nn.scan` every one of them is stacked per
layer. Here the same functions keep the input (LayerNorm: plus a float32 mean and 1/std per token), the input, and
the output: per token and layer, ALBERT-large at seq 512 in bfloat16 compiled for a TPU v4 holds 47.8 KiB instead
of 132.0 (`python -m bench.saved_activations`). The forward values are the plain code's; the gradients are the
same functions' to float32 rounding (tests/test_ops.py).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# The masked logits' value: jax.nn.dot_product_attention's (finite, so a row with no key left is uniform, not NaN).
MASKED_LOGIT = -0.7 * float(np.finfo(np.float32).max)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def layer_norm(x: Array, scale: Array, bias: Array, eps: float, dtype) -> Array:
  """LayerNorm over the last axis computed in float32 (scale, bias: float32 [H]); the result cast to `dtype`."""
  return _layer_norm_fwd(x, scale, bias, eps, dtype)[0]


def _layer_norm_fwd(x, scale, bias, eps, dtype):
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  rstd = jax.lax.rsqrt(jnp.square(x32 - mean).mean(-1, keepdims=True) + eps)
  y = (x32 - mean) * rstd * scale + bias
  return y.astype(dtype), (x, mean, rstd, scale)


def _layer_norm_bwd(eps, dtype, residuals, dy):
  del eps, dtype
  x, mean, rstd, scale = residuals
  normalized = (x.astype(jnp.float32) - mean) * rstd
  dy = dy.astype(jnp.float32)
  over_tokens = tuple(range(x.ndim - 1))
  d_normalized = dy * scale
  dx = rstd * (d_normalized - d_normalized.mean(-1, keepdims=True)
               - normalized * (d_normalized * normalized).mean(-1, keepdims=True))
  return dx.astype(x.dtype), (dy * normalized).sum(over_tokens), dy.sum(over_tokens)


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def _keeping_the_input(function, derivative):
  """`function` (elementwise) whose backward is dy * derivative(x), computed in float32 from the input alone."""
  @jax.custom_vjp
  def op(x: Array) -> Array:
    return function(x)

  op.defvjp(lambda x: (function(x), x),
            lambda x, dy: ((dy.astype(jnp.float32) * derivative(x.astype(jnp.float32))).astype(x.dtype),))
  return op


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _gelu_tanh_derivative(x: Array) -> Array:
  inner = _SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)
  t = jnp.tanh(inner)
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)


def _gelu_erf_derivative(x: Array) -> Array:
  return 0.5 * (1 + jax.lax.erf(x / math.sqrt(2))) + x * jnp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


gelu_tanh = _keeping_the_input(functools.partial(jax.nn.gelu, approximate=True), _gelu_tanh_derivative)
gelu_erf = _keeping_the_input(functools.partial(jax.nn.gelu, approximate=False), _gelu_erf_derivative)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def masked_softmax(logits: Array, mask: Array, dtype) -> Array:
  """softmax over the last axis of float32 `logits` where `mask` (bool, broadcastable) holds, 0 elsewhere; the
  probabilities cast to `dtype`, which is also what the backward keeps (the probabilities times values product
  keeps that array anyway)."""
  return _masked_softmax_fwd(logits, mask, dtype)[0]


def _masked_softmax_fwd(logits, mask, dtype):
  probs = jax.nn.softmax(jnp.where(mask, logits, MASKED_LOGIT), axis=-1).astype(dtype)
  return probs, (probs, mask)


def _masked_softmax_bwd(dtype, residuals, d_probs):
  del dtype
  probs, mask = residuals  # the mask as given ([B, 1, 1, S] in the model): a row with no key sends nothing back
  probs, d_probs = probs.astype(jnp.float32), d_probs.astype(jnp.float32)
  return jnp.where(mask, probs * (d_probs - (probs * d_probs).sum(-1, keepdims=True)), 0), None


masked_softmax.defvjp(_masked_softmax_fwd, _masked_softmax_bwd)
