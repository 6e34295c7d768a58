"""Fine-tuning models: the ALBERT backbone (always the submodule "albert", so pretrained weights map by name)
plus a freshly initialised head. Heads follow google-research/albert `classifier_utils.py`, `squad_utils.py`
and `race_utils.py`; logits are float32 whatever the compute dtype. What a trained head was trained for, and the
transformers class it exports as, is `head_identity`'s.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax.model import AlbertModel, LayerNorm, dense
from albert_jax.model_config import ModelConfig


class PooledClassifier(nn.Module):
  """pooled [CLS] -> dropout -> dense(num_outputs): GLUE classes, the STS-B score (1 output), or one RACE option
  score (1 output). Leading dimensions of the inputs (RACE's [B, 4, S]) fold into the batch and come back."""
  config: ModelConfig
  num_outputs: int
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, token_type_ids: jax.Array,
               deterministic: bool = True) -> jax.Array:
    return folded_scores(self.config, self.num_outputs, (input_ids, attention_mask, token_type_ids), deterministic,
                         lambda _, pooled: nn.Dropout(self.dropout_rate)(pooled, deterministic=deterministic))


def folded_scores(config: ModelConfig, num_outputs: int, inputs: tuple[jax.Array, jax.Array, jax.Array],
                  deterministic: bool, features) -> jax.Array:
  """Scores of a multiple-choice-shaped scorer, called inside its `nn.compact` method: the leading dimensions of
  `inputs` (ids, mask, token types; RACE's [B, options, S]) fold into the batch of the backbone ("albert"),
  `features(sequence, pooled)` picks what `classifier` (dense(num_outputs)) scores, and the float32 scores come back
  as [..., num_outputs], so the options of one question are scored by one backbone call."""
  lead, length = inputs[0].shape[:-1], inputs[0].shape[-1]
  sequence, pooled = AlbertModel(config, name="albert")(*(x.reshape(-1, length) for x in inputs), deterministic)
  logits = dense(config, num_outputs, ("embed", "classes"), "classifier")(features(sequence, pooled))
  return logits.astype(jnp.float32).reshape(*lead, num_outputs)


class SpanExtractor(nn.Module):
  """dense(2) on every token -> (start_logits, end_logits) [B, S] (the original's `cls/squad` head, v1).
  For SQuAD v2 the same head scores "no answer" as the span ([CLS], [CLS]); see `squad.py`."""
  config: ModelConfig

  @nn.compact
  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, token_type_ids: jax.Array,
               deterministic: bool = True) -> tuple[jax.Array, jax.Array]:
    sequence, _ = AlbertModel(self.config, name="albert")(input_ids, attention_mask, token_type_ids, deterministic)
    logits = dense(self.config, 2, ("embed", "classes"), "qa_outputs")(sequence).astype(jnp.float32)
    return logits[..., 0], logits[..., 1]


_MASKED = -1e30  # the original's p_mask value: exp() of it is 0 in float32, and it stays finite


def answer_positions(attention_mask: jax.Array, token_type_ids: jax.Array) -> jax.Array:
  """[B, S] bool: where a span may start or end under the answer-class head: [CLS] (the null span) and the context,
  i.e. not the question, the [SEP]s or padding (the original's p_mask, derived from `tasks.base.pack`'s layout)."""
  position = jnp.arange(attention_mask.shape[-1])
  last_sep = attention_mask.sum(-1, keepdims=True) - 1
  return (position == 0) | ((token_type_ids == 1) & (position < last_sep))


class _EndLogits(nn.Module):
  """End logits given a start token: [h_end; h_start] -> dense(H) tanh -> LayerNorm -> dense(1), for every end
  token and each of K starts ([B, S, H], [B, K, H] -> [B, K, S])."""
  config: ModelConfig

  @nn.compact
  def __call__(self, sequence: jax.Array, start_hidden: jax.Array) -> jax.Array:
    c = self.config
    shape = (*start_hidden.shape[:2], *sequence.shape[1:])  # [B, K, S, H]
    pairs = jnp.concatenate([jnp.broadcast_to(sequence[:, None], shape),
                             jnp.broadcast_to(start_hidden[:, :, None], shape)], axis=-1)
    hidden = LayerNorm(c, name="LayerNorm")(jnp.tanh(dense(c, c.hidden_size, ("embed", "qkv"), "dense_0")(pairs)))
    return dense(c, 1, ("embed", "classes"), "dense_1")(hidden)[..., 0].astype(jnp.float32)


class _AnswerClass(nn.Module):
  """One "unanswerable" logit per row from [start-probability-weighted hidden; h_CLS]: dense(H) tanh -> dropout
  -> dense(1) without bias. It reads no end position, so each window gets a single score."""
  config: ModelConfig
  dropout_rate: float

  @nn.compact
  def __call__(self, sequence: jax.Array, start_probs: jax.Array, deterministic: bool) -> jax.Array:
    c = self.config
    weighted = jnp.einsum("bs,bsh->bh", start_probs.astype(sequence.dtype), sequence)
    hidden = jnp.tanh(dense(c, c.hidden_size, ("embed", "qkv"), "dense_0")(
        jnp.concatenate([weighted, sequence[:, 0]], axis=-1)))
    hidden = nn.Dropout(self.dropout_rate)(hidden, deterministic=deterministic)
    kernel_init = jax.nn.initializers.truncated_normal(c.initializer_range)  # as model.dense, without the bias
    out = nn.Dense(1, use_bias=False, dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.param_dtype),
                   kernel_init=nn.with_logical_partitioning(kernel_init, ("embed", "classes")), name="dense_1")(hidden)
    return out[..., 0].astype(jnp.float32)


class AnswerClassSpanHead(nn.Module):
  """SQuAD v2 as google-research/albert `run_squad_v2.py` (XLNet's head): start logits over [CLS] + context, end
  logits conditioned on a start token's hidden vector, and an answer-class logit (> 0: unanswerable).

  Training (`start_positions` given): the end logits are conditioned on the gold start (teacher forcing);
  returns (start_logits [B,S], end_logits [B,S], cls_logits [B]), masked outside `answer_positions`.
  Prediction: a beam of the top `start_n_top` starts by log-probability, each with its top `end_n_top` ends;
  returns {start_top_log_probs, start_top_index [B,K1], end_top_log_probs, end_top_index [B,K1,K2],
  cls_logits [B]}, so the host only combines windows (`tasks/squad_decode.py`)."""
  config: ModelConfig
  start_n_top: int = 5
  end_n_top: int = 5
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, token_type_ids: jax.Array,
               deterministic: bool = True, start_positions: jax.Array | None = None):
    c = self.config
    sequence, _ = AlbertModel(c, name="albert")(input_ids, attention_mask, token_type_ids, deterministic)
    valid = answer_positions(attention_mask, token_type_ids)
    start_logits = dense(c, 1, ("embed", "classes"), "start_logits")(sequence)[..., 0].astype(jnp.float32)
    start_logits = jnp.where(valid, start_logits, _MASKED)
    end_logits = _EndLogits(c, name="end_logits")
    cls_logits = _AnswerClass(c, self.dropout_rate, name="answer_class")(
        sequence, jax.nn.softmax(start_logits, axis=-1), deterministic)
    take = lambda positions: jnp.take_along_axis(sequence, positions[..., None], axis=1)  # [B,K] -> [B,K,H]
    if start_positions is not None:
      gold = jnp.where(valid, end_logits(sequence, take(start_positions[:, None]))[:, 0], _MASKED)
      return start_logits, gold, cls_logits
    start_top_log_probs, start_top_index = jax.lax.top_k(jax.nn.log_softmax(start_logits), self.start_n_top)
    end_log_probs = jax.nn.log_softmax(jnp.where(valid[:, None], end_logits(sequence, take(start_top_index)),
                                                 _MASKED))
    end_top_log_probs, end_top_index = jax.lax.top_k(end_log_probs, self.end_n_top)
    return {"start_top_log_probs": start_top_log_probs, "start_top_index": start_top_index,
            "end_top_log_probs": end_top_log_probs, "end_top_index": end_top_index, "cls_logits": cls_logits}


class TokenClassifier(nn.Module):
  """Every token's vector -> dropout -> dense(num_labels) (transformers' AlbertForTokenClassification)."""
  config: ModelConfig
  num_labels: int
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, token_type_ids: jax.Array,
               deterministic: bool = True) -> jax.Array:
    sequence, _ = AlbertModel(self.config, name="albert")(input_ids, attention_mask, token_type_ids, deterministic)
    sequence = nn.Dropout(self.dropout_rate)(sequence, deterministic=deterministic)
    return dense(self.config, self.num_labels, ("embed", "classes"), "classifier")(sequence).astype(jnp.float32)
