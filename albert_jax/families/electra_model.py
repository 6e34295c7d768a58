"""ELECTRA's generator and discriminator (Clark et al., ICLR 2020) built from the project's encoder, and its
classification and multiple-choice heads.

Both towers are `model.Encoder`s over ONE embedding block (word, position and token-type tables, one array each, as
the released code shares them); the generator is narrower (hidden size, FFN and heads times `generator_fraction`),
with as many layers, and its MLM head is tied to the shared word embeddings. The discriminator with the shared
embeddings is exactly an `AlbertModel` (`albert/`), so fine-tuning loads it as any backbone.

Parameter tree (names chosen to map one to one onto transformers' ElectraForPreTraining / ElectraForMaskedLM):
  albert/embeddings/...                          shared: electra.embeddings of both Hugging Face models
  albert/encoder/...                             the discriminator (embedding_hidden_mapping_in where E != H)
  albert/pooler                                  AlbertModel's; the replaced-token objective leaves it untrained
  discriminator_predictions/{dense,dense_prediction}    H -> H, activation, H -> 1 per position
  generator/...                                  the generator's encoder (its own E -> H_g projection where E != H_g)
  generator_predictions/{dense,LayerNorm,bias}   the generator's MLM head, decoder tied to the word embeddings
A fine-tuned sequence classifier (`ElectraClassifier`) is {albert, classifier/{dense,out_proj}}, as transformers'
ElectraForSequenceClassification; a multiple-choice scorer (`ElectraMultipleChoice`) {albert,
sequence_summary/summary, classifier}, as its ElectraForMultipleChoice.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import flax.linen as nn

from albert_jax.errors import InputError
from albert_jax.model import AlbertModel, Encoder, MaskedLMHead, activation, dense, gather_positions
from albert_jax.model_config import ModelConfig
from albert_jax.tasks.heads import folded_scores

Array = jax.Array


def generator_config(c: ModelConfig, fraction: float) -> ModelConfig:
  """The discriminator's config `c` with hidden size, FFN size and heads times `fraction` (the paper's generator
  multiplier), each at least 1; layers, E, vocabulary and everything else as `c`'s."""
  if not 0 < fraction <= 1:
    raise InputError(f"electra.generator_fraction={fraction} must be in (0, 1]: the generator's width as a share "
                     "of the discriminator's (the paper: 1/4 for small and large, 1/3 for base).")
  scaled = lambda n: max(1, round(n * fraction))
  hidden, heads = scaled(c.hidden_size), scaled(c.num_attention_heads)
  if hidden % heads:
    raise InputError(f"electra.generator_fraction={fraction} gives the generator hidden size {hidden} and {heads} "
                     "heads, which do not divide it; choose a fraction that keeps H / heads whole (1/4, 1/3, 1/2).")
  return c.replace(hidden_size=hidden, intermediate_size=scaled(c.intermediate_size), num_attention_heads=heads)


class DiscriminatorHead(nn.Module):
  """dense H -> H, activation, dense H -> 1: one replaced-token logit per position (float32)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = self.config
    x = activation(c.hidden_act)(dense(c, c.hidden_size, ("embed", "mlp"), "dense")(x))
    return dense(c, 1, ("mlp", None), "dense_prediction")(x)[..., 0].astype(jnp.float32)


class ElectraForPreTraining(nn.Module):
  """The generator (MLM on the masked positions) and the discriminator (replaced or not, every position)."""
  config: ModelConfig          # the discriminator's
  generator_fraction: float = 0.25

  def setup(self):
    gen = generator_config(self.config, self.generator_fraction)
    self.albert = AlbertModel(self.config)
    self.discriminator_predictions = DiscriminatorHead(self.config)
    self.generator = Encoder(gen)
    self.generator_predictions = MaskedLMHead(gen)

  def generator_logits(self, input_ids: Array, attention_mask: Array, token_type_ids: Array,
                       masked_lm_positions: Array, deterministic: bool = True) -> Array:
    """[B, M, V] float32 logits of the generator at the masked positions of the (masked) input."""
    x = self.albert.embeddings(input_ids, token_type_ids, deterministic)
    x = self.generator(x, attention_mask[:, None, None, :].astype(bool), deterministic)
    return self.generator_predictions(gather_positions(x, masked_lm_positions), self.albert.attend)

  def discriminator_logits(self, input_ids: Array, attention_mask: Array, token_type_ids: Array,
                           deterministic: bool = True) -> Array:
    """[B, S] float32 logits that each token of the (corrupted) input was replaced."""
    sequence, _ = self.albert(input_ids, attention_mask, token_type_ids, deterministic)
    return self.discriminator_predictions(sequence)

  def __call__(self, input_ids: Array, attention_mask: Array | None = None, token_type_ids: Array | None = None,
               masked_lm_positions: Array | None = None, deterministic: bool = True) -> dict[str, Array]:
    """Both towers on the same input (initialisation and shapes; the loss feeds the discriminator the samples)."""
    attention_mask = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
    token_type_ids = jnp.zeros_like(input_ids) if token_type_ids is None else token_type_ids
    positions = jnp.zeros((input_ids.shape[0], 1), jnp.int32) if masked_lm_positions is None else masked_lm_positions
    return {"mlm_logits": self.generator_logits(input_ids, attention_mask, token_type_ids, positions, deterministic),
            "disc_logits": self.discriminator_logits(input_ids, attention_mask, token_type_ids, deterministic)}


def _activated_dense(c: ModelConfig, x: jax.Array, name: str, act: str, dropout_rate: float,
                     deterministic: bool) -> jax.Array:
  """dense(H) named `name` -> `act` -> dropout: what transformers' heads on the first token (ELECTRA's two with
  exact GELU, RoBERTa's classifier with tanh) compute before their output layer."""
  x = activation(act)(dense(c, c.hidden_size, ("embed", "qkv"), name)(x))
  return nn.Dropout(dropout_rate)(x, deterministic=deterministic)


class _ElectraHead(nn.Module):
  """The first token's vector -> dropout -> dense(H) -> `activation` -> dropout -> dense(num_outputs), as
  transformers' ElectraClassificationHead (exact GELU) and RobertaClassificationHead (tanh) (submodules named as
  their `dense` and `out_proj`)."""
  config: ModelConfig
  num_outputs: int
  dropout_rate: float
  activation: str

  @nn.compact
  def __call__(self, first: jax.Array, deterministic: bool) -> jax.Array:
    c = self.config
    x = nn.Dropout(self.dropout_rate)(first, deterministic=deterministic)
    x = _activated_dense(c, x, "dense", self.activation, self.dropout_rate, deterministic)
    return dense(c, self.num_outputs, ("embed", "classes"), "out_proj")(x)


class ElectraClassifier(nn.Module):
  """ELECTRA's sequence classifier: `_ElectraHead` on the first token's vector, not on the pooler (the backbone's
  pooler is left unused, as ELECTRA has none). The head of fine-tuning from an ELECTRA backbone
  (`TaskSettings.classifier_head`); RoBERTa's with `activation` "tanh"."""
  config: ModelConfig
  num_outputs: int
  dropout_rate: float = 0.1
  activation: str = "gelu"

  @nn.compact
  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, token_type_ids: jax.Array,
               deterministic: bool = True) -> jax.Array:
    sequence, _ = AlbertModel(self.config, name="albert")(input_ids, attention_mask, token_type_ids, deterministic)
    head = _ElectraHead(self.config, self.num_outputs, self.dropout_rate, self.activation, name="classifier")
    return head(sequence[:, 0], deterministic).astype(jnp.float32)


class _SequenceSummary(nn.Module):
  """The first token's vector -> dense(H) (`summary`) -> exact GELU -> dropout: transformers'
  ElectraSequenceSummary as ElectraConfig's defaults build it (summary_type "first", a projection, "gelu")."""
  config: ModelConfig
  dropout_rate: float

  @nn.compact
  def __call__(self, first: jax.Array, deterministic: bool) -> jax.Array:
    return _activated_dense(self.config, first, "summary", "gelu", self.dropout_rate, deterministic)


class ElectraMultipleChoice(nn.Module):
  """ELECTRA's multiple-choice scorer, transformers' ElectraForMultipleChoice: per option, `_SequenceSummary` of
  the first token then dense(num_outputs) (`classifier`, one score). The options are a leading dimension of the
  inputs ([B, options, S]), folded into the batch and back; the pooler is left unused. The scorer of RACE and
  multiple_choice fine-tuning from an ELECTRA backbone (`Family.multiple_choice`)."""
  config: ModelConfig
  num_outputs: int = 1
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, token_type_ids: jax.Array,
               deterministic: bool = True) -> jax.Array:
    summary = lambda sequence, _: _SequenceSummary(self.config, self.dropout_rate, name="sequence_summary")(
        sequence[:, 0], deterministic)
    return folded_scores(self.config, self.num_outputs, (input_ids, attention_mask, token_type_ids), deterministic,
                         summary)
