"""Standalone parameter checkpoints: what `albert_jax.convert` writes and `init_checkpoint` reads.

Layout of a directory: `model_config.json` (the ModelConfig fields), `params/` (an orbax PyTree checkpoint,
written to a temporary name and renamed when complete, so a crash never leaves a half-written `params/`) and, for
converted fine-tuned weights, `head.json` (what the head was trained for, as a fine-tuning workdir records it;
`head_identity` reads and judges those records).
`model_config.json` is removed first and written last, so a directory whose writing was cut short (kill -9 of a
`convert --overwrite`) is refused, never read as new params under the old config.
A training workdir's step checkpoints are read too (see `checkpointing.py`), and `merge_init_params` fits what
was read into a model's parameter tree (warm starts of pretraining and fine-tuning).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from albert_jax import checkpointing, storage
from albert_jax.checkpointing import local_restore_target
from albert_jax.errors import InputError, MissingFileError
from albert_jax.head_identity import HEAD_FILE, best_weights, check_shapeless_fields, read_best
from albert_jax.model_config import ModelConfig

CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"
_CONVERT_AGAIN = "convert the weights again (python -m albert_jax.convert)"
RESTORE_RUN_CONFIG = "restore it from a copy, or from the config.<step>.json that a resume kept there"


def save_pretrained(directory: str, model_config: ModelConfig, params: Any, head: dict | None = None) -> None:
  """`head`: the identity of the params' fine-tuned head (`HFHead.identity()` of converted weights), kept as
  HEAD_FILE so that eval, predict, warm starts and export read its classes in their trained order."""
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
                                                           _CONVERT_AGAIN))
  path = os.path.join(directory, PARAMS_DIR)
  with ocp.StandardCheckpointer() as checkpointer:
    params = checkpointer.restore(path, local_restore_target(checkpointer.metadata(path).item_metadata))
  return model_config, params


def check_same_function(path: str, model: Mapping[str, Any], name: str = "init_checkpoint") -> None:
  """Refuses weights at `path` whose recorded model (model_config.json of a converted directory, config.json of a
  training workdir) differs from `model` (the config.model they are about to be loaded into) in a field that no
  weight shape shows: they would load and compute another function (`head_identity.check_shapeless_fields`)."""
  saved = None
  if storage.path(os.path.join(path, CONFIG_FILE)).is_file():
    saved = read_json_object(os.path.join(path, CONFIG_FILE), "a model config", _CONVERT_AGAIN)
  elif storage.path(os.path.join(path, "config.json")).is_file():
    saved = read_json_object(os.path.join(path, "config.json"), "a run's config", RESTORE_RUN_CONFIG).get("model")
  check_shapeless_fields(saved, model, path, name)


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


def load_init_params(path: str, name: str = "init_checkpoint", model: Mapping[str, Any] | None = None) -> Any:
  """Parameters to warm-start from, as host (numpy) arrays, which every process of a multi-host run can place on
  the mesh (`engine.Setup.replicate`): a `convert`/`save_pretrained` directory, or a training workdir: its best dev
  checkpoint when it is a fine-tuning run (the weights its scores were reported with), else its newest one.
  `name`: what the user passed `path` as, for the messages. `model`: the config.model the params go into, checked
  first by `check_same_function` (every caller that builds the model from the current config passes it)."""
  if model is not None:
    check_same_function(path, model, name)
  return jax.device_get(_load_init_params(path, name))


def _load_init_params(path: str, name: str) -> Any:
  if is_pretrained_dir(path):
    return load_pretrained(path)[1]
  best = read_best(path)
  if best is not None:
    weights = best_weights(path, best)
    _say(f"{name}={path}: loading the best dev checkpoint of the fine-tuning run (step {best['step']}, "
         f"{best['metric']} {best['value']:.4f}) from {weights}")
    return load_pretrained(weights)[1]
  ckpt_dir = checkpointing.checkpoint_dir(path)
  if storage.path(ckpt_dir).is_dir():
    ckpt = checkpointing.Checkpointer(ckpt_dir, 1, 1)
    found = ckpt.restore_newest_intact(ckpt.restore_params)
    if found is None:
      raise MissingFileError(f"No complete checkpoint in {ckpt_dir}; {name} needs a trained workdir.")
    _say(f"{name}={path}: loading its newest checkpoint (step {found[0]})")
    return found[1]
  raise MissingFileError(f"{name}={path!r} is neither a pretrained-weights directory (model_config.json + "
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
    raise InputError(f"{name} does not match the model's backbone:\n  " + "\n  ".join(backbone) +
                     "\nCheck --config.model (size, vocab_size, embedding_size) against the checkpoint's "
                     "model_config.json (a training workdir's: config.json).")
  if head:
    raise InputError(f"{name} holds no head trained for this task:\n  " + "\n  ".join(head) + f"\n{head_fix}")


def warm_start(loaded: Any, init_params: Callable) -> Callable:
  """`loaded` as an `engine.Job.warm_start` (merged into a fresh run's parameters by `merge_init_params`), checked
  now against the shapes of `init_params(rng)`, traced (nothing is computed): weights that misfit are refused at
  start-up, before the run writes anything into its workdir."""
  check_params(jax.eval_shape(lambda: nn.unbox(init_params(jax.random.key(0)))), loaded)
  return lambda params: merge_init_params(params, loaded)


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
