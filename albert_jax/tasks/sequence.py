"""Sequence classification shared by GLUE and `classification` (your own data): `[CLS] a [SEP] (b [SEP])`
inputs, a pooled classifier, cross-entropy over classes or MSE for one regression output, metrics by name.

A subclass says what its labels are (`labels`: class names, or None for regression) and which metrics it reports
(`metric_names`, the first one selects the checkpoint); examples carry `text_a`, `text_b` (None: single text)
and `label` (class index, score, or None).
"""
from __future__ import annotations

import abc

import jax.numpy as jnp
import numpy as np

from albert_jax import families
from albert_jax.errors import InputError
from albert_jax.head_identity import HFHead
from albert_jax.tasks import metrics
from albert_jax.tasks.base import Split, Task, apply_model, check_outputs, cross_entropy, pack, stack_packed


def pack_text(tokenizer, text_a: str, text_b: str | None, max_len: int) -> tuple[np.ndarray, ...]:
  """One example's packed inputs. Pairs pop tokens from the END of the longer segment (the original's fine-tuning
  rule; pretraining trims either end)."""
  a = tokenizer.encode(text_a)
  b = tokenizer.encode(text_b) if text_b is not None else None
  room = max_len - tokenizer.pair_layout.special_tokens(b is not None)
  if b is None:
    a = a[:room]
  else:
    while len(a) + len(b) > room:
      (a if len(a) > len(b) else b).pop()
  return pack(a, b, tokenizer.cls_id, tokenizer.sep_id, max_len, tokenizer.pair_layout)


class SequenceClassificationTask(Task):
  metric_names: tuple[str, ...] = ("accuracy",)

  @property
  @abc.abstractmethod
  def labels(self) -> tuple[str, ...] | None:
    """Class names in output order; None for a regression (one output, MSE loss)."""

  @property
  def is_regression(self) -> bool:
    return self.labels is None

  @property
  def num_outputs(self) -> int:
    return 1 if self.is_regression else len(self.labels)

  def featurize(self, examples, tokenizer):
    rows = [pack_text(tokenizer, ex.text_a, ex.text_b, self.settings.max_seq_length) for ex in examples]
    features = stack_packed(rows, (len(examples),))
    if all(ex.label is not None for ex in examples):
      features["label"] = np.asarray([ex.label for ex in examples], np.float32 if self.is_regression else np.int32)
    return features, {}

  # --- model ----------------------------------------------------------------------------------------------
  family_head = "classifier"

  def make_model(self, model_config):
    head = self.head_family.classifier()
    return head(model_config, self.num_outputs, self.settings.classifier_dropout_prob)

  @property
  def hf_architecture(self) -> str:
    return self.head_family.hf_class(families.SEQUENCE_CLASSIFICATION)

  @property
  def hf_head(self) -> HFHead:
    return HFHead(self.hf_architecture, self.labels)

  def dummy_batch(self, batch_size: int) -> dict[str, np.ndarray]:
    shape = (batch_size, self.settings.max_seq_length)
    return {"input_ids": np.zeros(shape, np.int32), "attention_mask": np.ones(shape, np.int32),
            "token_type_ids": np.zeros(shape, np.int32),
            "label": np.zeros(batch_size, np.float32 if self.is_regression else np.int32)}

  def loss_and_metrics(self, model, params, batch, rng, deterministic: bool):
    logits = apply_model(model, params, batch, rng, deterministic)
    if self.is_regression:
      loss = jnp.mean(jnp.square(logits[:, 0] - batch["label"]))
      return loss, {"loss": loss, "mse": loss}
    loss, acc = cross_entropy(logits, batch["label"])
    return loss, {"loss": loss, "accuracy": acc}

  def predict_step(self, model, params, batch):
    return {"logits": apply_model(model, params, batch)}

  # --- outputs --------------------------------------------------------------------------------------------
  def postprocess(self, split: Split, outputs) -> np.ndarray:
    """One prediction per example: the class index, or the regression score."""
    check_outputs(split, outputs)
    logits = np.asarray(outputs["logits"])
    return logits[:, 0] if self.is_regression else logits.argmax(-1)

  def score(self, split: Split, predictions) -> dict[str, float]:
    labels = [ex.label for ex in split.examples]
    if any(label is None for label in labels):
      raise InputError(f"split {split.name!r} ({split.path}) has no labels to score against.")
    return {name: metrics.BY_NAME[name](labels, predictions) for name in self.metric_names}
