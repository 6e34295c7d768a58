"""Model families: what differs between ALBERT and ELECTRA (and the families to come), each family one module.

A family owns its name, the `model_type` its transformers config.json carries, its transformers class names, the
sequence-classification head it fine-tunes with by default, the kind of tokenizer its released checkpoints ship and
how its pretraining runs' weights are told apart. Every other module asks the registry (`get`, `for_hf_model_type`,
`family_of`, `of_run`) instead of testing a family's name; the per-format weight names are the formats'
(`albert_jax.formats`), in one column per family. A family's module (`albert.py`, `electra.py`, `bert.py`,
`roberta.py`: its `Family`, listed in `_families`) imports no jax: its model and heads load when asked (`Family.classifier`).
"""
from __future__ import annotations

import functools
from typing import Any, Mapping

from albert_jax.errors import InputError
from albert_jax.families.family import (BACKBONE, MASKED_LM, MULTIPLE_CHOICE, PRETRAINING, QUESTION_ANSWERING,
                                       ROLES, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, Family)

__all__ = ["BACKBONE", "MASKED_LM", "MULTIPLE_CHOICE", "PRETRAINING", "QUESTION_ANSWERING", "ROLES",
           "SEQUENCE_CLASSIFICATION", "TOKEN_CLASSIFICATION", "Family"]

DEFAULT = "albert"  # the family of weights that record none (and of `classifier_head=auto` without weights)
AUTO_HEAD = "auto"  # classifier_head that takes the head of the weights' family (`record.with_classifier_head`)
MODEL_FAMILY = "model_family"  # the config key naming a pretraining run's family where its task does not
BACKBONE_PARAMS = "albert"  # the top-level name of the encoder in every family's parameter tree


def get(name: str) -> Family:
  """The family called `name`, refused in one line naming the registered ones."""
  if name not in _families():
    raise InputError(f"No model family {name!r}; the families are {', '.join(sorted(_families()))}.")
  return _families()[name]


def all_families() -> tuple[Family, ...]:
  """Every registered family, the default first."""
  return tuple(_families().values())


def for_hf_model_type(model_type: str, where: str) -> Family:
  """The family whose transformers config.json says `model_type` (`where`: the file, for the message)."""
  for family in _families().values():
    if family.hf_model_type == model_type:
      return family
  raise InputError(f"{where} has model_type={model_type!r}; the model types read here are "
                   f"{', '.join(sorted(f.hf_model_type for f in _families().values()))}.")


def for_hf_class(architecture: str) -> Family | None:
  """The family one of whose transformers classes is `architecture`; None for another class."""
  return next((family for family in _families().values() if family.role_of(architecture)), None)


def hf_classes(role: str) -> tuple[str, ...]:
  """Every family's transformers class of `role` (those that have one)."""
  return tuple(family.hf_class(role) for family in all_families() if role in family.roles)


def classifier_heads() -> tuple[str, ...]:
  """The values of classifier_head: AUTO_HEAD, then each head a family's weights fine-tune with."""
  return (AUTO_HEAD, *dict.fromkeys(family.classifier_head for family in all_families()))


def classifier_family(head: str) -> Family:
  """The family whose sequence-classification head `head` (a value of `classifier_heads`) is; AUTO_HEAD left
  unresolved (no weights to follow) is the default family's."""
  return get(DEFAULT if head == AUTO_HEAD else head)


def family_of(params: Any) -> Family:
  """The family of a run's `params` by the top-level names its pretraining runs hold (`Family.run_marker`); the
  default family for any other parameter tree."""
  return next((family for family in _families().values() if family.run_marker is not None
               and isinstance(params, Mapping) and family.run_marker in params and BACKBONE_PARAMS in params),
              _families()[DEFAULT])


def check_model_family(config: Mapping[str, Any]) -> None:
  """Refuses a config whose `model_family` names no registered family, at start-up rather than when its weights
  are exported or fine-tuned (`of_run`)."""
  name = config.get(MODEL_FAMILY)
  if name and name not in _families():
    raise InputError(f"{MODEL_FAMILY}={name!r} names no model family; set --config.{MODEL_FAMILY} to one of "
                     f"{', '.join(sorted(_families()))}.")


def of_run(config: Mapping[str, Any]) -> Family:
  """The family of a training run's weights by its recorded config: its `model_family` (the experiment files of
  BERT and RoBERTa set it: their pretraining runs share ALBERT's task), else a pretraining run's task, or a
  fine-tuning run's classification head when the head is a family's own; the default family otherwise
  (`classifier_head=auto`, which a run records only where its weights' family is the default)."""
  if config.get(MODEL_FAMILY):
    return get(config[MODEL_FAMILY])
  return next((family for family in _families().values()
               if config.get("task") == family.pretraining_task or config.get("classifier_head") == family.name),
              _families()[DEFAULT])


@functools.cache
def _families() -> dict[str, Family]:
  """The families by name, the default first: one module each, imported when first asked for."""
  from albert_jax.families import albert, bert, electra, roberta
  return {family.name: family for family in (albert.ALBERT, electra.ELECTRA, bert.BERT, roberta.ROBERTA)}
