"""Standalone parameter checkpoints: what `albert_jax.convert` writes and `init_checkpoint` reads.

Layout of a directory: `model_config.json` (the ModelConfig fields) and `params/` (an orbax PyTree checkpoint,
written to a temporary name and renamed when complete, so a crash never leaves a half-written `params/`).
A training workdir's step checkpoints are read too (see `checkpointing.py`).
"""
from __future__ import annotations

import json
import os
from typing import Any

import flax.linen as nn
import jax
import orbax.checkpoint as ocp

from albert_jax.checkpointing import local_restore_target
from albert_jax.model_config import ModelConfig

CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"


def save_pretrained(directory: str, model_config: ModelConfig, params: Any) -> None:
  directory = os.path.abspath(directory)
  os.makedirs(directory, exist_ok=True)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.join(directory, PARAMS_DIR), nn.unbox(params), force=True)
    checkpointer.wait_until_finished()
  if jax.process_index() == 0:
    tmp = os.path.join(directory, CONFIG_FILE + ".tmp")
    with open(tmp, "w") as f:
      json.dump(model_config.to_dict(), f, indent=2)
    os.replace(tmp, os.path.join(directory, CONFIG_FILE))


def is_pretrained_dir(directory: str) -> bool:
  return os.path.isfile(os.path.join(directory, CONFIG_FILE)) and os.path.isdir(os.path.join(directory, PARAMS_DIR))


def load_pretrained(directory: str) -> tuple[ModelConfig, Any]:
  """Returns (ModelConfig, params as host numpy/jax arrays)."""
  directory = os.path.abspath(directory)
  if not is_pretrained_dir(directory):
    raise FileNotFoundError(f"{directory!r} is not a pretrained-weights directory (expected {CONFIG_FILE} and "
                            f"{PARAMS_DIR}/); write one with `python -m albert_jax.convert --from=hf ...` or point "
                            "to a training workdir.")
  with open(os.path.join(directory, CONFIG_FILE)) as f:
    model_config = ModelConfig.from_mapping(json.load(f))
  path = os.path.join(directory, PARAMS_DIR)
  with ocp.StandardCheckpointer() as checkpointer:
    params = checkpointer.restore(path, local_restore_target(checkpointer.metadata(path).item_metadata))
  return model_config, params
