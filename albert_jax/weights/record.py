"""What was recorded with weights, read once into a `Recorded` value (`read`): the model (a converted folder's
model_config.json, a run's config.json), the tokenizer they were trained with, their family; and `take_recorded`,
which gives a run the model and the tokenizer of the weights it loads, the command line's explicit values kept.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
from typing import Any, Collection, Mapping

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from albert_jax import families, storage
from albert_jax.errors import MissingFileError
from albert_jax.head_identity import SHAPELESS_FIELDS, check_same_model
from albert_jax.run import Run, as_run, run_of_weights
from albert_jax.run import config as run_config
from albert_jax.run.config import SHAPE_FIELDS
from albert_jax.run.layout import CONFIG_FILE as RUN_CONFIG_FILE
from albert_jax.weights.store import (BACKBONE_FILE, CONFIG_FILE, CONVERT_AGAIN, HF_TOKENIZER_CONFIG,
                                      RESTORE_RUN_CONFIG, read_json_object)
from data_pipeline import records, tiny, wordpiece

PASS_WORKDIR = "pass a training workdir as albert_jax.main wrote it"


def check_same_function(path: str, model: Mapping[str, Any], name: str = "init_checkpoint", given: str = "") -> None:
  """Refuses weights at `path` whose recorded model (model_config.json of a converted directory, config.json of a
  training workdir) differs from `model` (the config.model they are about to be loaded into) in a field of their
  parameter tree or one that no weight shape shows (`head_identity.check_same_model`): an override that would load
  them into another model. The refusal names them as `name`=`given` where `path` is the conversion of `given`."""
  check_same_model(recorded_model(path)[0], model, f"{name}={given or path}")


def recorded_model(path: str) -> tuple[dict[str, Any] | None, str]:
  """The model recorded with the weights at `path` and the file recording it: model_config.json of a converted
  directory (or of a fine-tuning run's best/step_N), config.json of a training workdir; (None, "") without one."""
  if storage.path(os.path.join(path, CONFIG_FILE)).is_file():
    return read_json_object(os.path.join(path, CONFIG_FILE), "a model config", CONVERT_AGAIN), CONFIG_FILE
  run = as_run(path)
  if storage.path(run.config).is_file():
    return _run_config(run).get("model"), RUN_CONFIG_FILE
  return None, ""


def recorded_config(path: str, flag: str) -> dict[str, Any]:
  """The config that the weights at `path` record: their run's config.json (the folder's, or of the run whose
  best/step_N it is) with the model recorded with them (`recorded_model`); a converted folder's model alone. A run
  whose checkpoints have no config.json beside them is refused: nothing names their model."""
  model, _ = recorded_model(path)
  if model is None:
    raise MissingFileError(f"{flag}={path} has checkpoints/ but no config.json, which names the run's model: "
                           f"{PASS_WORKDIR} (config.json next to checkpoints/).")
  run = run_of_weights(path)
  return {**(run_config.read(run, flag, PASS_WORKDIR) if run else {}), "model": model}


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
  workdir), else the tokenizer file kept beside converted weights (`wordpiece.folder_tokenizer_file`: `convert
  --from=hf` carries it, with the Hugging Face tokenizer_config.json's do_lower_case); None where nothing names one
  (synthetic data)."""
  run = run_of_weights(path)
  data = _run_config(run).get("data", {}) if run else {}
  kind = data.get("kind")
  folder = (data.get("path", "") if kind == "prepared" else
            tiny.prepared_dir(tiny_data_dir(data.get("path", ""), run), tiny.tokenizer_kind(data))
            if kind == "tiny" else "")
  manifest = os.path.join(folder, records.MANIFEST)
  prepared = (read_json_object(manifest, "a preparation's manifest", "prepare the data again")["tokenizer"]
              if folder and storage.path(manifest).is_file() else {})
  model = data.get("spm_model") or (os.path.join(folder, prepared["model"]) if prepared else "")
  if model:
    return model, data.get("do_lower_case", prepared.get("do_lower_case"))
  settings = os.path.join(path, HF_TOKENIZER_CONFIG)
  if (name := wordpiece.folder_tokenizer_file(path)) is None:
    return None
  beside = os.path.join(path, name)
  lower = (read_json_object(settings, "a tokenizer config", CONVERT_AGAIN).get("do_lower_case")
           if storage.path(settings).is_file() else None)
  return beside, lower


@dataclasses.dataclass(frozen=True)
class Recorded:
  """What was recorded with the weights at `path`, read once (`read`): their model (a converted folder's
  model_config.json, a run's config.json; None without one) and the file holding it, their family, the tokenizer
  they were trained with (`recorded_tokenizer`)."""
  path: str
  model: dict[str, Any] | None
  model_file: str
  family: families.Family
  tokenizer: tuple[str, bool | None] | None


def read(path: str) -> Recorded:
  """The record of the weights at `path`, process 0's on every process; a damaged record is refused in one line."""
  model, model_file = recorded_model(path)
  return Recorded(path, model, model_file, families.get(process_0s(backbone_family(path))), recorded_tokenizer(path))


def backbone_family(path: str) -> str:
  """The name of the family of the weights at `path`: a training run's (or its best/step_N's) by its recorded config
  (`families.of_run`), converted weights' by their BACKBONE_FILE; the default family where neither says."""
  if run := run_of_weights(path):
    return families.of_run(_run_config(run)).name
  record = os.path.join(path, BACKBONE_FILE)
  if storage.path(record).is_file():
    return read_json_object(record, "a backbone record", CONVERT_AGAIN).get("family", families.DEFAULT)
  return families.DEFAULT


def with_classifier_head(config: ml_collections.ConfigDict, recorded: Recorded | None) -> ml_collections.ConfigDict:
  """`config` with classifier_head "auto" (`tasks.base.CLASSIFIER_HEADS`) made the head of the family of the
  `recorded` weights where that is not the default family's head (said in one line); otherwise `config` itself,
  whose "auto" is the default family's head."""
  if config.get("classifier_head") != families.AUTO_HEAD or recorded is None:
    return config
  family, default, path = recorded.family, families.get(families.DEFAULT), recorded.path
  if family.classifier_head == default.classifier_head:
    return config
  config = config.copy_and_resolve_references()
  config.classifier_head = family.classifier_head
  head = families.get(family.classifier_head)
  say(f"classifier_head={head.name}: {path} holds an {family.title} backbone, so sequence classification takes "
       f"{head.title}'s head ({head.classifier_note}); --config.classifier_head={default.name}: {default.title}'s")
  return config


def take_recorded(config: ml_collections.ConfigDict, recorded: Recorded, explicit: Collection[str]
                  ) -> tuple[ml_collections.ConfigDict, str | None]:
  """`config` with what the `recorded` weights fix and the command line left unset (`explicit`: the `a.b` names of
  its `--config.a.b` overrides): the config.model fields they fix and, when data.spm_model is empty, the tokenizer
  they were trained with; data.max_seq_length is capped at the model's max_position_embeddings. An explicit value
  stays, to be refused where it conflicts with the weights. Every process takes process 0's values. Returns
  (the config, one line saying what was taken from where, None when nothing was)."""
  model = recorded.model
  fixed = dict.fromkeys(SHAPE_FIELDS + SHAPELESS_FIELDS)  # the shapes, and what no shape shows
  model = {k: model[k] for k in fixed if model and k in model and f"model.{k}" not in explicit}
  data = {}
  if not config.data.spm_model and (tokenizer := recorded.tokenizer):
    data["spm_model"], lower = tokenizer
    if lower is not None and "do_lower_case" in config.data and "data.do_lower_case" not in explicit:
      data["do_lower_case"] = lower
  positions = (model.get("max_position_embeddings", config.model.max_position_embeddings)
               - model.get("position_offset", config.model.get("position_offset", 0)))
  if config.data.max_seq_length > positions and "data.max_seq_length" not in explicit:
    data["max_seq_length"] = positions
  model, data = process_0s((model, data))
  # A copy with its references kept, resolved once updated: what a recipe computes from data.max_seq_length (its
  # micro batch cap, `experiments/common.cap_micro_batch`) follows the value taken here.
  config = copy.deepcopy(config)
  taken = {**{f"model.{k}": v for k, v in model.items() if config.model[k] != v},
           **{f"data.{k}": v for k, v in data.items() if config.data[k] != v}}
  config.update_from_flattened_dict(taken)
  return config.copy_and_resolve_references(), _said(taken, recorded.path, recorded.model_file) if taken else None


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


def process_0s(value: Any) -> Any:
  """Process 0's `value` (a JSON tree) on every process: hosts that read their own copies of a checkpoint's files
  must still build one model."""
  if jax.process_count() == 1:
    return value
  encoded = np.frombuffer(json.dumps(value).encode(), np.uint8)
  size = int(multihost_utils.broadcast_one_to_all(np.int32(encoded.size)))
  buffer = np.zeros(size, np.uint8)
  buffer[:min(size, encoded.size)] = encoded[:size]
  return json.loads(np.asarray(multihost_utils.broadcast_one_to_all(buffer)).tobytes().decode())


def say(line: str) -> None:
  if jax.process_index() == 0:
    print(line, flush=True)
