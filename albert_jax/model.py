"""The ALBERT/BERT encoder and its pretraining heads, as Flax linen modules.

Follows google-research/albert `modeling.py` (post-LN layer, factorised embedding, group/inner-group sharing) with
the encoder written as `nn.scan` over ONE shared layer (params broadcast, not stacked), after the Flax `nn.scan`
docstring and big_vision `models/vit.py`. Every parameter carries logical axis names for `sharding.py`.

Parameter tree (the same for the scan and the Python-loop paths):
  albert/embeddings/{word_embeddings,position_embeddings,token_type_embeddings}/embedding, LayerNorm
  albert/encoder/embedding_hidden_mapping_in            (only when E != H, or `embedding_projection=True`)
  albert/encoder/group_{g}/inner_{i}/attention/{query,key,value,dense,LayerNorm}
  albert/encoder/group_{g}/inner_{i}/ffn/{intermediate,output,LayerNorm}
  albert/pooler
  predictions/{dense,LayerNorm,bias}                     (decoder tied to the word embeddings)
  sop_classifier                                          (kernel [H, 2])
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import flax.linen as nn

from albert_jax import ops
from albert_jax.errors import InputError
from albert_jax.model_config import ModelConfig

Array = jax.Array


def _init(c: ModelConfig, axes: Sequence[str | None]):
  # The original's truncated_normal(0.02): 0.02 is the untruncated sigma, cut at +-2 sigma (jax has the same rule).
  return nn.with_logical_partitioning(jax.nn.initializers.truncated_normal(c.initializer_range), tuple(axes))


def flat_dot_general(x: Array, kernel: Array, dimension_numbers, precision=None,
                     preferred_element_type=None) -> Array:
  """`nn.Dense`'s product x [..., K] · kernel [K, N], computed with the leading axes of x flattened into one.

  The same numbers. Autodiff then writes the kernel's gradient as one matmul contracting the tokens of x and of
  the output gradient dy; from a [B, T, K] product XLA's CPU backend first copies every dy [B, T, N] into a
  transposed layout (`model.flat_matmuls`).
  """
  if dimension_numbers != (((x.ndim - 1,), (0,)), ((), ())):
    raise InputError(f"flat_dot_general computes x[..., K] · kernel[K, N] only, got {dimension_numbers}")
  return over_flat_tokens(lambda flat: jax.lax.dot_general(
      flat, kernel, (((1,), (0,)), ((), ())), precision=precision, preferred_element_type=preferred_element_type), x)


def flat_matmuls(c: ModelConfig) -> bool:
  """`c.flat_matmuls`, with None decided by the backend the step is traced for: a gain on CPU only."""
  return c.flat_matmuls if c.flat_matmuls is not None else jax.default_backend() == "cpu"


def scan_unroll(c: ModelConfig) -> int:
  """`c.scan_unroll`, with None decided by the backend the step is traced for: every layer on a GPU, where the
  scan's while loop costs its stacked residuals' copies and slices (H200, bench/results/*_h200.json), 1 elsewhere
  (one compiled layer: TPU compiles and memory as measured)."""
  if c.scan_unroll is not None:
    return c.scan_unroll
  return c.num_hidden_layers if jax.default_backend() == "gpu" else 1


def fused_qkv(c: ModelConfig) -> bool:
  """`c.fused_qkv`, with None decided by the backend the step is traced for: one query/key/value product on a GPU
  (compiled for one, ALBERT-large's nine [H, H] products a layer become three 3H-wide ones) and the CPU (the same
  speed), three on a TPU, where the one product costs memory and time (ALBERT-base on v3-128 compiled: 9.30 against
  8.80 GB a core, a step bound of 0.249 against 0.245 s; docs/performance.md "One query/key/value product")."""
  return c.fused_qkv if c.fused_qkv is not None else jax.default_backend() != "tpu"


def attention_implementation(c: ModelConfig, length: int) -> str:
  """`c.attention_implementation`, with "auto" decided by the backend the step is traced for: cuDNN's fused kernel
  on a GPU in half precision (H100, ALBERT-base seq 512 batch 32: 1.28x the step, 11.7 instead of 19.0 GiB) where it
  takes the shapes (head size a multiple of 8 up to 128, an even length for its masked backward) and no dropout of
  the probabilities is asked for, XLA's elsewhere."""
  if c.attention_implementation != "auto":
    return c.attention_implementation
  fits = (c.dtype in ("bfloat16", "float16") and c.head_dim % 8 == 0 and c.head_dim <= 128 and length % 2 == 0
          and c.attention_probs_dropout_prob == 0)
  return "cudnn" if fits and jax.default_backend() == "gpu" else "xla"


def over_flat_tokens(product: Callable[[Array], Array], x: Array) -> Array:
  """product(x [..., K] reshaped to [tokens, K] -> [tokens, N]), reshaped back to [..., N]."""
  return product(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)


def dense(c: ModelConfig, features: int, axes: tuple[str | None, str | None], name: str | None = None) -> nn.Dense:
  return nn.Dense(features, dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.param_dtype),
                  kernel_init=_init(c, axes), dot_general=flat_dot_general if flat_matmuls(c) else None,
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (axes[1],)), name=name)


class LayerNorm(nn.Module):
  """LayerNorm computed in float32 whatever the compute dtype, cast back to it (params `scale`, `bias`)."""
  config: ModelConfig
  axis: str = "embed"

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = self.config
    param = lambda name, init: self.param(name, nn.with_logical_partitioning(init, (self.axis,)), (x.shape[-1],),
                                          jnp.dtype(c.param_dtype)).astype(jnp.float32)
    scale, bias = param("scale", nn.initializers.ones_init()), param("bias", nn.initializers.zeros_init())
    return ops.layer_norm(x, scale, bias, c.layer_norm_eps, jnp.dtype(c.dtype))


def activation(name: str) -> Callable[[Array], Array]:
  return {"gelu_new": ops.gelu_tanh, "gelu": ops.gelu_erf, "relu": jax.nn.relu, "tanh": jnp.tanh}[name]


class Embeddings(nn.Module):
  """word + position + token type embeddings (size E) -> LayerNorm -> dropout."""
  config: ModelConfig

  def setup(self):
    c = self.config
    embed = functools.partial(nn.Embed, dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.param_dtype))
    self.word_embeddings = embed(c.vocab_size, c.embedding_size, embedding_init=_init(c, ("vocab", "emb")))
    self.position_embeddings = embed(c.max_position_embeddings, c.embedding_size,
                                     embedding_init=_init(c, ("positions", "emb")))
    self.token_type_embeddings = embed(c.type_vocab_size, c.embedding_size,
                                       embedding_init=_init(c, ("token_types", "emb")))
    self.LayerNorm = LayerNorm(c, axis="emb")
    self.dropout = nn.Dropout(c.hidden_dropout_prob)

  def __call__(self, input_ids: Array, token_type_ids: Array, deterministic: bool) -> Array:
    seq_len, c = input_ids.shape[1], self.config
    if seq_len > c.positions:
      raise InputError(f"Sequence length {seq_len} exceeds {c.positions_said}; shorten max_seq_length or use a "
                       "model with more positions.")
    # Summed in float32, which LayerNorm computes in anyway. Positions are a slice of their table and token types
    # a one-hot product (the original's form), so their gradients are a reduction and a matmul: as gathers, their
    # backward would be a scatter-add of every token into 512 and 2 rows, in bfloat16 under bfloat16 compute. On an
    # H100 that scatter into the 2 token-type rows alone takes 146 of the 196 ms of ALBERT-base's step at batch
    # 128 x 128, and sums 16k gradients in bfloat16 (docs/profiling.md "GPU").
    table = lambda embed: jnp.asarray(embed.embedding, jnp.float32)
    token_types = jax.nn.one_hot(token_type_ids, self.config.type_vocab_size, dtype=jnp.float32)
    positions = table(self.position_embeddings)[None, c.position_offset:c.position_offset + seq_len]
    x = (jnp.take(table(self.word_embeddings), input_ids, axis=0) + positions
         + over_flat_tokens(lambda t: jnp.dot(t, table(self.token_type_embeddings),
                                              precision=jax.lax.Precision.HIGHEST), token_types))
    return self.dropout(self.LayerNorm(x), deterministic=deterministic)

  def attend(self, x: Array) -> Array:
    """x @ word_embeddings^T: the MLM decoder tied to the input embedding."""
    if not flat_matmuls(self.config):
      return self.word_embeddings.attend(x)
    return over_flat_tokens(self.word_embeddings.attend, x)


class DenseParameters(nn.Module):
  """`nn.Dense`'s parameters alone (`kernel` [K, N], `bias` [N]: its names, shapes, initialisers and random
  streams), for a product that computes several dense layers at once."""
  config: ModelConfig
  features: int
  axes: tuple[str | None, str | None]

  @nn.compact
  def __call__(self, in_features: int) -> tuple[Array, Array]:
    c = self.config
    kernel = self.param("kernel", _init(c, self.axes), (in_features, self.features), jnp.dtype(c.param_dtype))
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), (self.axes[1],)),
                      (self.features,), jnp.dtype(c.param_dtype))
    return kernel, bias


def fused_qkv_heads(c: ModelConfig, x: Array, parameters: Sequence[tuple[Array, Array]]) -> list[Array]:
  """The query, key and value heads [B, T, heads, head_dim] of x [B, T, H] as ONE product with the three kernels
  stacked into [H, 3, H]: the shape class of the FFN's products, which an H200 ran at 365-416 TFLOP/s where the
  [H, H] ones ran at 221-227 (ALBERT-large, each alone). Stacked on a new middle axis, not concatenated, so that
  each kernel's last axis keeps its sharding ("qkv")."""
  kernel = jnp.stack([k for k, _ in parameters], axis=1)
  bias = jnp.stack([b for _, b in parameters])
  x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=jnp.dtype(c.dtype))
  if flat_matmuls(c):   # 2-D products throughout, the input gradient's too (model.flat_dot_general)
    y = flat_dot_general(x, kernel.reshape(kernel.shape[0], -1), (((x.ndim - 1,), (0,)), ((), ())))
  else:
    y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
  y = y.reshape(*x.shape[:-1], 3, c.hidden_size) + bias
  y = y.reshape(*x.shape[:-1], 3, c.num_attention_heads, c.head_dim)
  return [y[..., i, :, :] for i in range(3)]


class SelfAttention(nn.Module):
  """Post-LN multi-head self-attention block: LayerNorm(x + dropout(W_o · attention(x)))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
    c = self.config
    batch, length, _ = x.shape
    if fused_qkv(c):
      q, k, v = fused_qkv_heads(c, x, [DenseParameters(c, c.hidden_size, ("embed", "qkv"), name=name)(x.shape[-1])
                                       for name in ("query", "key", "value")])
    else:
      heads = lambda name: dense(c, c.hidden_size, ("embed", "qkv"), name)(x).reshape(
          batch, length, c.num_attention_heads, c.head_dim)
      q, k, v = heads("query"), heads("key"), heads("value")
    if attention_implementation(c, length) == "cudnn":  # cuDNN takes the mask as an additive bias of [T, S] blocks
      mask = jnp.broadcast_to(mask, (batch, 1, length, mask.shape[-1]))
      out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="cudnn")
    else:  # XLA's einsums, with a softmax whose backward keeps only the probabilities it returns (albert_jax.ops)
      logits = jnp.einsum("bqnd,bknd->bnqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(c.head_dim)
      probs = ops.masked_softmax(logits, mask, v.dtype)
      if c.attention_probs_dropout_prob > 0:
        probs = nn.Dropout(c.attention_probs_dropout_prob)(probs, deterministic=deterministic)
      out = jnp.einsum("bnqk,bknd->bqnd", probs, v)
    out = dense(c, c.hidden_size, ("qkv", "embed"), "dense")(out.reshape(batch, length, c.hidden_size))
    out = nn.Dropout(c.hidden_dropout_prob)(out, deterministic=deterministic)
    return LayerNorm(c, name="LayerNorm")(x + out)


class FeedForward(nn.Module):
  """Post-LN feed-forward block: LayerNorm(x + dropout(W_2 · act(W_1 · x)))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    c = self.config
    h = activation(c.hidden_act)(dense(c, c.intermediate_size, ("embed", "mlp"), "intermediate")(x))
    h = dense(c, c.hidden_size, ("mlp", "embed"), "output")(h)
    h = nn.Dropout(c.hidden_dropout_prob)(h, deterministic=deterministic)
    return LayerNorm(c, name="LayerNorm")(x + h)


class TransformerLayer(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
    x = SelfAttention(self.config, name="attention")(x, mask, deterministic)
    return FeedForward(self.config, name="ffn")(x, deterministic)


class LayerGroup(nn.Module):
  """One application of a hidden group: `inner_group_num` distinct layers in sequence (the original's group)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool):
    x = nn.with_logical_constraint(x, ("act_batch", "act_len", "act_embed"))
    for i in range(self.config.inner_group_num):
      x = TransformerLayer(self.config, name=f"inner_{i}")(x, mask, deterministic)
    return x, None  # (carry, per-step output) for nn.scan


def layers_per_group(num_layers: int, num_groups: int) -> list[int]:
  """How many consecutive layer applications each group gets: layer l uses group floor(l * G / L).

  The original writes `int(l / L * G)`; its float rounding skips a group for some (L, G) (L=22, G=22 runs group 14
  twice and group 15 never), so the floor is taken in exact integer arithmetic. Equal for every G=1 config.
  """
  counts = [0] * num_groups
  for layer in range(num_layers):
    counts[layer * num_groups // num_layers] += 1
  return counts


def remat_policy(name: str):
  return None if name == "full" else getattr(jax.checkpoint_policies, name)


class Encoder(nn.Module):
  """E->H projection, then L layer applications with cross-layer parameter sharing."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
    c = self.config
    if c.has_embedding_projection:
      x = dense(c, c.hidden_size, ("emb", "embed"), "embedding_hidden_mapping_in")(x)
    if c.sharing in ("attention", "ffn"):
      return self._partially_shared(x, mask, deterministic)
    # "none" (BERT) is the original's grouping with one group per layer: no layer parameters are stacked, so
    # LAMB's trust ratio stays per layer.
    num_groups = c.num_hidden_layers if c.sharing == "none" else c.num_hidden_groups
    block = LayerGroup
    if c.remat_policy != "none":
      block = nn.remat(block, prevent_cse=not c.scan_layers, policy=remat_policy(c.remat_policy),
                       static_argnums=(3,))
    for g, count in enumerate(layers_per_group(c.num_hidden_layers, num_groups)):
      if c.scan_layers:
        scanned = nn.scan(block, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                          in_axes=(nn.broadcast, nn.broadcast), length=count,
                          unroll=min(scan_unroll(c), count))
        x, _ = scanned(c, name=f"group_{g}")(x, mask, deterministic)
      else:  # Python loop (debugging): the same module called `count` times, so the same parameters.
        group = block(c, name=f"group_{g}")
        for _ in range(count):
          x, _ = group(x, mask, deterministic)
    return x

  def _partially_shared(self, x: Array, mask: Array, deterministic: bool) -> Array:
    """The paper's sharing ablation: one shared sub-block and one per-layer sub-block (Python loop)."""
    c = self.config
    shared_attention = SelfAttention(c, name="attention") if c.sharing == "attention" else None
    shared_ffn = FeedForward(c, name="ffn") if c.sharing == "ffn" else None
    for layer in range(c.num_hidden_layers):
      attention = shared_attention or SelfAttention(c, name=f"attention_{layer}")
      ffn = shared_ffn or FeedForward(c, name=f"ffn_{layer}")
      x = ffn(attention(x, mask, deterministic), deterministic)
    return x


class AlbertModel(nn.Module):
  """The backbone: embeddings, encoder and pooler. Returns (sequence_output [B,S,H], pooled_output [B,H])."""
  config: ModelConfig

  def setup(self):
    self.embeddings = Embeddings(self.config)
    self.encoder = Encoder(self.config)
    self.pooler = dense(self.config, self.config.hidden_size, ("embed", "qkv"))

  def __call__(self, input_ids: Array, attention_mask: Array | None = None, token_type_ids: Array | None = None,
               deterministic: bool = True) -> tuple[Array, Array]:
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    x = self.embeddings(input_ids, token_type_ids, deterministic)
    # Padding mask on keys only, broadcast over heads and queries: [B, 1, 1, S].
    x = self.encoder(x, attention_mask[:, None, None, :].astype(bool), deterministic)
    return x, jnp.tanh(self.pooler(x[:, 0]))

  def attend(self, x: Array) -> Array:
    return self.embeddings.attend(x)


class MaskedLMHead(nn.Module):
  """dense H->E, activation, LayerNorm(E), then the tied decoder plus an output bias."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, decoder: Callable[[Array], Array]) -> Array:
    c = self.config
    x = activation(c.hidden_act)(dense(c, c.embedding_size, ("embed", "emb"), "dense")(x))
    x = LayerNorm(c, axis="emb", name="LayerNorm")(x)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
                      (c.vocab_size,), jnp.dtype(c.param_dtype))
    return decoder(x).astype(jnp.float32) + bias.astype(jnp.float32)


def gather_positions(sequence: Array, positions: Array) -> Array:
  """[B,S,H] at [B,M] positions -> [B,M,H]."""
  return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


class AlbertForPreTraining(nn.Module):
  """Backbone + MLM head (only at `masked_lm_positions` when given) + the 2-way SOP/NSP head."""
  config: ModelConfig

  def setup(self):
    self.albert = AlbertModel(self.config)
    self.predictions = MaskedLMHead(self.config)
    self.sop_classifier = dense(self.config, 2, ("embed", "classes"))

  def __call__(self, input_ids: Array, attention_mask: Array | None = None, token_type_ids: Array | None = None,
               masked_lm_positions: Array | None = None, deterministic: bool = True) -> dict[str, Array]:
    sequence, pooled = self.albert(input_ids, attention_mask, token_type_ids, deterministic)
    if masked_lm_positions is not None:
      sequence = gather_positions(sequence, masked_lm_positions)
    return {"mlm_logits": self.predictions(sequence, self.albert.attend),
            "sop_logits": self.sop_classifier(pooled).astype(jnp.float32)}


def dummy_inputs(batch: int = 1, seq_len: int = 8) -> dict[str, Array]:
  ids = jnp.ones((batch, seq_len), jnp.int32)
  return {"input_ids": ids, "attention_mask": ids, "token_type_ids": jnp.zeros_like(ids)}


def init_params(module: nn.Module, rng: Array, seq_len: int = 8) -> Any:
  """Initialised (boxed, logically annotated) parameters for any of the models here."""
  return module.init(rng, **dummy_inputs(1, min(seq_len, module.config.max_position_embeddings)))["params"]


def abstract_params(module: nn.Module) -> Any:
  """Shapes and dtypes of the parameters, without allocating them."""
  return jax.eval_shape(lambda rng: init_params(module, rng), jax.random.key(0))


def count_params(params: Any) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(nn.unbox(params)))
