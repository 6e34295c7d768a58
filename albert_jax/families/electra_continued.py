"""Continued pretraining of an ELECTRA pair: the warm start of an ELECTRA run (`electra_pretraining.train`) from a
discriminator folder (`init_checkpoint`) and its generator's (`electra.init_generator`).

The released layout is two folders: an ElectraForPreTraining (the discriminator, with the shared embeddings) and an
ElectraForMaskedLM (the generator as a model of its own: its encoder at `albert/encoder`, over the same embeddings).
Either may be a transformers folder or Hub name (converted as `init_checkpoint` is) or our converted folder;
`--from=tf1` of google-research/electra's checkpoints and `--to=hf` of a run write the generator in `generator/`
inside the discriminator's folder, which is where it is looked for when `electra.init_generator` is left empty. The
run's tree takes the generator's encoder at `generator/` and its head at `generator_predictions/`; without a
generator folder the generator starts fresh, as before.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from albert_jax import engine
from albert_jax.errors import InputError
from albert_jax.families.electra import GENERATOR
from albert_jax.families.electra_model import generator_config
from albert_jax.formats import hf
from albert_jax.formats.hf_electra import GENERATOR_DIR, GENERATOR_HEAD
from albert_jax.head_identity import SHAPELESS_FIELDS
from albert_jax.model_config import ModelConfig
from albert_jax.weights import loading, store
from albert_jax.weights.record import say

FLAG = "electra.init_generator"


def generator_folder(config: ml_collections.ConfigDict, discriminator_path: str) -> str | None:
  """Our folder of the generator to continue: `electra.init_generator` (a transformers folder or Hub name converted
  first), else the `generator/` folder inside the discriminator's, else None (the generator starts fresh)."""
  named = config.electra.get("init_generator", "")
  if named:
    folder = hf.converted(named, flag=FLAG, revision_flag=FLAG) or named
    if not store.is_pretrained_dir(folder):
      raise InputError(f"{FLAG}={named} is not a generator's weights: pass an ElectraForMaskedLM folder (transformers' "
                       "or converted by `python -m albert_jax.convert`), or leave it empty.")
    return folder
  beside = os.path.join(discriminator_path, GENERATOR_DIR)
  return beside if store.is_pretrained_dir(beside) else None


def pair_params(config: ml_collections.ConfigDict, discriminator: dict[str, Any], folder: str) -> dict[str, Any]:
  """The run's parameters from the discriminator's params and the generator folder `folder` (module docstring),
  refused in one line where the folder is not this run's generator (another width, head count or depth than
  `electra.generator_fraction` gives) or not the discriminator's pair (other embeddings)."""
  expected = generator_config(ModelConfig.from_mapping(config.model.to_dict()), config.electra.generator_fraction)
  found, params = store.load_pretrained(folder)
  differs = {k: (getattr(found, k), getattr(expected, k)) for k in ("hidden_size", "intermediate_size",
                                                                    *SHAPELESS_FIELDS)
             if getattr(found, k) != getattr(expected, k)}
  if differs:
    raise InputError(f"{FLAG}={folder} is a generator with " + ", ".join(
        f"{k}={a!r}" for k, (a, _) in differs.items()) + " but this run's (electra.generator_fraction="
        f"{config.electra.generator_fraction:g} of the discriminator) has " + ", ".join(
        f"{k}={b!r}" for k, (_, b) in differs.items()) + "; pass --config.electra.generator_fraction="
        f"{found.hidden_size / config.model.hidden_size:g} (its hidden size over the discriminator's).")
  same = jax.tree.map(np.array_equal, discriminator["albert"]["embeddings"], params["albert"]["embeddings"])
  if not all(jax.tree.leaves(same)):
    raise InputError(f"{FLAG}={folder}: its embeddings differ from init_checkpoint's; ELECTRA's pair shares one "
                     "embedding block, so the two folders are not one pair: pass the generator released with it.")
  return {**discriminator, GENERATOR: params["albert"]["encoder"], GENERATOR_HEAD: params[GENERATOR_HEAD]}


def pair_warm_start(config: ml_collections.ConfigDict, weights, job: engine.Job) -> Callable:
  """`pretrain.train`'s warm start of an ELECTRA run from `weights` (init_checkpoint's) and, where there is one, its
  generator folder, every generator parameter required; checked now, before the run writes anything."""
  folder = generator_folder(config, weights.path)
  if folder is None:
    return loading.warm_start(weights.params, job.init_params)
  loaded = pair_params(config, weights.params, folder)
  target = jax.eval_shape(lambda: nn.unbox(job.init_params(jax.random.key(0))))
  loading.check_params(target, loaded, required_prefix=GENERATOR, name=f"{FLAG}={folder}")
  say(f"init_checkpoint={weights.path}: continuing its pair with the generator of {folder}")
  return loading.warm_start(loaded, job.init_params)
