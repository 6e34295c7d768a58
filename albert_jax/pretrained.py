"""Standalone parameter checkpoints: what `albert_jax.convert` writes and `init_checkpoint` reads.

Layout of a directory: `model_config.json` (the ModelConfig fields), `params/` (an orbax PyTree checkpoint,
written to a temporary name and renamed when complete, so a crash never leaves a half-written `params/`) and, for
converted fine-tuned weights, `head.json` (what the head was trained for, as a fine-tuning workdir records it;
`head_identity` reads and judges those records).
`model_config.json` is removed first and written last, so a directory whose writing was cut short (kill -9 of a
`convert --overwrite`) is refused, never read as new params under the old config.
A training workdir's step checkpoints are read too (see `checkpointing.py`), and `merge_init_params` fits what
was read into a model's parameter tree (warm starts of pretraining and fine-tuning). `take_recorded` gives a run the
model and the tokenizer that the weights it loads were trained with.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any, Callable, Collection, Mapping

from absl import flags
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from albert_jax import checkpointing, families, storage
from albert_jax.checkpointing import local_restore_target
from albert_jax.errors import InputError, MissingFileError
from albert_jax.head_identity import SHAPELESS_FIELDS, check_shapeless_fields
from albert_jax.model_config import ModelConfig
from albert_jax.run import Run, as_run, run_of_weights
from albert_jax.run.best import read_best
from albert_jax.run.config import SHAPE_FIELDS
from albert_jax.run.layout import CONFIG_FILE as RUN_CONFIG_FILE, HEAD_FILE
from data_pipeline import records, tiny, wordpiece

CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"  # Hugging Face's, beside a converted folder's spiece.model
BACKBONE_FILE = "backbone.json"  # beside converted weights of a family other than the default: {"family": NAME}
_CONVERT_AGAIN = "convert the weights again (python -m albert_jax.convert)"
RESTORE_RUN_CONFIG = "restore it from a copy, or from the config.<step>.json that a resume kept there"


def save_pretrained(directory: str, model_config: ModelConfig, params: Any, head: dict | None = None,
                    family: str = families.DEFAULT) -> None:
  """`head`: the identity of the params' fine-tuned head (`HFHead.identity()` of converted weights), kept as
  HEAD_FILE so that eval, predict, warm starts and export read its classes in their trained order. `family`: the
  backbone's, kept as BACKBONE_FILE unless it is the default family (`backbone_family`)."""
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
                                                           _CONVERT_AGAIN))
  path = os.path.join(directory, PARAMS_DIR)
  with ocp.StandardCheckpointer() as checkpointer:
    params = checkpointer.restore(path, local_restore_target(checkpointer.metadata(path).item_metadata))
  return model_config, params


def check_same_function(path: str, model: Mapping[str, Any], name: str = "init_checkpoint") -> None:
  """Refuses weights at `path` whose recorded model (model_config.json of a converted directory, config.json of a
  training workdir) differs from `model` (the config.model they are about to be loaded into) in a field that no
  weight shape shows: they would load and compute another function (`head_identity.check_shapeless_fields`)."""
  check_shapeless_fields(recorded_model(path)[0], model, path, name)


def recorded_model(path: str) -> tuple[dict[str, Any] | None, str]:
  """The model recorded with the weights at `path` and the file recording it: model_config.json of a converted
  directory (or of a fine-tuning run's best/step_N), config.json of a training workdir; (None, "") without one."""
  if storage.path(os.path.join(path, CONFIG_FILE)).is_file():
    return read_json_object(os.path.join(path, CONFIG_FILE), "a model config", _CONVERT_AGAIN), CONFIG_FILE
  run = as_run(path)
  if storage.path(run.config).is_file():
    return _run_config(run).get("model"), RUN_CONFIG_FILE
  return None, ""


def _run_config(run: Run) -> dict[str, Any]:
  return read_json_object(run.config, "a run's config", RESTORE_RUN_CONFIG)


def tiny_data_dir(data_path: str, run: Run) -> str:
  """Where a run of data.kind=tiny builds the bundled dataset: data.path, else inside a local run's folder, else (a
  gs:// workdir) the loader's local cache, since ArrayRecord reads local files only."""
  if data_path:
    return data_path
  return tiny.DEFAULT_DIR if storage.is_remote(run.workdir) else run.tiny_data


def recorded_tokenizer(path: str) -> tuple[str, bool | None] | None:
  """(SentencePiece model, do_lower_case or None where unrecorded) that the weights at `path` were trained with:
  their run's data.spm_model, else the copy kept with its prepared data (the bundled tiny run's is built into its
  workdir), else a spiece.model or WordPiece vocab.txt kept beside converted weights (`convert --from=hf` carries
  it, with the Hugging Face tokenizer_config.json's do_lower_case); None where nothing names one (synthetic
  data)."""
  run = run_of_weights(path)
  data = _run_config(run).get("data", {}) if run else {}
  kind = data.get("kind")
  folder = (data.get("path", "") if kind == "prepared" else
            os.path.join(tiny_data_dir(data.get("path", ""), run), "prepared") if kind == "tiny" else "")
  manifest = os.path.join(folder, records.MANIFEST)
  prepared = (read_json_object(manifest, "a preparation's manifest", "prepare the data again")["tokenizer"]
              if folder and storage.path(manifest).is_file() else {})
  model = data.get("spm_model") or (os.path.join(folder, prepared["model"]) if prepared else "")
  if model:
    return model, data.get("do_lower_case", prepared.get("do_lower_case"))
  settings = os.path.join(path, HF_TOKENIZER_CONFIG)
  beside = next((os.path.join(path, name) for name in (records.SPM_MODEL, wordpiece.VOCAB_FILE)
                 if storage.path(os.path.join(path, name)).is_file()), None)
  if beside is None:
    return None
  lower = (read_json_object(settings, "a tokenizer config", _CONVERT_AGAIN).get("do_lower_case")
           if storage.path(settings).is_file() else None)
  return beside, lower


def backbone_family(path: str) -> str:
  """The name of the family of the weights at `path`: a training run's (or its best/step_N's) by its recorded config
  (`families.of_run`), converted weights' by their BACKBONE_FILE; the default family where neither says."""
  if run := run_of_weights(path):
    return families.of_run(_run_config(run)).name
  record = os.path.join(path, BACKBONE_FILE)
  if storage.path(record).is_file():
    return read_json_object(record, "a backbone record", _CONVERT_AGAIN).get("family", families.DEFAULT)
  return families.DEFAULT


def with_classifier_head(config: ml_collections.ConfigDict, path: str | None) -> ml_collections.ConfigDict:
  """`config` with classifier_head "auto" (`tasks.base.CLASSIFIER_HEADS`) made the head of the family of the
  weights at `path` where that is not the default family's head (said in one line); otherwise `config` itself,
  whose "auto" is the default family's head."""
  if config.get("classifier_head") != families.AUTO_HEAD or not path:
    return config
  family, default = families.get(_process_0s(backbone_family(path))), families.get(families.DEFAULT)
  if family.classifier_head == default.classifier_head:
    return config
  config = config.copy_and_resolve_references()
  config.classifier_head = family.classifier_head
  head = families.get(family.classifier_head)
  _say(f"classifier_head={head.name}: {path} holds an {family.title} backbone, so sequence classification takes "
       f"{head.title}'s head ({head.classifier_note}); --config.classifier_head={default.name}: {default.title}'s")
  return config


def with_recorded_model(config: ml_collections.ConfigDict, path: str | None):
  """`take_recorded` from the weights at `path` (those a fine-tuning, eval, predict or embed run loads), the
  `--config.<field>` overrides of this process's command line kept, said in one line; a config not parsed from the
  command line (built in Python) stays as it is but for its classifier head (`with_classifier_head`)."""
  parsed = flags.FLAGS.is_parsed() and "config" in flags.FLAGS and flags.FLAGS["config"].value is config
  config = with_classifier_head(config, path)
  if not (path and parsed):
    return config
  config, said = take_recorded(config, path, config_flags.get_override_values(flags.FLAGS["config"]))
  if said:
    _say(said)
  return config


def take_recorded(config: ml_collections.ConfigDict, path: str, explicit: Collection[str]
                  ) -> tuple[ml_collections.ConfigDict, str | None]:
  """`config` with what the weights at `path` fix and the command line left unset (`explicit`: the `a.b` names of
  its `--config.a.b` overrides): the config.model fields they fix and, when data.spm_model is empty, the tokenizer
  they were trained with; data.max_seq_length is capped at the model's max_position_embeddings. An explicit value
  stays, to be refused where it conflicts with the weights. Every process takes process 0's values. Returns
  (the config, one line saying what was taken from where, None when nothing was)."""
  model, model_file = recorded_model(path)
  fixed = dict.fromkeys(SHAPE_FIELDS + SHAPELESS_FIELDS)  # the shapes, and what no shape shows
  model = {k: model[k] for k in fixed if model and k in model and f"model.{k}" not in explicit}
  data = {}
  if not config.data.spm_model and (tokenizer := recorded_tokenizer(path)):
    data["spm_model"], lower = tokenizer
    if lower is not None and "do_lower_case" in config.data and "data.do_lower_case" not in explicit:
      data["do_lower_case"] = lower
  positions = model.get("max_position_embeddings", config.model.max_position_embeddings)
  if config.data.max_seq_length > positions and "data.max_seq_length" not in explicit:
    data["max_seq_length"] = positions
  model, data = _process_0s((model, data))
  # A copy with its references kept, resolved once updated: what a recipe computes from data.max_seq_length (its
  # micro batch cap, `experiments/common.cap_micro_batch`) follows the value taken here.
  config = copy.deepcopy(config)
  taken = {**{f"model.{k}": v for k, v in model.items() if config.model[k] != v},
           **{f"data.{k}": v for k, v in data.items() if config.data[k] != v}}
  config.update_from_flattened_dict(taken)
  return config.copy_and_resolve_references(), _said(taken, path, model_file) if taken else None


def _said(taken: dict[str, Any], path: str, model_file: str) -> str:
  """'model and tokenizer from PATH (config.json): hidden_size=128, ...; spm_model=...; data.max_seq_length=...'"""
  model = ", ".join(f"{k.removeprefix('model.')}={v}" for k, v in taken.items() if k.startswith("model."))
  tokenizer = ", ".join(f"{k.removeprefix('data.')}={v}" for k, v in taken.items()
                        if k in ("data.spm_model", "data.do_lower_case"))
  parts = []
  if model or tokenizer:
    what = "model and tokenizer" if model and tokenizer else "model" if model else "tokenizer"
    parts.append(f"{what} from {path}{f' ({model_file})' if model else ''}: {model or tokenizer}")
  if model and tokenizer:
    parts.append(tokenizer)
  if "data.max_seq_length" in taken:
    parts.append(f"data.max_seq_length={taken['data.max_seq_length']} (capped at the model's max_position_embeddings)")
  return "; ".join(parts)


def _process_0s(value: Any) -> Any:
  """Process 0's `value` (a JSON tree) on every process: hosts that read their own copies of a checkpoint's files
  must still build one model."""
  if jax.process_count() == 1:
    return value
  encoded = np.frombuffer(json.dumps(value).encode(), np.uint8)
  size = int(multihost_utils.broadcast_one_to_all(np.int32(encoded.size)))
  buffer = np.zeros(size, np.uint8)
  buffer[:min(size, encoded.size)] = encoded[:size]
  return json.loads(np.asarray(multihost_utils.broadcast_one_to_all(buffer)).tobytes().decode())


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
  params = jax.device_get(_load_init_params(path, name))
  family = families.family_of(params)
  if family.run_marker is not None:  # a run whose backbone is one part of what it trained
    _say(f"{name}={path} is an {family.title} run: {family.run_backbone_note}")
    return {families.BACKBONE_PARAMS: params[families.BACKBONE_PARAMS]}
  return params


def _load_init_params(path: str, name: str) -> Any:
  if is_pretrained_dir(path):
    return load_pretrained(path)[1]
  weights_run = as_run(path)
  best = read_best(weights_run)
  if best is not None:
    weights = weights_run.best_weights(best)
    _say(f"{name}={path}: loading the best dev checkpoint of the fine-tuning run (step {best['step']}, "
         f"{best['metric']} {best['value']:.4f}) from {weights}")
    return load_pretrained(weights)[1]
  ckpt_dir = weights_run.checkpoints
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
