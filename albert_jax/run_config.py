"""A training workdir's resolved config (`config.json`, written by `workdir_config.write_workdir_config`) as an
experiment file: `--config=albert_jax/run_config.py:WORKDIR`. `main` passes it when `--config` is left out, so eval,
predict, embed and a resume run with the settings the run was trained with, and `--config.<field>` overrides still
go through ml_collections (typed, misspelt fields named).

JSON drops two things that a ConfigDict's overrides and the resume checks rely on, restored here: tuples (saved as
lists; every sequence of an experiment config is a tuple) and the type of a `bool | None` model field left at None
(`experiments/common.model_config` makes it a bool placeholder). The config read back writes the same JSON again,
so a resume sees no change that was not asked for.
"""
from __future__ import annotations

import json

import ml_collections

from albert_jax import storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.model_config import optional_field_types
from albert_jax.run import Run

PASS_CONFIG = ("pass --config=FILE, the experiment file the run was trained with (and its --config.<field> "
               "overrides)")


def config_path(workdir: str) -> str:
  return Run(workdir).config


def exists(workdir: str) -> bool:
  return storage.path(config_path(workdir)).is_file()


def read(workdir: str, name: str = "--workdir", fix: str = PASS_CONFIG) -> dict:
  """The resolved config of the run in `workdir` as saved, refused in one line naming `fix` when it is missing or
  is not a run's config (a file cut short or edited into another shape). `name`: the flag that gave `workdir`."""
  path = config_path(workdir)
  if not exists(workdir):
    raise MissingFileError(f"{name}={workdir} holds no run config ({path} not found); {fix}.")
  try:
    saved = json.loads(storage.path(path).read_text())
  except ValueError:  # not JSON (nor UTF-8)
    saved = None
  if not (isinstance(saved, dict) and isinstance(saved.get("task"), str) and isinstance(saved.get("model"), dict)):
    raise InputError(f"{path} is not a run's config (a JSON object with task and model); {fix}, or restore it from "
                     "a copy or from a config.<step>.json kept there.")
  return saved


def _tuples(value):
  if isinstance(value, dict):
    return {key: _tuples(item) for key, item in value.items()}
  if isinstance(value, list):
    return tuple(_tuples(item) for item in value)
  return value


def _typed_model_nones(model: dict) -> dict:
  """`model` with each None whose ModelConfig field is `X | None` as a placeholder of X, so that
  `--config.model.<field>=value` parses as it does on the experiment file's config."""
  kinds = optional_field_types()
  return {name: ml_collections.config_dict.placeholder(kinds[name]) if value is None and name in kinds else value
          for name, value in model.items()}


def from_saved(saved: dict) -> ml_collections.ConfigDict:
  """The ConfigDict that `saved` (a config.json's object) was written from."""
  values = _tuples(saved)
  return ml_collections.ConfigDict({**values, "model": _typed_model_nones(values["model"])})


def get_config(workdir: str) -> ml_collections.ConfigDict:
  return from_saved(read(workdir))
