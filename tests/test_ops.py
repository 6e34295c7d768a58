"""albert_jax.ops: the same values and gradients as autodiff of the plain code, and one saved array per op."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax import ops
from albert_jax.model import AlbertForPreTraining, init_params
from albert_jax.model_config import model_config_for
from bench.saved_activations import saved_bytes_per_token
from tests.helpers import TINY_MODEL as TINY, model_batch as batch


def plain_layer_norm(x, scale, bias, eps, dtype):
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  var = jnp.square(x32 - mean).mean(-1, keepdims=True)
  return ((x32 - mean) * jax.lax.rsqrt(var + eps) * scale + bias).astype(dtype)


def plain_masked_softmax(logits, mask, dtype):
  with jax.softmax_custom_jvp(False):  # jax's rule: differentiate exp / sum
    return jax.nn.softmax(jnp.where(mask, logits, ops.MASKED_LOGIT), axis=-1).astype(dtype)


PLAIN = {"layer_norm": plain_layer_norm, "masked_softmax": plain_masked_softmax,
         "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True), "gelu_erf": lambda x: jax.nn.gelu(x, approximate=False)}


def test_layer_norm_values_and_gradients_are_the_plain_formulas():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(3.0, 2.0, (4, 5, 64)), jnp.float32)
  scale, bias = jnp.asarray(rng.normal(1, 0.3, 64), jnp.float32), jnp.asarray(rng.normal(0, 0.3, 64), jnp.float32)
  dy = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
  for dtype in (jnp.float32, jnp.bfloat16):
    xd = x.astype(dtype)
    np.testing.assert_array_equal(ops.layer_norm(xd, scale, bias, 1e-12, dtype),
                                  plain_layer_norm(xd, scale, bias, 1e-12, dtype))
  loss = lambda f: lambda x, s, b: (f(x, s, b, 1e-12, jnp.float32) * dy).sum()
  ours, reference = jax.grad(loss(ops.layer_norm), (0, 1, 2))(x, scale, bias), jax.grad(
      loss(plain_layer_norm), (0, 1, 2))(x, scale, bias)
  for a, b in zip(ours, reference):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
  dx = jax.grad(lambda x: ops.layer_norm(x, scale, bias, 1e-12, jnp.bfloat16).astype(jnp.float32).sum())(
      x.astype(jnp.bfloat16))
  assert dx.dtype == jnp.bfloat16


@pytest.mark.parametrize("name", ["gelu_tanh", "gelu_erf"])
def test_gelu_values_are_jaxs_and_the_derivative_is_exact(name):
  x = jnp.linspace(-8.0, 8.0, 4001, dtype=jnp.float32)
  op, plain = getattr(ops, name), PLAIN[name]
  for dtype in (jnp.float32, jnp.bfloat16):
    np.testing.assert_array_equal(op(x.astype(dtype)), plain(x.astype(dtype)))
  derivative = jax.vmap(jax.grad(op))(x)
  np.testing.assert_allclose(derivative, jax.vmap(jax.grad(plain))(x), rtol=1e-5, atol=1e-6)
  # In bfloat16 the derivative is computed in float32 from the input and rounded once: within half a bf16 step
  # of the float32 derivative at the same (bf16) input. Autodiff in bf16 rounds at every intermediate: 2-4x that.
  xb = x.astype(jnp.bfloat16)
  exact = np.asarray(jax.vmap(jax.grad(plain))(xb.astype(jnp.float32)))
  error = np.abs(np.asarray(jax.vmap(jax.grad(op))(xb), np.float32) - exact)
  step = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(exact), 1e-30))) - 7)
  assert np.all(error <= step / 2 + 1e-6)
  assert error.max() * 2 <= np.abs(np.asarray(jax.vmap(jax.grad(plain))(xb), np.float32) - exact).max()


def test_masked_softmax_values_gradients_and_a_row_with_no_key():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(0, 3, (2, 3, 5, 7)), jnp.float32)
  mask = jnp.asarray(rng.random((2, 1, 1, 7)) > 0.4).at[1].set(False)   # example 1: every key padded
  dy = jnp.asarray(rng.normal(size=logits.shape), jnp.float32)
  np.testing.assert_array_equal(ops.masked_softmax(logits, mask, jnp.float32),
                                plain_masked_softmax(logits, mask, jnp.float32))
  grad = lambda f: jax.grad(lambda l: (f(l, mask, jnp.float32) * dy).sum())(logits)
  ours = grad(ops.masked_softmax)
  np.testing.assert_allclose(ours, grad(plain_masked_softmax), rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(ours)[0][~np.broadcast_to(np.asarray(mask[0]), ours.shape[1:])] == 0)
  np.testing.assert_allclose(ops.masked_softmax(logits, mask, jnp.float32)[1], 1 / 7, rtol=1e-6)
  assert np.isfinite(np.asarray(ours)).all()


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1])
def test_the_model_gradient_is_autodiff_of_the_plain_code(monkeypatch, attention_dropout):
  config = TINY.replace(attention_probs_dropout_prob=attention_dropout, hidden_dropout_prob=0.1)
  params = nn.unbox(init_params(AlbertForPreTraining(config), jax.random.key(1)))
  loss = lambda p: AlbertForPreTraining(config).apply({"params": p}, **batch(), deterministic=False,
                                                      rngs={"dropout": jax.random.key(3)})["mlm_logits"].std()
  ours = jax.value_and_grad(loss)(params)
  for name, plain in PLAIN.items():
    monkeypatch.setattr(ops, name, plain)
  reference = jax.value_and_grad(loss)(params)
  np.testing.assert_allclose(ours[0], reference[0], rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), ours[1], reference[1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_layer_keeps_one_array_per_operation_for_its_backward(dtype):
  # q, k, v, the attention output and the FFN's input (H each), the LayerNorm inputs (H each, plus a float32 mean
  # and 1/std), the GELU's input and output (I each), the probabilities (heads x keys). The plain code kept 2.2x
  # (float32) and 2.5x (bfloat16) as much here: LayerNorm's float32 intermediates, GELU's tanh terms, the masked
  # logits in float32 and a [B, heads, T, S] boolean mask.
  config = model_config_for("tiny", dtype=dtype, flat_matmuls=False, attention_implementation="xla")
  H, I, N, S = config.hidden_size, config.intermediate_size, config.num_attention_heads, 16
  itemsize = jnp.dtype(dtype).itemsize
  assert saved_bytes_per_token(config, length=S) == itemsize * (7 * H + 2 * I + N * S) + 2 * 8
