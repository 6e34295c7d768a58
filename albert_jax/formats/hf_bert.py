"""transformers' BERT and RoBERTa classes <-> our (ModelConfig, params): both families' columns of the hf format.

The two lay out the same BertLayer stack and differ in their prefix, their MLM head's names, RoBERTa's positions
(counted past its padding index: `ModelConfig.position_offset` = pad_token_id + 1) and their sequence
classifier, so one `Layout` per family holds what differs. Each class's names are its parts of the name table
(`formats.names`, columns HF_BERT and HF_ROBERTA), over the tree of `model.AlbertForPreTraining` and the
fine-tuning heads (`tasks/heads.py`):

  <P>Model                 <-> {"albert"}                                   (keys without the "bert."/"roberta.")
  BertForPreTraining       <-> {"albert", "predictions", "sop_classifier"}  (NSP: our sentence task's head)
  <P>ForMaskedLM           <-> {"albert", "predictions"}                    (no pooler)
  BertForSequenceClassification, <P>ForMultipleChoice <-> {"albert", "classifier": {kernel, bias}} (on the pooler)
  RobertaForSequenceClassification <-> {"albert", "classifier": {"dense", "out_proj"}} (first token, tanh; no pooler)
  <P>ForTokenClassification <-> {"albert", "classifier"}; <P>ForQuestionAnswering <-> {"albert", "qa_outputs"}
The classes without a pooler leave ours unwritten and bring it in as the model initialises it (`hf_electra`'s).
What they cannot hold is refused: layer sharing, an E->H projection (BERT's embeddings are H wide), BERT with a
position offset; RobertaForMaskedLM's head applies exact GELU whatever hidden_act says. A RoBERTa run's
sentence-order head, which its objective leaves untrained (no sentence task), is not written.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import flax.linen as nn
from flax import traverse_util
import numpy as np

from albert_jax import families, head_identity
from albert_jax.errors import InputError
from albert_jax.families import (BACKBONE, MASKED_LM, MULTIPLE_CHOICE, PRETRAINING, QUESTION_ANSWERING,
                                 SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, Family)
from albert_jax.families.bert import BERT
from albert_jax.families.roberta import ROBERTA
from albert_jax.formats import names
from albert_jax.formats.hf_electra import initialised_pooler, popped_tensors
from albert_jax.formats.hf_files import ACTIVATIONS, Path, check_shape, read_config, read_tensors, write_folder
from albert_jax.head_identity import HFHead
from albert_jax.model import AlbertForPreTraining, abstract_params
from albert_jax.model_config import ModelConfig

# BertConfig's and RobertaConfig's defaults, for config.json files that leave a field out.
_DEFAULTS = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
             "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
             "initializer_range": 0.02, "layer_norm_eps": 1e-12}
_OURS_TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu"}
POOLER = ("albert", "pooler")
CLASSIFIER, QA = "classifier", "qa_outputs"  # the one-dense heads, named as transformers names them
_ENCODER_AND_POOLER = names.ENCODER_PARTS + (names.POOLER,)


@dataclasses.dataclass(frozen=True)
class Layout:
  """What a family's transformers classes name and compute differently."""
  family: Family
  column: names.Column
  prefix: str                # the backbone's key prefix in every class but <P>Model
  decoder: str               # its MLM decoder, tied to the word embeddings and the head's bias
  vocab_size: int            # its config class's default
  pad_token_id: int          # its config class's default
  counts_past_padding: bool  # positions start at pad_token_id + 1 (RoBERTa), else at 0
  pooled_classifier: bool    # its sequence classifier is a dense on the pooler (BERT), else the first-token head
  mlm_activation: str | None  # what its MLM head applies whatever hidden_act says; None: hidden_act

  def parts(self, role: str) -> tuple[str, ...]:
    """The parts of the name table the class of `role` holds (its one-dense head is outside the table)."""
    return {BACKBONE: _ENCODER_AND_POOLER, PRETRAINING: _ENCODER_AND_POOLER + (names.PREDICTIONS, names.SOP),
            MASKED_LM: names.ENCODER_PARTS + (names.PREDICTIONS,), QUESTION_ANSWERING: names.ENCODER_PARTS,
            TOKEN_CLASSIFICATION: names.ENCODER_PARTS, MULTIPLE_CHOICE: _ENCODER_AND_POOLER,
            SEQUENCE_CLASSIFICATION: _ENCODER_AND_POOLER if self.pooled_classifier
            else names.ENCODER_PARTS + (names.CLASSIFIER,)}[role]

  def dense_head(self, role: str) -> str | None:
    """The one-dense head of the class of `role` (`classifier` or `qa_outputs`), None where it has none."""
    if role == SEQUENCE_CLASSIFICATION and not self.pooled_classifier:
      return None
    return {QUESTION_ANSWERING: QA, TOKEN_CLASSIFICATION: CLASSIFIER, MULTIPLE_CHOICE: CLASSIFIER,
            SEQUENCE_CLASSIFICATION: CLASSIFIER}.get(role)

  def holds_heads(self, params: Any) -> bool:
    """Whether our params hold a head one of this family's classes has."""
    classifier = set(params.get(CLASSIFIER) or {})
    return bool({"predictions", QA} & set(params) or "kernel" in classifier
                or (not self.pooled_classifier and "out_proj" in classifier)
                or (PRETRAINING in self.family.roles and "sop_classifier" in params))

  def config_from_hf(self, hf: dict[str, Any], where: str) -> ModelConfig:
    """ModelConfig of a transformers BertConfig / RobertaConfig dict: one weight set per layer, E = H."""
    hf = {**_DEFAULTS, "vocab_size": self.vocab_size, "pad_token_id": self.pad_token_id, **hf}
    if (hf.get("position_embedding_type") or "absolute") != "absolute":
      raise InputError(f"{where} has position_embedding_type={hf['position_embedding_type']!r}; albert_jax only "
                       "implements absolute position embeddings.")
    if hf.get("is_decoder") or not hf.get("tie_word_embeddings", True):
      raise InputError(f"{where} describes a decoder or an MLM decoder untied from the word embeddings; albert_jax "
                       "reads encoders whose decoder is the word embeddings (as released).")
    if hf["hidden_act"] not in ACTIVATIONS:
      raise InputError(f"{where} has hidden_act={hf['hidden_act']!r}; supported: {sorted(ACTIVATIONS)}.")
    fields = {k: hf[k] for k in _DEFAULTS} | {"hidden_act": ACTIVATIONS[hf["hidden_act"]]}
    pad = self.pad_token_id if hf["pad_token_id"] is None else hf["pad_token_id"]
    offset = pad + 1 if self.counts_past_padding else 0
    return ModelConfig(**fields, embedding_size=hf["hidden_size"], sharing="none", position_offset=offset)

  def config_to_hf(self, c: ModelConfig, architecture: str, dtype: str) -> dict[str, Any]:
    """config.json of `c` as the class `architecture`; refuses what the family's classes cannot hold."""
    title = self.family.title
    if c.sharing != "none" or c.inner_group_num != 1:
      raise InputError(f"model.sharing={c.sharing!r}, inner_group_num={c.inner_group_num}: transformers' {title} "
                       "has one weight set per layer; export a run trained with sharing=none.")
    if c.has_embedding_projection or c.embedding_size != c.hidden_size:
      raise InputError(f"model.embedding_size={c.embedding_size} with hidden_size={c.hidden_size} (or "
                       f"embedding_projection=True): transformers' {title} has H-wide embeddings and no projection; "
                       "export a model with embedding_size == hidden_size.")
    if self.counts_past_padding and not c.position_offset:
      raise InputError(f"model.position_offset=0: transformers' {title} counts positions from its padding index "
                       "+ 1; export a model trained with position_offset >= 1 (RoBERTa's: 2).")
    if not self.counts_past_padding and c.position_offset:
      raise InputError(f"model.position_offset={c.position_offset}: transformers' {title} counts positions from 0; "
                       "export it as RoBERTa (--config.model_family=roberta) or train with position_offset=0.")
    if self.family.role_of(architecture) == MASKED_LM and self.mlm_activation not in (None, c.hidden_act):
      raise InputError(f"hidden_act={c.hidden_act!r}: transformers' {architecture} head always applies "
                       f"{self.mlm_activation}, so only a hidden_act={self.mlm_activation!r} model exports to it.")
    pad = c.position_offset - 1 if self.counts_past_padding else self.pad_token_id
    fields = {k: getattr(c, k) for k in _DEFAULTS} | {"hidden_act": _OURS_TO_HF_ACTIVATION[c.hidden_act]}
    return {"architectures": [architecture], "model_type": self.family.hf_model_type, **fields, "pad_token_id": pad,
            "position_embedding_type": "absolute", "tie_word_embeddings": True, "dtype": dtype}

  def _name_map(self, c: ModelConfig, role: str) -> list[tuple[Path, str, bool]]:
    return names.name_map(self.column, c, self.parts(role))

  def load_hf(self, path: str) -> tuple[ModelConfig, dict[str, Any]]:
    """Reads a transformers folder of one of the family's classes (module docstring) as (ModelConfig, float32
    numpy params). What a fine-tuned head was trained for is `head_identity.hf_head_from_config`'s."""
    path = os.path.abspath(path)
    hf_config = read_config(path)
    c = self.config_from_hf(hf_config, os.path.join(path, "config.json"))
    architecture = (hf_config.get("architectures") or [self.family.hf_class(BACKBONE)])[0]
    role = self.family.role_of(architecture)
    if role is None:
      raise InputError(f"{path}: config.json names {architecture}; the {self.family.title} classes read here are "
                       f"{', '.join(self.family.hf_classes())}.")
    tensors = read_tensors(path)
    if role == BACKBONE:  # <P>Model's keys have no prefix
      tensors = {k if k.startswith(f"{self.prefix}.") else f"{self.prefix}.{k}": v for k, v in tensors.items()}
    params = {} if names.POOLER in self.parts(role) else initialised_pooler(c)
    head = self.dense_head(role)
    dense_head = [((head, "kernel"), f"{head}.weight", True), ((head, "bias"), f"{head}.bias", False)] if head else []
    for ours, key, transpose in self._name_map(c, role) + dense_head:
      if key not in tensors:
        raise InputError(f"{path}: parameter {key} (ours {'/'.join(ours)}) is missing from the checkpoint; "
                         "config.json does not describe these weights.")
      value = np.asarray(tensors.pop(key), np.float32)
      params[ours] = np.ascontiguousarray(value.T if transpose else value)
    self._pop_tied(tensors, params, path)
    for buffer in ("position_ids", "token_type_ids"):
      tensors.pop(f"{self.prefix}.embeddings.{buffer}", None)
    if tensors:
      raise InputError(f"{path}: parameters {sorted(tensors)[:5]} have no place in {architecture} as config.json "
                       "describes it; the config does not describe these weights.")
    trained = head_identity.hf_head_from_config(hf_config, path)
    outputs = {MULTIPLE_CHOICE: 1, QUESTION_ANSWERING: 2}.get(role, trained.num_labels if trained else 0)
    _check_shapes(c, params, path, outputs)
    return c, traverse_util.unflatten_dict(params)

  def _pop_tied(self, tensors: dict[str, np.ndarray], params: dict[Path, np.ndarray], path: str) -> None:
    """Pops the MLM decoder's weight and bias where a checkpoint stores them, refused unless tied to the word
    embeddings and the head's bias."""
    decoder = self.decoder
    tied = {f"{decoder}.weight": params.get(("albert", "embeddings", "word_embeddings", "embedding")),
            f"{decoder}.bias": params.get(("predictions", "bias"))}
    for key, tied_to in tied.items():
      if key in tensors and not (tied_to is not None and np.array_equal(tensors.pop(key), tied_to)):
        raise InputError(f"{path}: {key} differs from the tensor it is tied to; albert_jax ties the MLM decoder to "
                         "the word embeddings and the head's bias, so untied weights cannot be loaded.")

  def save_hf(self, c: ModelConfig, params: Any, path: str, head: HFHead | None = None, run: Any = None
              ) -> list[str]:
    """Writes `params` as the family's class that holds their heads (module docstring); `head`: what a one-dense
    head was trained for (a task's `hf_head`, or a converted folder's), its class names becoming id2label. Returns
    [path]; every refusal comes before anything is written."""
    flat = {p: np.asarray(x) for p, x in traverse_util.flatten_dict(nn.unbox(params)).items()}
    head_identity.check_hf_exportable({p[0] for p in flat})
    if PRETRAINING not in self.family.roles:  # a run's untrained sentence-order head: no class holds it
      flat = {p: x for p, x in flat.items() if p[0] != "sop_classifier"}
    dtype = np.result_type(*flat.values()).name
    role, head, head_config = self._role_and_head(flat, head)
    architecture = self.family.hf_class(role)
    hf = {**self.config_to_hf(c, architecture, dtype), **head_config}
    if names.POOLER not in self.parts(role):
      flat = {p: x for p, x in flat.items() if p[:2] != POOLER}
    tensors = popped_tensors(self._name_map(c, role), flat)
    if name := self.dense_head(role):
      kernel, bias = flat.pop((name, "kernel")), flat.pop((name, "bias"))
      check_shape(f"{name}.weight", (name, "kernel"), kernel.shape[:1], (c.hidden_size,), "params")
      tensors |= {f"{name}.weight": np.ascontiguousarray(kernel.T), f"{name}.bias": bias}
    if flat:
      raise InputError(f"params have entries that {architecture} has no place for: "
                       f"{sorted('/'.join(p) for p in flat)[:5]}; export one head (or --encoder_only).")
    if role == BACKBONE:  # as transformers saves <P>Model: without the prefix
      tensors = {k.removeprefix(f"{self.prefix}."): v for k, v in tensors.items()}
    write_folder(path, tensors, hf)
    return [path]

  def _role_and_head(self, flat: dict[Path, np.ndarray], head: HFHead | None
                     ) -> tuple[str, HFHead | None, dict[str, Any]]:
    """(the role of the class that holds `flat`'s heads, what its fine-tuned head was trained for, the config.json
    fields saying it)."""
    top = {p[0] for p in flat}
    classifier = {p[1] for p in flat if p[0] == CLASSIFIER}
    if not top & {CLASSIFIER, QA}:
      if head is not None:
        raise InputError(f"{head.architecture} needs a fine-tuned head; params have {sorted(top)}.")
      return (PRETRAINING if "sop_classifier" in top else MASKED_LM if "predictions" in top else BACKBONE), None, {}
    if len(top & {CLASSIFIER, QA, "predictions", "sop_classifier"}) > 1:
      raise InputError(f"params hold several heads {sorted(top - {'albert'})}; an HF checkpoint holds one model "
                       "class: export one head.")
    if "out_proj" in classifier:
      head = head or HFHead(self.family.hf_class(SEQUENCE_CLASSIFICATION))
      role = _role(head.architecture)
      if self.pooled_classifier or role != SEQUENCE_CLASSIFICATION:
        raise InputError(f"params hold a first-token classification head (classifier/dense, out_proj), which "
                         f"transformers' {self.family.title} classes have no place for; fine-tune with "
                         f"--config.classifier_head={self.family.classifier_head}, or export with --encoder_only.")
      outputs = flat[(CLASSIFIER, "out_proj", "bias")].shape[0]
    else:
      name = CLASSIFIER if classifier else QA
      outputs = flat[(name, "kernel")].shape[-1]
      head, expected = head_identity.hf_head_for(name, outputs, head)
      role = _role(head.architecture)
      if self.dense_head(role) != name:
        raise InputError(f"params hold a dense {name} head on the pooler, but {self.family.hf_class(role)}'s head "
                         f"is the first token's dense, tanh and projection; fine-tune with "
                         f"--config.classifier_head={self.family.classifier_head}, or export with --encoder_only.")
      check_shape(f"{name}.weight", (name, "kernel"), (outputs,), (expected,), "params")
    return role, head, head_identity.hf_config_fields(head, outputs)


def _role(architecture: str) -> str:
  """The role of any family's transformers class (a task's head names the default family's)."""
  family = families.for_hf_class(architecture)
  if family is None:
    raise InputError(f"{architecture} is no transformers class of a family read here.")
  return family.role_of(architecture)


def _check_shapes(c: ModelConfig, params: dict[Path, np.ndarray], where: str, outputs: int) -> None:
  """Every tensor in the shape our model gives it, a fine-tuned head's with `outputs` outputs."""
  abstract = nn.unbox(abstract_params(AlbertForPreTraining(c)))
  shapes = {p: tuple(x.shape) for p, x in traverse_util.flatten_dict(abstract).items()}
  h = c.hidden_size
  shapes.update({(CLASSIFIER, "dense", "kernel"): (h, h), (CLASSIFIER, "dense", "bias"): (h,),
                 (CLASSIFIER, "out_proj", "kernel"): (h, outputs), (CLASSIFIER, "out_proj", "bias"): (outputs,),
                 (CLASSIFIER, "kernel"): (h, outputs), (CLASSIFIER, "bias"): (outputs,),
                 (QA, "kernel"): (h, outputs), (QA, "bias"): (outputs,)})
  for path, value in params.items():
    check_shape("/".join(path), path, value.shape, shapes[path], where)


BERT_LAYOUT = Layout(BERT, names.HF_BERT, "bert", "cls.predictions.decoder", vocab_size=30522, pad_token_id=0,
                     counts_past_padding=False, pooled_classifier=True, mlm_activation=None)
ROBERTA_LAYOUT = Layout(ROBERTA, names.HF_ROBERTA, "roberta", "lm_head.decoder", vocab_size=50265, pad_token_id=1,
                        counts_past_padding=True, pooled_classifier=False, mlm_activation="gelu")
