"""A user's weights: a safetensors file cut short or damaged (an interrupted download, a disk error) is one line
naming the file and the fix, not the library's traceback, which names neither; a folder given as weights that
holds none is said as such, not as the first of its files that a later step misses."""
from __future__ import annotations

import os

import numpy as np
import safetensors
import safetensors.numpy

from albert_jax import storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.run import as_run

FETCH_AGAIN = "fetch the checkpoint again, or re-save it with transformers' save_pretrained (safetensors)"
# What a folder of weights holds: an albert_jax.convert output's, a Hugging Face folder's (whole, sharded, torch).
WEIGHT_NAMES = ("model_config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def check_holds_weights(path: str, flag: str) -> None:
  """Refuses a local folder given as weights (`flag`=`path`) that holds none: neither a run's checkpoints or best
  checkpoint nor any of WEIGHT_NAMES."""
  if not path or storage.is_remote(path) or not os.path.isdir(path) or as_run(path).has_weights():
    return
  if not any(os.path.exists(os.path.join(path, name)) for name in WEIGHT_NAMES):
    raise MissingFileError(f"{flag}={path} holds no weights: pass an albert_jax.convert output (model_config.json), "
                           "a training workdir (checkpoints/ or best/) or a Hugging Face folder (config.json with "
                           "model.safetensors or pytorch_model.bin).")


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """The tensors of the safetensors file `path`, by name."""
  try:
    return safetensors.numpy.load_file(path)
  except FileNotFoundError:
    raise MissingFileError(f"{path} not found: {FETCH_AGAIN}.") from None
  except OSError as e:
    what = "is a folder, not a safetensors file" if os.path.isdir(path) else f"cannot be read ({e.strerror or e})"
    raise InputError(f"{path} {what}: {FETCH_AGAIN}.") from None
  except safetensors.SafetensorError as e:
    raise InputError(f"{path} is damaged or cut short (safetensors: {e}): {FETCH_AGAIN}.") from None
