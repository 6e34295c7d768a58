"""transformers' ALBERT classes <-> our (ModelConfig, params): the ALBERT family's column of the hf format.

Follows the name mapping of transformers' `load_tf_weights_in_albert` (REFERENCE d.8), the name table's HF_ALBERT
column (`formats.names`), so that loading and saving cannot drift apart. A BERT-shaped model without layer sharing
leaves as ALBERT classes with one group per layer.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from absl import logging
import flax.linen as nn
from flax import traverse_util
import numpy as np

from albert_jax import families, head_identity
from albert_jax import model as model_lib
from albert_jax.errors import InputError
from albert_jax.families import BACKBONE, PRETRAINING
from albert_jax.families.albert import ALBERT
from albert_jax.formats.hf_files import (ACTIVATIONS, Path, check_shape, read_config, read_tensors,
                                         write_folder)
from albert_jax.formats.names import HF_ALBERT, name_map
from albert_jax.head_identity import (HF_HEAD_PARAMS, MASKED_LM, QUESTION_ANSWERING, TOKEN_CLASSIFICATION,
                                      HFHead)
from albert_jax.model_config import ModelConfig

# HF `AlbertConfig` defaults (REFERENCE b.1), for config.json files that leave a field out.
_HF_DEFAULTS = {"vocab_size": 30000, "embedding_size": 128, "hidden_size": 4096, "num_hidden_layers": 12,
                "num_hidden_groups": 1, "num_attention_heads": 64, "intermediate_size": 16384,
                "inner_group_num": 1, "hidden_act": "gelu_new", "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.0, "max_position_embeddings": 512, "type_vocab_size": 2,
                "initializer_range": 0.02, "layer_norm_eps": 1e-12}
# Non-persistent buffers that older transformers versions wrote into checkpoints.
_HF_BUFFERS = ("albert.embeddings.position_ids", "albert.embeddings.token_type_ids")
_HEADS = ("predictions", "sop_classifier")
_POOLER = ("albert.pooler.weight", "albert.pooler.bias")  # absent from the NO_POOLER classes
NO_POOLER = (QUESTION_ANSWERING, TOKEN_CLASSIFICATION, MASKED_LM)  # HF builds these without the pooler


def holds_heads(params: Any) -> bool:
  """Whether our params hold one of ALBERT's heads (its `classifier` is one dense: kernel, bias)."""
  return bool({*_HEADS, "qa_outputs"} & set(params)) or "kernel" in (params.get("classifier") or {})


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
  if hf.get("model_type", ALBERT.hf_model_type) != ALBERT.hf_model_type:
    types = ", ".join(sorted(family.hf_model_type for family in families.all_families()))
    raise InputError(f"config.json has model_type={hf['model_type']!r}, which ALBERT's classes cannot read; the model "
                     f"types read here are {types}, each by `convert --from=hf` (or `hf.from_hf`), which reads a "
                     "folder with its family's classes.")
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise InputError(f"config.json has position_embedding_type={hf['position_embedding_type']!r}; albert_jax only "
                     "implements absolute position embeddings (the original ALBERT's).")
  if not hf.get("tie_word_embeddings", True):
    raise InputError("config.json has tie_word_embeddings=false; albert_jax's MLM decoder is always tied to the "
                     "word embeddings (as in the original ALBERT).")
  if hf["hidden_act"] not in ACTIVATIONS:
    raise InputError(f"config.json has hidden_act={hf['hidden_act']!r}; supported: {sorted(ACTIVATIONS)}.")
  fields = {k: hf[k] for k in _HF_DEFAULTS}
  fields["hidden_act"] = ACTIVATIONS[hf["hidden_act"]]
  # HF always has the E->H projection, even when E == H.
  c = ModelConfig(**fields, sharing="all", embedding_projection=True)
  _check_groups(c)
  return c


def _hf_layout(c: ModelConfig) -> ModelConfig:
  """Our config as HF lays it out: E->H projection always present, `sharing="none"` (BERT) as one group per layer."""
  if c.position_offset:
    raise InputError(f"model.position_offset={c.position_offset}: transformers' ALBERT counts positions from 0; "
                     "export the run as RoBERTa (its config's model_family=roberta) or train with position_offset=0.")
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
  return {"model_type": ALBERT.hf_model_type, **{k: getattr(layout, k) for k in _HF_DEFAULTS},
          "tie_word_embeddings": True}


def _expected_shapes(c: ModelConfig) -> dict[Path, tuple[int, ...]]:
  """Our param shapes for `c` (from model.py itself, without allocating), keyed by path."""
  abstract = nn.unbox(model_lib.abstract_params(model_lib.AlbertForPreTraining(c)))
  shapes = {path: tuple(x.shape) for path, x in traverse_util.flatten_dict(abstract).items()}
  mapped = {path for path, _, _ in name_map(HF_ALBERT, c)}
  if mapped != set(shapes):
    raise RuntimeError(f"the HF ALBERT names are out of sync with model.py: only in the model "
                       f"{sorted(set(shapes) - mapped)}, only in the map {sorted(mapped - set(shapes))}.")
  return shapes


def load_hf(path: str) -> tuple[ModelConfig, dict[str, Any]]:
  """Reads a transformers ALBERT directory (config.json + weights) as (ModelConfig, float32 numpy params).

  Returns the heads the checkpoint has: an `AlbertForPreTraining` gives {"albert", "predictions",
  "sop_classifier"}, an `AlbertForMaskedLM` no "sop_classifier", and an `AlbertModel` the backbone only
  ({"albert": ...}); initialise missing heads before calling `AlbertForPreTraining`. The fine-tuned heads of
  `AlbertFor{SequenceClassification,MultipleChoice,TokenClassification}` give "classifier", of
  `AlbertForQuestionAnswering` "qa_outputs" (the fine-tuning tasks' param names); what the head was trained for
  (class names, problem type) is `hf.read_head`'s. The classes in NO_POOLER (masked LM, QA, token classification)
  have no pooler, which their heads never use: it is loaded as zeros. Weights are upcast to float32 (lossless).
  The head count is invisible in the weights: it comes from config.json alone.
  """
  path = os.path.abspath(path)
  hf_config = read_config(path)
  c = config_from_hf(hf_config)
  architecture = (hf_config.get("architectures") or [""])[0]
  tensors = read_tensors(path)
  if "albert.embeddings.word_embeddings.weight" not in tensors:  # AlbertModel: keys have no "albert." prefix
    tensors = {f"albert.{k}": v for k, v in tensors.items()}
  heads = {h for h in _HEADS if any(k.startswith(h + ".") for k in tensors)}
  shapes = _expected_shapes(c)
  params = {}
  for ours, key, transpose in name_map(HF_ALBERT, c):
    if ours[0] != "albert" and ours[0] not in heads:
      continue
    if key in _POOLER and key not in tensors and architecture in NO_POOLER:
      params[ours] = np.zeros(shapes[ours], np.float32)
      continue
    if key not in tensors:
      raise InputError(f"{path}: parameter {key} (ours {'/'.join(ours)}) is missing from the checkpoint.")
    value = tensors.pop(key)
    check_shape(key, ours, value.shape, shapes[ours][::-1] if transpose else shapes[ours], path)
    params[ours] = np.ascontiguousarray(value.T if transpose else value, dtype=np.float32)
  word, bias = params[("albert", "embeddings", "word_embeddings", "embedding")], params.get(("predictions", "bias"))
  for key, tied_to in (("predictions.decoder.weight", word), ("predictions.decoder.bias", bias)):
    if key in tensors and not np.array_equal(tensors.pop(key), tied_to):
      raise InputError(f"{path}: {key} differs from the tensor it should be tied to; albert_jax ties the MLM "
                       "decoder to the word embeddings and predictions.bias, so untied weights cannot be loaded.")
  if architecture in HF_HEAD_PARAMS and f"{HF_HEAD_PARAMS[architecture]}.weight" in tensors:
    name = HF_HEAD_PARAMS[architecture]
    weight, bias = tensors.pop(f"{name}.weight"), tensors.pop(f"{name}.bias")
    check_shape(f"{name}.weight", (name, "kernel"), weight.shape[1:], (c.hidden_size,), path)
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


def save_hf(model_config: ModelConfig, params: Any, path: str, head: HFHead | None = None) -> None:
  """Writes config.json + model.safetensors that transformers' `AlbertForPreTraining.from_pretrained` loads, or,
  for fine-tuned params, the `AlbertFor{SequenceClassification,QuestionAnswering,MultipleChoice,
  TokenClassification}` of `head`.

  `params` may be boxed (nn.Partitioned) and may lack heads (backbone only: the file is an `AlbertModel`, and
  `AlbertForPreTraining.from_pretrained` initialises the missing heads; the masked LM head alone: an
  `AlbertForMaskedLM`, which has no pooler). Without an E->H projection (E == H and `embedding_projection` off) an
  identity projection is written, which HF requires and which changes nothing. `head` (a task's `hf_head`, or a
  converted directory's `hf.read_head`) is needed only for a one-output `classifier`, which is a regression or a
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
  for ours, key, transpose in name_map(HF_ALBERT, layout):
    if ours[0] != "albert" and ours[0] not in heads:
      continue
    if ours not in flat:
      raise InputError(f"params lack {'/'.join(ours)} (HF {key}), which the model config requires.")
    value = flat.pop(ours)
    check_shape(key, ours, value.shape, shapes[ours], "params")
    tensors[key] = np.ascontiguousarray(value.T if transpose else value)
  if flat:
    raise InputError(f"params have entries that the model config does not describe or that an HF ALBERT checkpoint "
                     f"has no place for: {sorted('/'.join(p) for p in flat)}.")
  if head is not None:
    tensors.update(head_tensors)
  architecture = (head.architecture if head is not None else ALBERT.hf_class(PRETRAINING) if "sop_classifier" in heads
                  else MASKED_LM if "predictions" in heads else ALBERT.hf_class(BACKBONE))
  if architecture in NO_POOLER:  # HF's class has no pooler to load it into
    tensors = {k: v for k, v in tensors.items() if k not in _POOLER}
  write_folder(path, tensors, {"architectures": [architecture], **hf_config, **head_config, "dtype": dtype.name})


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
  check_shape(f"{name}.weight", (name, "kernel"), kernel.shape, (c.hidden_size, expected), "params")
  tensors = {f"{name}.weight": np.ascontiguousarray(kernel.T), f"{name}.bias": np.asarray(bias)}
  return head, tensors, head_identity.hf_config_fields(head, outputs)
