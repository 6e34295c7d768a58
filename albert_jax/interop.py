"""Hugging Face `transformers` ALBERT checkpoints <-> our (ModelConfig, params).

Follows the name mapping of transformers' `load_tf_weights_in_albert` (REFERENCE d.8), written out as one explicit
table (`name_map`) so that loading and saving cannot drift apart. Reads config.json and the weights directly
(safetensors, or torch for pytorch_model.bin), so loading needs neither transformers nor, for safetensors, torch.
The TF1 names are documented in docs/checkpoints.md.
"""
from __future__ import annotations

import json
import os
import pickle
import warnings
from typing import Any, Mapping

from absl import logging
import flax.linen as nn
from flax import traverse_util
import ml_collections
import numpy as np
import safetensors.numpy

from albert_jax import head_identity, pretrained, storage, weight_files
from albert_jax import model as model_lib
from albert_jax.errors import EnvironmentUserError, InputError, MissingFileError
from albert_jax.head_identity import (HF_HEAD_PARAMS, MASKED_LM, QUESTION_ANSWERING, TOKEN_CLASSIFICATION,
                                      HFHead)
from albert_jax.model_config import ModelConfig
from albert_jax.run import Run
from albert_jax.tasks import get_task

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
_REFETCH = "fetch the checkpoint again, or re-save it with transformers' save_pretrained (safetensors)"

# HF `AlbertConfig` defaults (REFERENCE b.1), for config.json files that leave a field out.
_HF_DEFAULTS = {"vocab_size": 30000, "embedding_size": 128, "hidden_size": 4096, "num_hidden_layers": 12,
                "num_hidden_groups": 1, "num_attention_heads": 64, "intermediate_size": 16384,
                "inner_group_num": 1, "hidden_act": "gelu_new", "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.0, "max_position_embeddings": 512, "type_vocab_size": 2,
                "initializer_range": 0.02, "layer_norm_eps": 1e-12}
# HF activation name -> ours. gelu_pytorch_tanh is the same tanh formula as gelu_new, fused in torch.
_HF_ACTIVATIONS = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
# Non-persistent buffers that older transformers versions wrote into checkpoints.
_HF_BUFFERS = ("albert.embeddings.position_ids", "albert.embeddings.token_type_ids")
_HEADS = ("predictions", "sop_classifier")
_POOLER = ("albert.pooler.weight", "albert.pooler.bias")  # absent from the NO_POOLER classes
NO_POOLER = (QUESTION_ANSWERING, TOKEN_CLASSIFICATION, MASKED_LM)  # HF builds these without the pooler

Path = tuple[str, ...]


def _linear(ours: Path, hf: str) -> list[tuple[Path, str, bool]]:
  # torch.nn.Linear stores weight [out, in]; flax Dense kernel is [in, out].
  return [(ours + ("kernel",), f"{hf}.weight", True), (ours + ("bias",), f"{hf}.bias", False)]


def _layer_norm(ours: Path, hf: str) -> list[tuple[Path, str, bool]]:
  return [(ours + ("scale",), f"{hf}.weight", False), (ours + ("bias",), f"{hf}.bias", False)]


def name_map(c: ModelConfig) -> list[tuple[Path, str, bool]]:
  """(our param path, HF `AlbertForPreTraining` state_dict key, transpose?) for every parameter.

  The HF decoder (`predictions.decoder.{weight,bias}`) is tied to `albert.embeddings.word_embeddings.weight` and
  `predictions.bias`, so it has no entry of its own.
  """
  m = [(("albert", "embeddings", f"{n}_embeddings", "embedding"), f"albert.embeddings.{n}_embeddings.weight", False)
       for n in ("word", "position", "token_type")]
  m += _layer_norm(("albert", "embeddings", "LayerNorm"), "albert.embeddings.LayerNorm")
  m += _linear(("albert", "encoder", "embedding_hidden_mapping_in"), "albert.encoder.embedding_hidden_mapping_in")
  for g in range(c.num_hidden_groups):
    for i in range(c.inner_group_num):
      ours = ("albert", "encoder", f"group_{g}", f"inner_{i}")
      hf = f"albert.encoder.albert_layer_groups.{g}.albert_layers.{i}"
      for n in ("query", "key", "value", "dense"):
        m += _linear(ours + ("attention", n), f"{hf}.attention.{n}")
      m += _layer_norm(ours + ("attention", "LayerNorm"), f"{hf}.attention.LayerNorm")
      m += _linear(ours + ("ffn", "intermediate"), f"{hf}.ffn")
      m += _linear(ours + ("ffn", "output"), f"{hf}.ffn_output")
      m += _layer_norm(ours + ("ffn", "LayerNorm"), f"{hf}.full_layer_layer_norm")
  m += _linear(("albert", "pooler"), "albert.pooler")
  m += _linear(("predictions", "dense"), "predictions.dense")
  m += _layer_norm(("predictions", "LayerNorm"), "predictions.LayerNorm")
  m.append((("predictions", "bias"), "predictions.bias", False))
  # sop_classifier.classifier.weight is [2, H]: transposed like every Linear.
  m += _linear(("sop_classifier",), "sop_classifier.classifier")
  return m


def _check_groups(c: ModelConfig) -> None:
  """HF picks layer l's group as int(l / (L / G)); refuse the (L, G) where its float rounding differs from ours."""
  L, G = c.num_hidden_layers, c.num_hidden_groups
  if any(int(layer / (L / G)) != layer * G // L for layer in range(L)):
    raise InputError(f"num_hidden_layers={L} with num_hidden_groups={G}: transformers assigns layers to groups as "
                     f"int(l / (L / G)), whose float rounding differs from the exact floor(l * G / L) used here, so "
                     "the two would compute different functions; use a num_hidden_groups that divides "
                     "num_hidden_layers.")


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
  """ModelConfig from a transformers AlbertConfig dict; raises on what our model cannot represent."""
  hf = {**_HF_DEFAULTS, **hf}
  if hf.get("model_type", "albert") != "albert":
    raise InputError(f"config.json has model_type={hf['model_type']!r}; only 'albert' checkpoints can be loaded.")
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise InputError(f"config.json has position_embedding_type={hf['position_embedding_type']!r}; albert_jax only "
                     "implements absolute position embeddings (the original ALBERT's).")
  if not hf.get("tie_word_embeddings", True):
    raise InputError("config.json has tie_word_embeddings=false; albert_jax's MLM decoder is always tied to the "
                     "word embeddings (as in the original ALBERT).")
  if hf["hidden_act"] not in _HF_ACTIVATIONS:
    raise InputError(f"config.json has hidden_act={hf['hidden_act']!r}; supported: {sorted(_HF_ACTIVATIONS)}.")
  fields = {k: hf[k] for k in _HF_DEFAULTS}
  fields["hidden_act"] = _HF_ACTIVATIONS[hf["hidden_act"]]
  # HF always has the E->H projection, even when E == H.
  c = ModelConfig(**fields, sharing="all", embedding_projection=True)
  _check_groups(c)
  return c


def _hf_layout(c: ModelConfig) -> ModelConfig:
  """Our config as HF lays it out: E->H projection always present, `sharing="none"` (BERT) as one group per layer."""
  if c.sharing not in ("all", "none"):
    raise InputError(f"model.sharing={c.sharing!r} has no transformers equivalent (HF ALBERT only shares whole "
                     "layers); export a model with sharing 'all' or 'none'.")
  groups = c.num_hidden_layers if c.sharing == "none" else c.num_hidden_groups
  layout = c.replace(embedding_projection=True, sharing="all", num_hidden_groups=groups)
  _check_groups(layout)
  return layout


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  """The transformers AlbertConfig dict (config.json) of `c`, less `architectures` and `dtype`."""
  layout = _hf_layout(c)
  return {"model_type": "albert", **{k: getattr(layout, k) for k in _HF_DEFAULTS}, "tie_word_embeddings": True}


def _expected_shapes(c: ModelConfig) -> dict[Path, tuple[int, ...]]:
  """Our param shapes for `c` (from model.py itself, without allocating), keyed by path."""
  abstract = nn.unbox(model_lib.abstract_params(model_lib.AlbertForPreTraining(c)))
  shapes = {path: tuple(x.shape) for path, x in traverse_util.flatten_dict(abstract).items()}
  mapped = {path for path, _, _ in name_map(c)}
  if mapped != set(shapes):
    raise RuntimeError(f"interop.name_map is out of sync with model.py: only in the model "
                       f"{sorted(set(shapes) - mapped)}, only in the map {sorted(mapped - set(shapes))}.")
  return shapes


def _read_tensors(path: str) -> dict[str, np.ndarray]:
  if os.path.isfile(os.path.join(path, SAFETENSORS_FILE)):
    return weight_files.read_safetensors(os.path.join(path, SAFETENSORS_FILE))
  if os.path.isfile(os.path.join(path, SAFETENSORS_INDEX)):  # sharded checkpoint
    return {k: v for name in _shard_files(path) for k, v in weight_files.read_safetensors(name).items()}
  if os.path.isfile(os.path.join(path, TORCH_FILE)):
    return _read_torch(os.path.join(path, TORCH_FILE))
  raise MissingFileError(f"No weights in {path!r}: expected {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or "
                         f"{TORCH_FILE} (as written by transformers' save_pretrained).")


def _shard_files(path: str) -> list[str]:
  """The shards that the index of a sharded checkpoint names, each refused unless it is a file name in `path`
  itself, as transformers writes them: a crafted index must not make us open `../../etc/passwd` or `/etc/passwd`."""
  index = os.path.join(path, SAFETENSORS_INDEX)
  weight_map = pretrained.read_json_object(index, "a safetensors index", _REFETCH).get("weight_map")
  if not isinstance(weight_map, dict):
    raise InputError(f"{index} has no weight_map (each tensor's shard file); {_REFETCH}.")
  outside = sorted({str(name) for name in weight_map.values()
                    if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name})
  if outside:
    raise InputError(f"{index} names shard files outside {path}: {outside}; an index names files in its own "
                     f"folder only: {_REFETCH}.")
  return [os.path.join(path, name) for name in sorted(set(weight_map.values()))]


def _read_torch(file: str) -> dict[str, np.ndarray]:
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
                     f"builds tensors only, and nothing in the file was run): {_REFETCH}.") from None
  if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
    raise InputError(f"{file} is not a PyTorch state dict: it holds a {type(state).__name__} of other objects than "
                     f"tensors; {_REFETCH}.")
  return {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in state.items()}


def _check_shape(key: str, path: Path, found: tuple[int, ...], expected: tuple[int, ...], where: str) -> None:
  if tuple(found) != tuple(expected):
    raise InputError(f"{where}: parameter {key} (ours {'/'.join(path)}) has shape {list(found)}, but the config "
                     f"expects {list(expected)}; the config does not describe these weights (check vocab_size, "
                     "embedding_size, hidden_size, intermediate_size, num_hidden_groups, inner_group_num).")


def load_hf(path: str) -> tuple[ModelConfig, dict[str, Any]]:
  """Reads a transformers ALBERT directory (config.json + weights) as (ModelConfig, float32 numpy params).

  Returns the heads the checkpoint has: an `AlbertForPreTraining` gives {"albert", "predictions",
  "sop_classifier"}, an `AlbertForMaskedLM` no "sop_classifier", and an `AlbertModel` the backbone only
  ({"albert": ...}); initialise missing heads before calling `AlbertForPreTraining`. The fine-tuned heads of
  `AlbertFor{SequenceClassification,MultipleChoice,TokenClassification}` give "classifier", of
  `AlbertForQuestionAnswering` "qa_outputs" (the fine-tuning tasks' param names); what the head was trained for
  (class names, problem type) is `read_head`'s. The classes in NO_POOLER (masked LM, QA, token classification)
  have no pooler, which their heads never use: it is loaded as zeros. Weights are upcast to float32 (lossless).
  The head count is invisible in the weights: it comes from config.json alone.
  """
  path = os.path.abspath(path)
  hf_config = _read_config(path)
  c = config_from_hf(hf_config)
  architecture = (hf_config.get("architectures") or [""])[0]
  tensors = _read_tensors(path)
  if "albert.embeddings.word_embeddings.weight" not in tensors:  # AlbertModel: keys have no "albert." prefix
    tensors = {f"albert.{k}": v for k, v in tensors.items()}
  heads = {h for h in _HEADS if any(k.startswith(h + ".") for k in tensors)}
  shapes = _expected_shapes(c)
  params = {}
  for ours, key, transpose in name_map(c):
    if ours[0] != "albert" and ours[0] not in heads:
      continue
    if key in _POOLER and key not in tensors and architecture in NO_POOLER:
      params[ours] = np.zeros(shapes[ours], np.float32)
      continue
    if key not in tensors:
      raise InputError(f"{path}: parameter {key} (ours {'/'.join(ours)}) is missing from the checkpoint.")
    value = tensors.pop(key)
    _check_shape(key, ours, value.shape, shapes[ours][::-1] if transpose else shapes[ours], path)
    params[ours] = np.ascontiguousarray(value.T if transpose else value, dtype=np.float32)
  word, bias = params[("albert", "embeddings", "word_embeddings", "embedding")], params.get(("predictions", "bias"))
  for key, tied_to in (("predictions.decoder.weight", word), ("predictions.decoder.bias", bias)):
    if key in tensors and not np.array_equal(tensors.pop(key), tied_to):
      raise InputError(f"{path}: {key} differs from the tensor it should be tied to; albert_jax ties the MLM "
                       "decoder to the word embeddings and predictions.bias, so untied weights cannot be loaded.")
  if architecture in HF_HEAD_PARAMS and f"{HF_HEAD_PARAMS[architecture]}.weight" in tensors:
    name = HF_HEAD_PARAMS[architecture]
    weight, bias = tensors.pop(f"{name}.weight"), tensors.pop(f"{name}.bias")
    _check_shape(f"{name}.weight", (name, "kernel"), weight.shape[1:], (c.hidden_size,), path)
    params[(name, "kernel")] = np.ascontiguousarray(weight.T, dtype=np.float32)
    params[(name, "bias")] = np.asarray(bias, dtype=np.float32)
  for key in _HF_BUFFERS:
    tensors.pop(key, None)
  ours_left = sorted(k for k in tensors if k.split(".")[0] in ("albert",) + _HEADS)
  if ours_left:
    raise InputError(f"{path}: unexpected parameters {ours_left} for the architecture in config.json "
                     f"(num_hidden_groups={c.num_hidden_groups}, inner_group_num={c.inner_group_num}); the config "
                     "does not describe these weights.")
  if tensors:
    logging.warning("load_hf(%s): skipping parameters albert_jax has no module for: %s", path, sorted(tensors))
  return c, traverse_util.unflatten_dict(params)


def _read_config(path: str) -> dict[str, Any]:
  config_path = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(config_path):
    raise MissingFileError(f"{config_path} not found; point to a directory written by transformers' "
                           "save_pretrained (config.json + model.safetensors or pytorch_model.bin).")
  return pretrained.read_json_object(config_path, "a transformers config", _REFETCH)


def read_head(path: str) -> HFHead | None:
  """What the fine-tuned head of a transformers directory was trained for (`head_identity.hf_head_from_config`
  of its config.json; None for the pretraining and backbone classes)."""
  return head_identity.hf_head_from_config(_read_config(os.path.abspath(path)), path)


def save_hf(model_config: ModelConfig, params: Any, path: str, head: HFHead | None = None) -> None:
  """Writes config.json + model.safetensors that transformers' `AlbertForPreTraining.from_pretrained` loads, or,
  for fine-tuned params, the `AlbertFor{SequenceClassification,QuestionAnswering,MultipleChoice,
  TokenClassification}` of `head`.

  `params` may be boxed (nn.Partitioned) and may lack heads (backbone only: the file is an `AlbertModel`, and
  `AlbertForPreTraining.from_pretrained` initialises the missing heads; the masked LM head alone: an
  `AlbertForMaskedLM`, which has no pooler). Without an E->H projection (E == H and `embedding_projection` off) an
  identity projection is written, which HF requires and which changes nothing. `head` (a task's `hf_head`, or a
  converted directory's `read_head`) is needed only for a one-output `classifier`, which is a regression or a
  multiple choice scorer, and for a token classifier; its labels become config.json's id2label.
  """
  c = model_config
  hf_config = config_to_hf(c)
  layout = _hf_layout(c)
  flat = {p: np.asarray(x) for p, x in traverse_util.flatten_dict(nn.unbox(params)).items()}
  head_identity.check_hf_exportable({p[0] for p in flat})
  mapping = ("albert", "encoder", "embedding_hidden_mapping_in")
  dtype = np.result_type(*flat.values())  # of the identity projection and config.json
  if not c.has_embedding_projection:
    flat[mapping + ("kernel",)] = np.eye(c.embedding_size, c.hidden_size, dtype=dtype)
    flat[mapping + ("bias",)] = np.zeros(c.hidden_size, dtype)
  head, head_tensors, head_config = _finetuned_head(flat, head, c)
  heads = {p[0] for p in flat} & set(_HEADS)
  shapes = _expected_shapes(layout)
  tensors = {}
  for ours, key, transpose in name_map(layout):
    if ours[0] != "albert" and ours[0] not in heads:
      continue
    if ours not in flat:
      raise InputError(f"params lack {'/'.join(ours)} (HF {key}), which the model config requires.")
    value = flat.pop(ours)
    _check_shape(key, ours, value.shape, shapes[ours], "params")
    tensors[key] = np.ascontiguousarray(value.T if transpose else value)
  if flat:
    raise InputError(f"params have entries that the model config does not describe or that an HF ALBERT checkpoint "
                     f"has no place for: {sorted('/'.join(p) for p in flat)}.")
  if head is not None:
    tensors.update(head_tensors)
  architecture = (head.architecture if head is not None else "AlbertForPreTraining" if "sop_classifier" in heads
                  else MASKED_LM if "predictions" in heads else "AlbertModel")
  if architecture in NO_POOLER:  # HF's class has no pooler to load it into
    tensors = {k: v for k, v in tensors.items() if k not in _POOLER}
  _write_hf(path, tensors, {"architectures": [architecture], **hf_config, **head_config, "dtype": dtype.name})


def _write_hf(path: str, tensors: dict[str, np.ndarray], hf_config: dict[str, Any]) -> None:
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


def _finetuned_head(flat: dict[Path, np.ndarray], head: HFHead | None,
                    c: ModelConfig) -> tuple[HFHead | None, dict[str, np.ndarray], dict[str, Any]]:
  """Pops a fine-tuning head from `flat`: (its HFHead, its HF tensors, its config.json fields)."""
  names = sorted({p[0] for p in flat} & {"classifier", "qa_outputs"})
  if not names:
    if head is not None:
      raise InputError(f"{head.architecture} needs a {HF_HEAD_PARAMS[head.architecture]!r} head; params have "
                       f"{sorted({p[0] for p in flat})}.")
    return None, {}, {}
  if len(names) > 1 or {p[0] for p in flat} & set(_HEADS):
    raise InputError(f"params hold several heads {sorted({p[0] for p in flat} - {'albert'})}; an HF checkpoint "
                     "holds one model class: export one head.")
  name = names[0]
  kernel, bias = flat.pop((name, "kernel")), flat.pop((name, "bias"))
  outputs = kernel.shape[-1]
  head, expected = head_identity.hf_head_for(name, outputs, head)
  _check_shape(f"{name}.weight", (name, "kernel"), kernel.shape, (c.hidden_size, expected), "params")
  tensors = {f"{name}.weight": np.ascontiguousarray(kernel.T), f"{name}.bias": np.asarray(bias)}
  return head, tensors, head_identity.hf_config_fields(head, outputs)


def finetuned_head(weights_dir: str) -> HFHead | None:
  """The HF head of fine-tuned weights (`head_identity.finetuned_head`): a converted directory's, or for weights
  kept in a workdir (`WORKDIR/best/step_N`) the task named by the workdir's config.json; None for any other."""
  return head_identity.finetuned_head(weights_dir, _run_task)


def _run_task(workdir: str):
  """The fine-tuning task of a training workdir's config.json; None when it has none (or is no fine-tuning run)."""
  config_path = Run(workdir).config
  if not storage.path(config_path).is_file():
    return None
  config = ml_collections.ConfigDict(pretrained.read_json_object(config_path, "a run's config",
                                                                 pretrained.RESTORE_RUN_CONFIG))
  return get_task(config) if "task" in config else None
