"""Standalone parameter checkpoints: what `albert_jax.convert` writes and `init_checkpoint` reads.

Layout of a directory: `model_config.json` (the ModelConfig fields), `params/` (an orbax PyTree checkpoint,
written to a temporary name and renamed when complete, so a crash never leaves a half-written `params/`) and, for
converted fine-tuned weights, `head.json` (what the head was trained for, as a fine-tuning workdir records it;
`head_identity` reads and judges those records).
`model_config.json` is removed first and written last, so a directory whose writing was cut short (kill -9 of a
`convert --overwrite`) is refused, never read as new params under the old config.
"""
from __future__ import annotations

import json
import os
from typing import Any

import flax.linen as nn
import jax
import orbax.checkpoint as ocp

from albert_jax import families, storage
from albert_jax.checkpointing import local_restore_target
from albert_jax.errors import InputError, MissingFileError
from albert_jax.model_config import ModelConfig
from albert_jax.run.layout import HEAD_FILE

CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"  # Hugging Face's, beside a converted folder's spiece.model
BACKBONE_FILE = "backbone.json"  # beside converted weights of a family other than the default: {"family": NAME}
CONVERT_AGAIN = "convert the weights again (python -m albert_jax.convert)"
RESTORE_RUN_CONFIG = "restore it from a copy, or from the config.<step>.json that a resume kept there"


def save_pretrained(directory: str, model_config: ModelConfig, params: Any, head: dict | None = None,
                    family: str = families.DEFAULT) -> None:
  """`head`: the identity of the params' fine-tuned head (`HFHead.identity()` of converted weights), kept as
  HEAD_FILE so that eval, predict, warm starts and export read its classes in their trained order. `family`: the
  backbone's, kept as BACKBONE_FILE unless it is the default family (`record.backbone_family`)."""
  directory = storage.absolute(directory)
  storage.path(directory).mkdir(parents=True, exist_ok=True)
  if jax.process_index() == 0:
    storage.remove(os.path.join(directory, CONFIG_FILE))   # the completion mark (module docstring)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.join(directory, PARAMS_DIR), nn.unbox(params), force=True)
    checkpointer.wait_until_finished()
  if jax.process_index() == 0:
    if head is None:  # an older conversion's record, left by --overwrite, would misdescribe these params
      storage.remove(os.path.join(directory, HEAD_FILE))
    else:
      storage.write_atomic(os.path.join(directory, HEAD_FILE), json.dumps(head, indent=2))
    if families.get(family).name != families.DEFAULT:
      storage.write_atomic(os.path.join(directory, BACKBONE_FILE), json.dumps({"family": family}))
    else:
      storage.remove(os.path.join(directory, BACKBONE_FILE))
    storage.write_atomic(os.path.join(directory, CONFIG_FILE), json.dumps(model_config.to_dict(), indent=2))


def is_pretrained_dir(directory: str) -> bool:
  root = storage.path(directory)
  return (root / CONFIG_FILE).is_file() and (root / PARAMS_DIR).is_dir()


def load_pretrained(directory: str) -> tuple[ModelConfig, Any]:
  """Returns (ModelConfig, params as host numpy/jax arrays)."""
  directory = storage.absolute(directory)
  if not is_pretrained_dir(directory):
    raise MissingFileError(f"{directory!r} is not a pretrained-weights directory (expected {CONFIG_FILE} and "
                           f"{PARAMS_DIR}/); write one with `python -m albert_jax.convert --from=hf ...` or point "
                           "to a training workdir.")
  model_config = ModelConfig.from_mapping(read_json_object(os.path.join(directory, CONFIG_FILE), "a model config",
                                                           CONVERT_AGAIN))
  path = os.path.join(directory, PARAMS_DIR)
  with ocp.StandardCheckpointer() as checkpointer:
    params = checkpointer.restore(path, local_restore_target(checkpointer.metadata(path).item_metadata))
  return model_config, params


def read_json_object(path: str, what: str, fix: str) -> dict[str, Any]:
  """The JSON object in `path` (a config file), refused in one line naming the file, `what` it should be and `fix`
  when the file was cut short or edited into something else."""
  try:
    value = json.loads(storage.path(path).read_text())
  except ValueError:  # not JSON (nor UTF-8)
    value = None
  if not isinstance(value, dict):
    raise InputError(f"{path} is not {what} (a JSON object); {fix}.")
  return value
