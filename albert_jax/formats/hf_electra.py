"""transformers' ELECTRA classes <-> our (ModelConfig, params): the ELECTRA family's column of the hf format.

Each class's names are its parts of the name table (`formats.names`, column HF_ELECTRA), over the parameter tree of
`electra_model.py`; the files are read and written by `hf_files`.

  ElectraForPreTraining  <-> {"albert", "discriminator_predictions"}   (the discriminator)
  ElectraForMaskedLM     <-> {"albert", "generator_predictions"}       (a generator on its own: its config is H_g's)
  ElectraModel           <-> {"albert"}
  ElectraForSequenceClassification <-> {"albert", "classifier": {"dense", "out_proj"}}   (`ElectraClassifier`)
  ElectraForQuestionAnswering      <-> {"albert", "qa_outputs"}                 (`tasks.heads.SpanExtractor`)
  ElectraForTokenClassification    <-> {"albert", "classifier"}                 (`tasks.heads.TokenClassifier`)
  ElectraForMultipleChoice         <-> {"albert", "sequence_summary": {"summary"}, "classifier"}
                                                                                (`ElectraMultipleChoice`)
An ELECTRA run (`electra_model.ElectraForPreTraining`'s tree) exports as the discriminator's ElectraForPreTraining
in the folder and its generator as an ElectraForMaskedLM in `generator/` inside it, both over the same embeddings.

What transformers' ELECTRA has no place for: our AlbertModel pooler (dropped on export; initialised as the model
initialises it on import, untrained, as in an ELECTRA run), layer sharing (HF ELECTRA has one weight set per layer:
refused), an identity E->H projection where E == H (HF has none then: refused). Its generator head applies exact
GELU whatever hidden_act says, so a generator is exported and imported with hidden_act "gelu" only; its
multiple-choice summary is read as ElectraConfig's defaults build it (`SUMMARY`), other summaries are refused.
A one-dense `classifier` without a `sequence_summary` exports as a token classifier where `save_hf`'s `head` says so.
"""
from __future__ import annotations

import os
from typing import Any

import flax.linen as nn
from flax import traverse_util
import jax
import numpy as np

from albert_jax import families, head_identity
from albert_jax.errors import InputError
from albert_jax.families.electra import ELECTRA, GENERATOR, HF_SEQUENCE_CLASSIFICATION as SEQUENCE_CLASSIFICATION
from albert_jax.families.electra_model import ElectraForPreTraining, generator_config
from albert_jax.formats import names
from albert_jax.formats.hf_files import ACTIVATIONS, Path, check_shape, read_config, read_tensors, write_folder
from albert_jax.head_identity import HFHead
from albert_jax.model import abstract_params
from albert_jax.model_config import ModelConfig

PRETRAINING, MASKED_LM, BACKBONE, QUESTION_ANSWERING, TOKEN_CLASSIFICATION, MULTIPLE_CHOICE = (
    ELECTRA.hf_class(role) for role in (families.PRETRAINING, families.MASKED_LM, families.BACKBONE,
                                        families.QUESTION_ANSWERING, families.TOKEN_CLASSIFICATION,
                                        families.MULTIPLE_CHOICE))
DISCRIMINATOR_HEAD, GENERATOR_HEAD = "discriminator_predictions", "generator_predictions"
CLASSIFIER = "classifier"  # ELECTRA's classification head, named as transformers names it
GENERATOR_DIR = "generator"  # where an ELECTRA run's generator goes inside the exported folder
# ElectraConfig's defaults, for config.json files that leave a field out.
_HF_DEFAULTS = {"vocab_size": 30522, "embedding_size": 128, "hidden_size": 256, "num_hidden_layers": 12,
                "num_attention_heads": 4, "intermediate_size": 1024, "hidden_act": "gelu",
                "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512,
                "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12}
_OURS_TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu"}
_BUFFERS = ("electra.embeddings.position_ids", "electra.embeddings.token_type_ids")
_TIED = "generator_lm_head.weight"
_POOLER = ("albert", "pooler")
# ElectraForMultipleChoice's summary as `ElectraMultipleChoice` computes it (ElectraConfig's defaults).
SUMMARY = {"summary_type": "first", "summary_use_proj": True, "summary_activation": "gelu"}
POOLER_NOTE = ("an ELECTRA run leaves it untrained too; sequence classification takes ELECTRA's head, which reads no "
               "pooler, and a head that reads it trains it")


# The parts of the name table (`formats.names`) that each transformers class holds.
_PARTS = {PRETRAINING: names.ENCODER_PARTS + (names.DISCRIMINATOR,), BACKBONE: names.ENCODER_PARTS,
          SEQUENCE_CLASSIFICATION: names.ENCODER_PARTS + (names.CLASSIFIER,),
          MASKED_LM: names.ENCODER_PARTS + (names.GENERATOR,),
          QUESTION_ANSWERING: names.ENCODER_PARTS + (names.QA_OUTPUTS,),
          TOKEN_CLASSIFICATION: names.ENCODER_PARTS + (names.DENSE_CLASSIFIER,),
          MULTIPLE_CHOICE: names.ENCODER_PARTS + (names.SEQUENCE_SUMMARY, names.DENSE_CLASSIFIER)}


def _name_map(c: ModelConfig, architecture: str, encoder: Path = names.ENCODER) -> list[tuple[Path, str, bool]]:
  """(our path, the `architecture` class's key, transpose?) of each parameter; the decoder of ElectraForMaskedLM
  (`generator_lm_head.weight`) is tied to the word embeddings and has no entry."""
  return names.name_map(names.HF_ELECTRA, c, _PARTS[architecture], encoder)


def holds_classifier(params: Any) -> bool:
  """Whether our params hold ELECTRA's classification head (ALBERT's `classifier` is one dense: kernel, bias)."""
  return "out_proj" in (params.get(CLASSIFIER) or {})


def holds_heads(params: Any) -> bool:
  """Whether our params hold a head only ELECTRA has (a run's, a converted discriminator's or generator's, its
  classifier's or multiple-choice scorer's)."""
  return bool({GENERATOR, DISCRIMINATOR_HEAD, GENERATOR_HEAD, names.SEQUENCE_SUMMARY} & set(params)) or (
      holds_classifier(params))


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
  """ModelConfig of a transformers ElectraConfig dict: one weight set per layer (sharing "none")."""
  hf = {**_HF_DEFAULTS, **hf}
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise InputError(f"config.json has position_embedding_type={hf['position_embedding_type']!r}; albert_jax only "
                     "implements absolute position embeddings.")
  if hf["hidden_act"] not in ACTIVATIONS:
    raise InputError(f"config.json has hidden_act={hf['hidden_act']!r}; supported: "
                     f"{sorted(ACTIVATIONS)}.")
  fields = {k: hf[k] for k in _HF_DEFAULTS} | {"hidden_act": ACTIVATIONS[hf["hidden_act"]]}
  return ModelConfig(**fields, sharing="none")


def config_to_hf(c: ModelConfig, architecture: str, dtype: str) -> dict[str, Any]:
  """config.json of `c` as the transformers class `architecture`; refuses what HF ELECTRA cannot hold."""
  if c.sharing != "none" or c.inner_group_num != 1:
    raise InputError(f"model.sharing={c.sharing!r}, inner_group_num={c.inner_group_num}: transformers' ELECTRA has "
                     "one weight set per layer, so a shared-layer model has no ELECTRA equivalent; export a run "
                     "trained with sharing=none.")
  if c.has_embedding_projection and c.embedding_size == c.hidden_size:
    raise InputError(f"model.embedding_projection=True with embedding_size == hidden_size ({c.hidden_size}): "
                     "transformers' ELECTRA projects embeddings only where E != H; export a model without it.")
  if architecture == MASKED_LM and c.hidden_act != "gelu":
    raise InputError(f"The generator has hidden_act={c.hidden_act!r}; transformers' ElectraForMaskedLM head always "
                     "applies exact GELU, so only a hidden_act='gelu' generator exports to it.")
  fields = {k: getattr(c, k) for k in _HF_DEFAULTS} | {"hidden_act": _OURS_TO_HF_ACTIVATION[c.hidden_act]}
  return {"architectures": [architecture], "model_type": ELECTRA.hf_model_type, **fields,
          "position_embedding_type": "absolute", "tie_word_embeddings": True, "dtype": dtype,
          **(SUMMARY if architecture == MULTIPLE_CHOICE else {})}


def _check_summary(hf: dict[str, Any], path: str) -> None:
  """Refuses an ElectraForMultipleChoice whose config.json builds another summary than `SUMMARY`."""
  fields = {**SUMMARY, "summary_proj_to_labels": False}
  said = lambda values: ", ".join(f"{k}={v!r}" for k, v in values.items())
  differs = {k: hf[k] for k, v in fields.items() if k in hf and hf[k] != v}
  if differs:
    raise InputError(f"{path}: config.json has {said(differs)}; albert_jax's ELECTRA multiple-choice scorer "
                     f"computes the summary of {said(fields)} only.")


def initialised_pooler(c: ModelConfig) -> dict[Path, np.ndarray]:
  """The pooler as our model initialises it (HF ELECTRA has none; fine-tuning trains it)."""
  kernel = jax.nn.initializers.truncated_normal(c.initializer_range)(jax.random.key(0), (c.hidden_size,) * 2)
  return {_POOLER + ("kernel",): np.asarray(kernel, np.float32),
          _POOLER + ("bias",): np.zeros(c.hidden_size, np.float32)}


def load_hf(path: str) -> tuple[ModelConfig, dict[str, Any]]:
  """Reads a transformers ELECTRA folder (any class of the module docstring) as (ModelConfig, float32 numpy params);
  see the module docstring for the trees. What a fine-tuned head was trained for is
  `head_identity.hf_head_from_config`'s."""
  path = os.path.abspath(path)
  hf_config = read_config(path)
  c = config_from_hf(hf_config)
  architecture = (hf_config.get("architectures") or [BACKBONE])[0]
  tensors = read_tensors(path)
  if architecture == BACKBONE:  # ElectraModel's keys have no "electra." prefix
    tensors = {k if k.startswith("electra.") else f"electra.{k}": v for k, v in tensors.items()}
  if architecture == MASKED_LM and c.hidden_act != "gelu":
    raise InputError(f"{path}: hidden_act={hf_config['hidden_act']!r}, but ElectraForMaskedLM's head applies exact "
                     "GELU whatever it says, which our generator head cannot reproduce; only 'gelu' loads.")
  if architecture not in _PARTS:
    raise InputError(f"{path}: config.json names {architecture}; the ELECTRA classes read here are "
                     f"{', '.join(_PARTS)}.")
  if architecture == MULTIPLE_CHOICE:
    _check_summary(hf_config, path)
  params = initialised_pooler(c)
  for ours, key, transpose in _name_map(c, architecture):
    if key not in tensors:
      raise InputError(f"{path}: parameter {key} (ours {'/'.join(ours)}) is missing from the checkpoint; config.json "
                       "does not describe these weights.")
    value = np.asarray(tensors.pop(key), np.float32)
    params[ours] = np.ascontiguousarray(value.T if transpose else value)
  word = params[("albert", "embeddings", "word_embeddings", "embedding")]
  if _TIED in tensors and not np.array_equal(tensors.pop(_TIED), word):
    raise InputError(f"{path}: {_TIED} differs from the word embeddings; albert_jax ties the generator's decoder to "
                     "them, so untied weights cannot be loaded.")
  for key in _BUFFERS:
    tensors.pop(key, None)
  if tensors:
    raise InputError(f"{path}: parameters {sorted(tensors)[:5]} have no place in {architecture} as config.json "
                     "describes it; the config does not describe these weights.")
  head = head_identity.hf_head_from_config(hf_config, path)
  _check_shapes(c, params, architecture, path, 1 if architecture == MULTIPLE_CHOICE else head.num_labels if head
                else 0)
  return c, traverse_util.unflatten_dict(params)


def pair_shapes(c: ModelConfig) -> dict[Path, tuple[int, ...]]:
  """The shape of each parameter of an ELECTRA pair of `c`'s width (built with fraction 1: its generator tower is
  `c`'s too), without allocating."""
  abstract = nn.unbox(abstract_params(ElectraForPreTraining(c, 1.0)))
  return {p: tuple(x.shape) for p, x in traverse_util.flatten_dict(abstract).items()}


def _check_shapes(c: ModelConfig, params: dict[Path, np.ndarray], architecture: str, where: str,
                  num_labels: int) -> None:
  """Every tensor in the shape our model gives it (an ELECTRA pair of `c`'s width built with fraction 1; a
  classifier, token classifier or multiple-choice scorer of `num_labels` outputs, a span extractor of 2)."""
  shapes = pair_shapes(c)
  h = c.hidden_size
  for layer, outputs in (((CLASSIFIER, "dense"), h), ((CLASSIFIER, "out_proj"), num_labels),
                         ((names.SEQUENCE_SUMMARY, "summary"), h), ((CLASSIFIER,), num_labels),
                         ((names.QA_OUTPUTS,), 2)):
    shapes.update({layer + ("kernel",): (h, outputs), layer + ("bias",): (outputs,)})
  for path, value in params.items():
    expected = shapes[(GENERATOR,) + path[2:] if architecture == MASKED_LM and path[:2] == ("albert", "encoder")
                      else path]
    check_shape("/".join(path), path, value.shape, expected, where)


def popped_tensors(mapping: list[tuple[Path, str, bool]], flat: dict[Path, np.ndarray]) -> dict[str, np.ndarray]:
  """HF tensors of `mapping`, each popped from `flat`."""
  tensors = {}
  for ours, key, transpose in mapping:
    if ours not in flat:
      raise InputError(f"params lack {'/'.join(ours)} (HF {key}), which the model config requires.")
    value = flat.pop(ours)
    tensors[key] = np.ascontiguousarray(value.T if transpose else value)
  return tensors


def save_hf(c: ModelConfig, params: Any, path: str, generator_fraction: float | None = None,
            head: HFHead | None = None) -> list[str]:
  """Writes `params` as transformers ELECTRA folders (module docstring): `path`, and `path/generator` for an
  ELECTRA run's generator (`generator_fraction`: the run's electra.generator_fraction). `head`: what a classifier
  was trained for (a task's `hf_head`, or a converted folder's), its class names becoming id2label; without it a
  one-output classifier is a regression. Returns the folders. Every refusal comes before anything is written."""
  flat = {p: np.asarray(x) for p, x in traverse_util.flatten_dict(nn.unbox(params)).items()}
  dtype = np.result_type(*flat.values()).name
  for key in (_POOLER + ("kernel",), _POOLER + ("bias",)):
    flat.pop(key, None)
  folders = {}  # folder -> (tensors, config.json)
  if GENERATOR in params:
    if generator_fraction is None:
      raise InputError("params hold an ELECTRA generator but no generator fraction names its width; export the run's "
                       "workdir, whose config.json records electra.generator_fraction.")
    g = generator_config(c, generator_fraction)
    shared = {p: v for p, v in flat.items() if p[:2] == ("albert", "embeddings")}
    hf = config_to_hf(g, MASKED_LM, dtype)
    folders[os.path.join(path, GENERATOR_DIR)] = (popped_tensors(_name_map(g, MASKED_LM, (GENERATOR,)), flat), hf)
    flat.update(shared)  # the discriminator's too
  architecture = _architecture(flat, head)
  hf = config_to_hf(c, architecture, dtype)
  hf.update(_classifier_fields(head, architecture, flat))
  tensors = popped_tensors(_name_map(c, architecture), flat)
  if architecture == BACKBONE:  # as transformers saves ElectraModel: without the "electra." prefix
    tensors = {k.removeprefix("electra."): v for k, v in tensors.items()}
  if flat:
    raise InputError(f"params have entries that an HF {architecture} has no place for: "
                     f"{sorted('/'.join(p) for p in flat)[:5]}.")
  folders = {path: (tensors, hf), **folders}
  for folder, (tensors, hf) in folders.items():
    write_folder(folder, tensors, hf)
  return list(folders)


def _architecture(flat: dict[Path, np.ndarray], head: HFHead | None) -> str:
  """The class of our params: the one `head` names (what the task trained), else the one their heads tell."""
  if head is not None and head.architecture in _PARTS:
    return head.architecture
  heads = {p[0] for p in flat}
  if GENERATOR_HEAD in heads and DISCRIMINATOR_HEAD not in heads:
    return MASKED_LM
  if (CLASSIFIER, "out_proj", "bias") in flat:
    return SEQUENCE_CLASSIFICATION
  if names.QA_OUTPUTS in heads:
    return QUESTION_ANSWERING
  if names.SEQUENCE_SUMMARY in heads:
    return MULTIPLE_CHOICE
  return PRETRAINING if DISCRIMINATOR_HEAD in heads else BACKBONE


# Where each classifier keeps its output layer's bias, which counts its outputs.
_OUTPUT_BIAS = {SEQUENCE_CLASSIFICATION: (CLASSIFIER, "out_proj", "bias"), TOKEN_CLASSIFICATION: (CLASSIFIER, "bias")}


def _classifier_fields(head: HFHead | None, architecture: str, flat: dict[Path, np.ndarray]) -> dict[str, Any]:
  """config.json's id2label, label2id and problem_type of a classifier (sequence or token) trained as `head`, with
  the outputs its params have; nothing for the other classes."""
  if architecture not in _OUTPUT_BIAS:
    return {}
  outputs = flat.get(_OUTPUT_BIAS[architecture], np.zeros(0)).shape[0]
  head = head or HFHead(architecture)
  if head.architecture != architecture or (head.labels and len(head.labels) != outputs):
    raise InputError(f"params hold ELECTRA's classification head with {outputs} outputs, but its task names "
                     f"{head.architecture} with labels {head.labels}; export the run's workdir as it was trained.")
  return head_identity.hf_config_fields(head, outputs)
