"""A model family's descriptor (`Family`) and the roles of the transformers classes a family may have."""
from __future__ import annotations

import dataclasses
from typing import Callable

from albert_jax.errors import InputError

# The transformers classes a family may have, by what they hold beyond the encoder: `Family.hf_class(role)`.
BACKBONE, PRETRAINING, MASKED_LM = "Model", "ForPreTraining", "ForMaskedLM"
SEQUENCE_CLASSIFICATION, QUESTION_ANSWERING = "ForSequenceClassification", "ForQuestionAnswering"
TOKEN_CLASSIFICATION, MULTIPLE_CHOICE = "ForTokenClassification", "ForMultipleChoice"
ROLES = (BACKBONE, PRETRAINING, MASKED_LM, SEQUENCE_CLASSIFICATION, QUESTION_ANSWERING, TOKEN_CLASSIFICATION,
         MULTIPLE_CHOICE)


def pooled_classifier() -> type:
  """The head on the pooler's output (`tasks.heads.PooledClassifier`): BERT's and ALBERT's classifier and
  multiple-choice scorer."""
  from albert_jax.tasks.heads import PooledClassifier
  return PooledClassifier


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family. `roles` lists the transformers classes it has (each `hf_prefix + role`)."""
  name: str                  # how configs and records name it: config.classifier_head, backbone.json's "family"
  title: str                 # how messages name it: "ELECTRA"
  hf_model_type: str         # transformers config.json's model_type
  hf_prefix: str             # transformers class names start with it: AlbertForMaskedLM, ElectraModel
  classifier_head: str       # the sequence-classification head `classifier_head=auto` resolves to for its weights
  classifier: Callable[[], type]  # loads the flax class of the head named after this family: (config, outputs, p)
  classifier_note: str       # what that head computes, for the line saying it was chosen
  tokenizer: str             # what its released checkpoints ship: "sentencepiece" (spiece.model) | "wordpiece"
                             # (vocab.txt) | "bpe" (byte-level BPE: vocab.json, merges.txt, tokenizer.json)
  pretraining_task: str      # config.task of its pretraining runs
  # A top-level parameter name only its pretraining runs hold beside the backbone (`family_of`); weights loaded
  # from such a run keep only the backbone, as `run_backbone_note` says. None: its runs' weights are all backbone
  # and heads that fine-tuning leaves by name.
  run_marker: str | None = None
  run_backbone_note: str = ""
  # Loads the flax class of its multiple-choice scorer, (config, outputs, p): one score per option, the options a
  # leading dimension of the inputs ([B, options, S]), as its transformers ForMultipleChoice class computes them.
  multiple_choice: Callable[[], type] = pooled_classifier
  roles: tuple[str, ...] = ROLES

  def hf_class(self, role: str) -> str:
    """The transformers class of `role` (one of ROLES), refused in one line where the family has none."""
    if role not in self.roles:
      raise InputError(f"transformers has no {self.hf_prefix}{role}: the {self.name} family's classes are "
                       f"{', '.join(self.hf_classes())}.")
    return self.hf_prefix + role

  def hf_classes(self) -> tuple[str, ...]:
    return tuple(self.hf_prefix + role for role in self.roles)

  def role_of(self, architecture: str) -> str | None:
    """The role of the transformers class `architecture` in this family; None if it is not one of its classes."""
    role = architecture[len(self.hf_prefix):] if architecture.startswith(self.hf_prefix) else None
    return role if role in self.roles else None
