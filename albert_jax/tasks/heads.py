"""Fine-tuning models: the ALBERT backbone (always the submodule "albert", so pretrained weights map by name)
plus a freshly initialised head. Heads follow google-research/albert `classifier_utils.py`, `squad_utils.py`
and `race_utils.py`; logits are float32 whatever the compute dtype.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax.model import AlbertModel, dense
from albert_jax.model_config import ModelConfig


@dataclasses.dataclass(frozen=True)
class HFHead:
  """A head as transformers names it, so a fine-tuned model leaves as the class its users load (`interop.save_hf`).
  Our `classifier` is HF's `classifier` (sequence classification, regression, multiple choice: one score per
  option) and our `qa_outputs` HF's; the architecture tells regression [H, 1] from multiple choice [H, 1]."""
  architecture: str                      # AlbertFor{SequenceClassification,QuestionAnswering,MultipleChoice}
  labels: tuple[str, ...] | None = None  # class names (HF id2label) of a classifier; None for regression


SEQUENCE_CLASSIFICATION = "AlbertForSequenceClassification"
QUESTION_ANSWERING = "AlbertForQuestionAnswering"
MULTIPLE_CHOICE = "AlbertForMultipleChoice"
TOKEN_CLASSIFICATION = "AlbertForTokenClassification"
HF_HEAD_PARAMS = {SEQUENCE_CLASSIFICATION: "classifier", MULTIPLE_CHOICE: "classifier",
                  QUESTION_ANSWERING: "qa_outputs", TOKEN_CLASSIFICATION: "classifier"}
NO_POOLER = (QUESTION_ANSWERING, TOKEN_CLASSIFICATION)  # HF builds these without the pooler


class PooledClassifier(nn.Module):
  """pooled [CLS] -> dropout -> dense(num_outputs): GLUE classes, the STS-B score (1 output), or one RACE option
  score (1 output). Leading dimensions of the inputs (RACE's [B, 4, S]) fold into the batch and come back."""
  config: ModelConfig
  num_outputs: int
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, token_type_ids: jax.Array,
               deterministic: bool = True) -> jax.Array:
    lead, length = input_ids.shape[:-1], input_ids.shape[-1]
    flat = lambda x: x.reshape(-1, length)
    _, pooled = AlbertModel(self.config, name="albert")(flat(input_ids), flat(attention_mask),
                                                         flat(token_type_ids), deterministic)
    pooled = nn.Dropout(self.dropout_rate)(pooled, deterministic=deterministic)
    logits = dense(self.config, self.num_outputs, ("embed", "classes"), "classifier")(pooled)
    return logits.astype(jnp.float32).reshape(*lead, self.num_outputs)


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
