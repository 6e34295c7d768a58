"""Reading a user's safetensors weights file: a file cut short or damaged (an interrupted download, a disk error) is
one line naming the file and the fix, not the library's traceback, which names neither."""
from __future__ import annotations

import os

import numpy as np
import safetensors
import safetensors.numpy

from albert_jax.errors import InputError, MissingFileError

FETCH_AGAIN = "fetch the checkpoint again, or re-save it with transformers' save_pretrained (safetensors)"


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
