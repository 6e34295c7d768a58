"""Parameters to start from: loaded from a pretrained-weights folder or a training run, checked against a model's
tree and merged into it (warm starts of pretraining and fine-tuning)."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax import checkpointing, families, storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.run import as_run
from albert_jax.run.best import read_best
from albert_jax.weights.record import check_same_function, say
from albert_jax.weights.store import is_pretrained_dir, load_pretrained

BACKBONE = "albert/"


def load_init_params(path: str, name: str = "init_checkpoint", model: Mapping[str, Any] | None = None,
                     given: str = "") -> Any:
  """Parameters to warm-start from, as host (numpy) arrays, which every process of a multi-host run can place on
  the mesh (`engine.Setup.replicate`): a `convert`/`save_pretrained` directory, or a training workdir: its best dev
  checkpoint when it is a fine-tuning run (the weights its scores were reported with), else its newest one.
  `name`: what the user passed `path` as, for the messages (with `given`, the value it gave where `path` is its
  conversion). `model`: the config.model the params go into, checked first by `check_same_function` (every caller
  that builds the model from the current config passes it)."""
  if model is not None:
    check_same_function(path, model, name, given)
  params = jax.device_get(load_params(path, name))
  family = families.family_of(params)
  if family.run_marker is not None:  # a run whose backbone is one part of what it trained
    say(f"{name}={path} is an {family.title} run: {family.run_backbone_note}")
    return {families.BACKBONE_PARAMS: params[families.BACKBONE_PARAMS]}
  return params


def load_params(path: str, name: str) -> Any:
  """The params at `path` whole (an ELECTRA run's generator too): a pretrained-weights folder's, a fine-tuning
  run's best dev checkpoint's, else a run's newest checkpoint's; `name` names `path` in the messages."""
  if is_pretrained_dir(path):
    return load_pretrained(path)[1]
  weights_run = as_run(path)
  best = read_best(weights_run)
  if best is not None:
    weights = weights_run.best_weights(best)
    say(f"{name}={path}: loading the best dev checkpoint of the fine-tuning run (step {best['step']}, "
         f"{best['metric']} {best['value']:.4f}) from {weights}")
    return load_pretrained(weights)[1]
  ckpt_dir = weights_run.checkpoints
  if storage.path(ckpt_dir).is_dir():
    ckpt = checkpointing.Checkpointer(ckpt_dir, 1, 1)
    found = ckpt.restore_newest_intact(ckpt.restore_params)
    if found is None:
      raise MissingFileError(f"No complete checkpoint in {ckpt_dir}; {name} needs a trained workdir.")
    say(f"{name}={path}: loading its newest checkpoint (step {found[0]})")
    return found[1]
  raise not_weights(path, name)


def not_weights(path: str, name: str) -> MissingFileError:
  """The one-line refusal of a `path` that holds no weights, `name` the flag that named it."""
  return MissingFileError(f"{name}={path!r} is neither a pretrained-weights directory (model_config.json + "
                          "params/, from `python -m albert_jax.convert`) nor a training workdir (checkpoints/).")


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
