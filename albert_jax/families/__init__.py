"""Model families: what differs between ALBERT and ELECTRA (and the families to come), each family one module.

A family owns its name, the `model_type` its transformers config.json carries, its transformers class names, the
sequence-classification head it fine-tunes with by default, and the kind of tokenizer its released checkpoints
ship. Every other module asks the registry (`get`, `for_hf_model_type`) instead of testing a family's name; the
per-format weight names are the formats' (`albert_jax.formats`), in one column per family.
"""
from __future__ import annotations

import dataclasses

from albert_jax.errors import InputError

# The transformers classes a family may have, by what they hold beyond the encoder: `Family.hf_class(role)`.
BACKBONE, PRETRAINING, MASKED_LM = "Model", "ForPreTraining", "ForMaskedLM"
SEQUENCE_CLASSIFICATION, QUESTION_ANSWERING = "ForSequenceClassification", "ForQuestionAnswering"
TOKEN_CLASSIFICATION, MULTIPLE_CHOICE = "ForTokenClassification", "ForMultipleChoice"
ROLES = (BACKBONE, PRETRAINING, MASKED_LM, SEQUENCE_CLASSIFICATION, QUESTION_ANSWERING, TOKEN_CLASSIFICATION,
         MULTIPLE_CHOICE)


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family. `roles` lists the transformers classes it has (each `hf_prefix + role`)."""
  name: str                  # how configs and records name it: config.classifier_head, backbone.json's "family"
  hf_model_type: str         # transformers config.json's model_type
  hf_prefix: str             # transformers class names start with it: AlbertForMaskedLM, ElectraModel
  classifier_head: str       # the sequence-classification head `classifier_head=auto` resolves to for its weights
  tokenizer: str             # what its released checkpoints ship: "sentencepiece" (spiece.model) | "wordpiece"
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


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
  FAMILIES[family.name] = family
  return family


def get(name: str) -> Family:
  """The family called `name`, refused in one line naming the registered ones."""
  _load()
  if name not in FAMILIES:
    raise InputError(f"No model family {name!r}; the families are {', '.join(sorted(FAMILIES))}.")
  return FAMILIES[name]


def for_hf_model_type(model_type: str, where: str) -> Family:
  """The family whose transformers config.json says `model_type` (`where`: the file, for the message)."""
  _load()
  for family in FAMILIES.values():
    if family.hf_model_type == model_type:
      return family
  raise InputError(f"{where} has model_type={model_type!r}; the model types read here are "
                   f"{', '.join(sorted(f.hf_model_type for f in FAMILIES.values()))}.")


def for_hf_class(architecture: str) -> Family | None:
  """The family one of whose transformers classes is `architecture`; None for another class."""
  _load()
  return next((family for family in FAMILIES.values() if family.role_of(architecture)), None)


def _load() -> None:
  """Imports the family modules, each registering itself."""
  from albert_jax.families import albert, electra  # noqa: F401  (registration)
