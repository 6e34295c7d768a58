"""Standalone parameter checkpoints: what `albert_jax.convert` writes and `init_checkpoint` reads.

Layout of a directory: `model_config.json` (the ModelConfig fields) and `params/` (an orbax PyTree checkpoint,
written to a temporary name and renamed when complete, so a crash never leaves a half-written `params/`).
A training workdir's step checkpoints are read too (see `checkpointing.py`), and `merge_init_params` fits what
was read into a model's parameter tree (warm starts of pretraining and fine-tuning).
"""
from __future__ import annotations

import json
import os
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from albert_jax import checkpointing, storage
from albert_jax.checkpointing import local_restore_target
from albert_jax.model_config import ModelConfig

CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"
BEST_DIR = "best"        # a fine-tuning workdir's best dev checkpoint: best/step_N/ (a pretrained-weights dir)
BEST_FILE = "best.json"  # ... and the record naming it (finetune.BestKeeper)


def save_pretrained(directory: str, model_config: ModelConfig, params: Any) -> None:
  directory = storage.absolute(directory)
  storage.path(directory).mkdir(parents=True, exist_ok=True)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.join(directory, PARAMS_DIR), nn.unbox(params), force=True)
    checkpointer.wait_until_finished()
  if jax.process_index() == 0:
    storage.write_atomic(os.path.join(directory, CONFIG_FILE), json.dumps(model_config.to_dict(), indent=2))


def is_pretrained_dir(directory: str) -> bool:
  root = storage.path(directory)
  return (root / CONFIG_FILE).is_file() and (root / PARAMS_DIR).is_dir()


def load_pretrained(directory: str) -> tuple[ModelConfig, Any]:
  """Returns (ModelConfig, params as host numpy/jax arrays)."""
  directory = storage.absolute(directory)
  if not is_pretrained_dir(directory):
    raise FileNotFoundError(f"{directory!r} is not a pretrained-weights directory (expected {CONFIG_FILE} and "
                            f"{PARAMS_DIR}/); write one with `python -m albert_jax.convert --from=hf ...` or point "
                            "to a training workdir.")
  model_config = ModelConfig.from_mapping(json.loads((storage.path(directory) / CONFIG_FILE).read_text()))
  path = os.path.join(directory, PARAMS_DIR)
  with ocp.StandardCheckpointer() as checkpointer:
    params = checkpointer.restore(path, local_restore_target(checkpointer.metadata(path).item_metadata))
  return model_config, params


def read_best(workdir: str) -> dict | None:
  path = storage.path(workdir) / BEST_DIR / BEST_FILE
  return json.loads(path.read_text()) if path.exists() else None


def load_init_params(path: str, name: str = "init_checkpoint") -> Any:
  """Parameters to warm-start from, as host (numpy) arrays, which every process of a multi-host run can place on
  the mesh (`engine.Setup.replicate`): a `convert`/`save_pretrained` directory, or a training workdir: its best dev
  checkpoint when it is a fine-tuning run (the weights its scores were reported with), else its newest one.
  `name`: what the user passed `path` as, for the messages."""
  return jax.device_get(_load_init_params(path, name))


def _load_init_params(path: str, name: str) -> Any:
  if is_pretrained_dir(path):
    return load_pretrained(path)[1]
  best = read_best(path)
  if best is not None:  # best/step_N by name: the recorded path is absolute only if the run's workdir was
    weights = os.path.join(path, BEST_DIR, os.path.basename(os.path.normpath(best["weights"])))
    _say(f"{name}={path}: loading the best dev checkpoint of the fine-tuning run (step {best['step']}, "
         f"{best['metric']} {best['value']:.4f}) from {weights}")
    return load_pretrained(weights)[1]
  ckpt_dir = checkpointing.checkpoint_dir(path)
  if storage.path(ckpt_dir).is_dir():
    ckpt = checkpointing.Checkpointer(ckpt_dir, 1, 1)
    found = ckpt.restore_newest_intact(ckpt.restore_params)
    if found is None:
      raise FileNotFoundError(f"No complete checkpoint in {ckpt_dir}; {name} needs a trained workdir.")
    _say(f"{name}={path}: loading its newest checkpoint (step {found[0]})")
    return found[1]
  raise FileNotFoundError(f"{name}={path!r} is neither a pretrained-weights directory (model_config.json + "
                          "params/, from `python -m albert_jax.convert`) nor a training workdir (checkpoints/).")


def _say(line: str) -> None:
  if jax.process_index() == 0:
    print(line, flush=True)


BACKBONE = "albert/"


def check_params(target: Any, loaded: Any, required_prefix: str = BACKBONE, name: str = "init_checkpoint",
                 head_fix: str = "") -> None:
  """Raises naming every parameter of `target` under `required_prefix` that `loaded` lacks or holds in another
  shape (`target` may be shape structs). The backbone and the task head are reported apart: a backbone mismatch
  is another model size, a head mismatch weights not fine-tuned for this task (`head_fix` says what to pass)."""
  flat_loaded = flax.traverse_util.flatten_dict(loaded, sep="/")
  backbone, head = [], []
  for path, value in flax.traverse_util.flatten_dict(target, sep="/").items():
    if not path.startswith(required_prefix) or (
        path in flat_loaded and tuple(flat_loaded[path].shape) == tuple(value.shape)):
      continue
    found = "missing" if path not in flat_loaded else f"shape {tuple(flat_loaded[path].shape)}"
    (backbone if path.startswith(BACKBONE) else head).append(
        f"{path}: expected shape {tuple(value.shape)}, found {found}")
  if backbone:
    raise ValueError(f"{name} does not match the model's backbone:\n  " + "\n  ".join(backbone) +
                     "\nCheck --config.model (size, vocab_size, embedding_size) against the checkpoint's "
                     "model_config.json (a training workdir's: config.json).")
  if head:
    raise ValueError(f"{name} holds no head trained for this task:\n  " + "\n  ".join(head) + f"\n{head_fix}")


def merge_init_params(target: Any, loaded: Any, required_prefix: str = BACKBONE, head_fix: str = ""
                      ) -> tuple[Any, list[str]]:
  """Copies `loaded` into `target` by path. Every parameter under `required_prefix` (the backbone by default;
  "" = all) must be present with the same shape (`check_params`); other parameters (heads) are taken when
  present. Returns (params, paths left freshly initialised)."""
  check_params(target, loaded, required_prefix, head_fix=head_fix)
  flat_target = flax.traverse_util.flatten_dict(target, sep="/")
  flat_loaded = flax.traverse_util.flatten_dict(loaded, sep="/")
  fresh, merged = [], {}
  for path, value in flat_target.items():
    if path in flat_loaded and tuple(flat_loaded[path].shape) == tuple(value.shape):
      merged[path] = jnp.asarray(flat_loaded[path], value.dtype)
      continue
    fresh.append(path)
    merged[path] = value
  return flax.traverse_util.unflatten_dict(merged, sep="/"), fresh
