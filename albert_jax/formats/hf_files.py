"""The files of a transformers `save_pretrained` folder, for every family: config.json, the weights (safetensors,
whole or sharded, or torch's pytorch_model.bin) read without transformers, and the pair written whole or not at all.
"""
from __future__ import annotations

import json
import os
import pickle
import warnings
from typing import Any

import numpy as np
import safetensors.numpy

from albert_jax import storage
from albert_jax.errors import EnvironmentUserError, InputError, MissingFileError
from albert_jax.formats import weight_files
from albert_jax.weights import store

Path = tuple[str, ...]
CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
REFETCH = "fetch the checkpoint again, or re-save it with transformers' save_pretrained (safetensors)"
# transformers' activation names -> ours. gelu_pytorch_tanh is the same tanh formula as gelu_new, fused in torch.
ACTIVATIONS = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def read_tensors(path: str) -> dict[str, np.ndarray]:
  if os.path.isfile(os.path.join(path, SAFETENSORS_FILE)):
    return weight_files.read_safetensors(os.path.join(path, SAFETENSORS_FILE))
  if os.path.isfile(os.path.join(path, SAFETENSORS_INDEX)):  # sharded checkpoint
    return {k: v for name in shard_files(path) for k, v in weight_files.read_safetensors(name).items()}
  if os.path.isfile(os.path.join(path, TORCH_FILE)):
    return read_torch(os.path.join(path, TORCH_FILE))
  raise MissingFileError(f"No weights in {path!r}: expected {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or "
                         f"{TORCH_FILE} (as written by transformers' save_pretrained).")


def shard_files(path: str) -> list[str]:
  """The shards that the index of a sharded checkpoint names, each refused unless it is a file name in `path`
  itself, as transformers writes them: a crafted index must not make us open `../../etc/passwd` or `/etc/passwd`."""
  index = os.path.join(path, SAFETENSORS_INDEX)
  weight_map = store.read_json_object(index, "a safetensors index", REFETCH).get("weight_map")
  if not isinstance(weight_map, dict):
    raise InputError(f"{index} has no weight_map (each tensor's shard file); {REFETCH}.")
  outside = sorted({str(name) for name in weight_map.values()
                    if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name})
  if outside:
    raise InputError(f"{index} names shard files outside {path}: {outside}; an index names files in its own "
                     f"folder only: {REFETCH}.")
  return [os.path.join(path, name) for name in sorted(set(weight_map.values()))]


def read_torch(file: str) -> dict[str, np.ndarray]:
  """The tensors of a pickled state dict, read by torch's tensors-only unpickler (weights_only), which runs
  nothing in the file; anything else in it is refused in one line."""
  try:
    import torch
  except ImportError as e:
    raise EnvironmentUserError(f"{file} needs torch to read: `pip install torch` (CPU build is enough), or "
                               "re-save the checkpoint as safetensors.") from e
  try:
    with warnings.catch_warnings():  # a plain pickle's protocol, warned of in two lines before the refusal's one
      warnings.filterwarnings("ignore", "Detected pickle protocol")
      state = torch.load(file, map_location="cpu", weights_only=True)
  except (pickle.UnpicklingError, EOFError, RuntimeError) as e:  # an object it will not build, cut short, no pickle
    raise InputError(f"{file} is not a PyTorch state dict that torch.load reads safely ({type(e).__name__}; it "
                     f"builds tensors only, and nothing in the file was run): {REFETCH}.") from None
  if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
    raise InputError(f"{file} is not a PyTorch state dict: it holds a {type(state).__name__} of other objects than "
                     f"tensors; {REFETCH}.")
  return {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in state.items()}


def check_shape(key: str, path: Path, found: tuple[int, ...], expected: tuple[int, ...], where: str) -> None:
  if tuple(found) != tuple(expected):
    raise InputError(f"{where}: parameter {key} (ours {'/'.join(path)}) has shape {list(found)}, but the config "
                     f"expects {list(expected)}; the config does not describe these weights (check vocab_size, "
                     "embedding_size, hidden_size, intermediate_size, num_hidden_groups, inner_group_num).")


def read_config(path: str) -> dict[str, Any]:
  config_path = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(config_path):
    raise MissingFileError(f"{config_path} not found; point to a directory written by transformers' "
                           "save_pretrained (config.json + model.safetensors or pytorch_model.bin).")
  return store.read_json_object(config_path, "a transformers config", REFETCH)


def write_folder(path: str, tensors: dict[str, np.ndarray], hf_config: dict[str, Any]) -> None:
  """Writes the weights, then config.json, each under a temporary name renamed when whole, after removing the
  pair a previous export left: a failed write (a full disk) leaves no config.json, so nothing there loads as a
  complete model. The failure is one OSError naming the folder and the fix."""
  weights, config = os.path.join(path, SAFETENSORS_FILE), os.path.join(path, CONFIG_FILE)
  try:
    os.makedirs(path, exist_ok=True)
    for name in (config, weights):
      storage.remove(name)
    safetensors.numpy.save_file(tensors, f"{weights}.tmp", metadata={"format": "pt"})
    os.chmod(f"{weights}.tmp", 0o644)  # safetensors creates it 0600; the folder is for others to load
    os.replace(f"{weights}.tmp", weights)
    storage.write_atomic(config, json.dumps(hf_config, indent=2))
  except (OSError, safetensors.SafetensorError) as e:
    storage.remove(f"{weights}.tmp")
    raise EnvironmentUserError(f"Writing the transformers model into {path} failed ({e}); nothing there is left as a "
                               "complete model. Free space on that disk (or make it writable) and run again, or write "
                               "elsewhere.") from e
