"""One table of weight names: each of our sublayers and its name in every (format, family) column.

`name_map` walks the table once per layer of a model config and gives the full per-parameter list (our param path,
the format's name, transpose?) that readers and writers of that column load and save with, so that the two
directions cannot drift apart. A row's kind says how a sublayer's parameters are stored in each format (a torch
Linear holds its weight [out, in], a flax Dense and TF1 [in, out]); a row without a name in a column has no place
there. The names are documented in docs/checkpoints.md.
"""
from __future__ import annotations

import dataclasses
import itertools

from albert_jax.families.albert import ALBERT
from albert_jax.families.bert import BERT
from albert_jax.families.electra import ELECTRA
from albert_jax.families.roberta import ROBERTA
from albert_jax.model_config import ModelConfig

Path = tuple[str, ...]
Entry = tuple[Path, str, bool]  # (our param path, the format's name, transposed?)

# A kind: for each format, its parameters as (our leaf, the format's suffix, transposed?); a suffix None is the
# sublayer's own name, a leaf None the sublayer's own path.
DENSE, LAYER_NORM, EMBEDDING, VECTOR, OUTPUT_WEIGHTS = "dense", "layer_norm", "embedding", "vector", "output_weights"
_TORCH_LINEAR = (("kernel", "weight", True), ("bias", "bias", False))
KINDS = {
    DENSE: {"hf": _TORCH_LINEAR, "tf1": (("kernel", "kernel", False), ("bias", "bias", False))},
    LAYER_NORM: {"hf": (("scale", "weight", False), ("bias", "bias", False)),
                 "tf1": (("scale", "gamma", False), ("bias", "beta", False))},
    EMBEDDING: {"hf": (("embedding", "weight", False),), "tf1": (("embedding", None, False),)},
    VECTOR: {"hf": ((None, None, False),), "tf1": ((None, None, False),)},
    # The original's classifier heads store their weights [out, in], as a torch Linear does.
    OUTPUT_WEIGHTS: {"hf": _TORCH_LINEAR, "tf1": (("kernel", "output_weights", True), ("bias", "output_bias", False))},
}
SEPARATORS = {"hf": ".", "tf1": "/"}


@dataclasses.dataclass(frozen=True)
class Column:
  """One family's names in one format: `layer` is the prefix of layer (group g, inner layer i)'s names."""
  format: str
  family: str
  layer: str


HF_ALBERT = Column("hf", ALBERT.name, "albert.encoder.albert_layer_groups.{g}.albert_layers.{i}")
HF_ELECTRA = Column("hf", ELECTRA.name, "electra.encoder.layer.{g}")  # one weight set per layer: i is always 0
HF_BERT = Column("hf", BERT.name, "bert.encoder.layer.{g}")  # transformers' BertLayer, as ELECTRA's
HF_ROBERTA = Column("hf", ROBERTA.name, "roberta.encoder.layer.{g}")
TF1_ALBERT = Column("tf1", ALBERT.name, "bert/encoder/transformer/group_{g}/inner_group_{i}")
# google-research/electra's checkpoints hold both towers: the discriminator under electra/, the generator under
# generator/, over electra/'s embeddings; each column names one tower as a model of its own (its encoder under ours
# albert/encoder, as a converted generator's is).
TF1_ELECTRA = Column("tf1", ELECTRA.name, "electra/encoder/layer_{g}")
TF1_ELECTRA_GENERATOR = Column("tf1", ELECTRA.name, "generator/encoder/layer_{g}")

# The parts of a model, each a set of rows; a column's classes take some of them (`name_map`'s `parts`).
EMBEDDINGS, PROJECTION, LAYERS, POOLER = "embeddings", "projection", "layers", "pooler"
PREDICTIONS, SOP, DISCRIMINATOR, GENERATOR, CLASSIFIER = ("predictions", "sop_classifier", "discriminator_predictions",
                                                          "generator_predictions", "classifier")
# Fine-tuned heads of one dense output layer (question answering; token classification and multiple choice's
# `classifier`), and the summary a multiple-choice scorer puts before it.
QA_OUTPUTS, DENSE_CLASSIFIER, SEQUENCE_SUMMARY = "qa_outputs", "dense_classifier", "sequence_summary"
ENCODER_PARTS = (EMBEDDINGS, PROJECTION, LAYERS)
ENCODER = ("albert", "encoder")  # where our encoder's parameters sit (an ELECTRA run's generator: ("generator",))

_EMBEDDINGS = {HF_ALBERT: "albert.embeddings.", HF_ELECTRA: "electra.embeddings.", TF1_ALBERT: "bert/embeddings/",
               TF1_ELECTRA: "electra/embeddings/", TF1_ELECTRA_GENERATOR: "electra/embeddings/",
               HF_BERT: "bert.embeddings.", HF_ROBERTA: "roberta.embeddings."}


def _tf1_electra(name: str) -> dict[Column, str]:
  """A layer's sublayer as both towers of ELECTRA's TF1 checkpoints name it (under their own layer prefix)."""
  return {TF1_ELECTRA: name, TF1_ELECTRA_GENERATOR: name}


# (part, our path: under the encoder for PROJECTION, under a layer for LAYERS, else whole; kind; {column: name}).
ROWS = [
    *[(EMBEDDINGS, ("albert", "embeddings", f"{n}_embeddings"), EMBEDDING,
       {column: f"{prefix}{n}_embeddings" for column, prefix in _EMBEDDINGS.items()})
      for n in ("word", "position", "token_type")],
    (EMBEDDINGS, ("albert", "embeddings", "LayerNorm"), LAYER_NORM,
     {column: f"{prefix}LayerNorm" for column, prefix in _EMBEDDINGS.items()}),
    (PROJECTION, ("embedding_hidden_mapping_in",), DENSE,
     {HF_ALBERT: "albert.encoder.embedding_hidden_mapping_in", HF_ELECTRA: "electra.embeddings_project",
      TF1_ALBERT: "bert/encoder/embedding_hidden_mapping_in", TF1_ELECTRA: "electra/embeddings_project",
      TF1_ELECTRA_GENERATOR: "generator/embeddings_project"}),
    *[(LAYERS, ("attention", n), DENSE,
       {HF_ALBERT: f"attention.{n}", HF_ELECTRA: f"attention.self.{n}", TF1_ALBERT: f"attention_1/self/{n}",
        **_tf1_electra(f"attention/self/{n}")})
      for n in ("query", "key", "value")],
    (LAYERS, ("attention", "dense"), DENSE,
     {HF_ALBERT: "attention.dense", HF_ELECTRA: "attention.output.dense", TF1_ALBERT: "attention_1/output/dense",
      **_tf1_electra("attention/output/dense")}),
    (LAYERS, ("attention", "LayerNorm"), LAYER_NORM,
     {HF_ALBERT: "attention.LayerNorm", HF_ELECTRA: "attention.output.LayerNorm", TF1_ALBERT: "LayerNorm",
      **_tf1_electra("attention/output/LayerNorm")}),
    (LAYERS, ("ffn", "intermediate"), DENSE,
     {HF_ALBERT: "ffn", HF_ELECTRA: "intermediate.dense", TF1_ALBERT: "ffn_1/intermediate/dense",
      **_tf1_electra("intermediate/dense")}),
    (LAYERS, ("ffn", "output"), DENSE,
     {HF_ALBERT: "ffn_output", HF_ELECTRA: "output.dense", TF1_ALBERT: "ffn_1/intermediate/output/dense",
      **_tf1_electra("output/dense")}),
    (LAYERS, ("ffn", "LayerNorm"), LAYER_NORM,
     {HF_ALBERT: "full_layer_layer_norm", HF_ELECTRA: "output.LayerNorm", TF1_ALBERT: "LayerNorm_1",
      **_tf1_electra("output/LayerNorm")}),
    (POOLER, ("albert", "pooler"), DENSE, {HF_ALBERT: "albert.pooler", TF1_ALBERT: "bert/pooler/dense",
                                           HF_BERT: "bert.pooler.dense", HF_ROBERTA: "roberta.pooler.dense"}),
    (PREDICTIONS, ("predictions", "dense"), DENSE,
     {HF_ALBERT: "predictions.dense", TF1_ALBERT: "cls/predictions/transform/dense",
      HF_BERT: "cls.predictions.transform.dense", HF_ROBERTA: "lm_head.dense"}),
    (PREDICTIONS, ("predictions", "LayerNorm"), LAYER_NORM,
     {HF_ALBERT: "predictions.LayerNorm", TF1_ALBERT: "cls/predictions/transform/LayerNorm",
      HF_BERT: "cls.predictions.transform.LayerNorm", HF_ROBERTA: "lm_head.layer_norm"}),
    (PREDICTIONS, ("predictions", "bias"), VECTOR,
     {HF_ALBERT: "predictions.bias", TF1_ALBERT: "cls/predictions/output_bias", HF_BERT: "cls.predictions.bias",
      HF_ROBERTA: "lm_head.bias"}),
    (SOP, ("sop_classifier",), OUTPUT_WEIGHTS,
     {HF_ALBERT: "sop_classifier.classifier", TF1_ALBERT: "cls/seq_relationship", HF_BERT: "cls.seq_relationship"}),
    *[(DISCRIMINATOR, (DISCRIMINATOR, n), DENSE,
       {HF_ELECTRA: f"{DISCRIMINATOR}.{n}", TF1_ELECTRA: f"{DISCRIMINATOR}/{tf}"})
      for n, tf in (("dense", "dense"), ("dense_prediction", "dense_1"))],
    (GENERATOR, (GENERATOR, "dense"), DENSE,
     {HF_ELECTRA: f"{GENERATOR}.dense", TF1_ELECTRA_GENERATOR: f"{GENERATOR}/dense"}),
    (GENERATOR, (GENERATOR, "LayerNorm"), LAYER_NORM,
     {HF_ELECTRA: f"{GENERATOR}.LayerNorm", TF1_ELECTRA_GENERATOR: f"{GENERATOR}/LayerNorm"}),
    (GENERATOR, (GENERATOR, "bias"), VECTOR,
     {HF_ELECTRA: "generator_lm_head.bias", TF1_ELECTRA_GENERATOR: f"{GENERATOR}/output_bias"}),
    *[(CLASSIFIER, (CLASSIFIER, n), DENSE, {HF_ELECTRA: f"{CLASSIFIER}.{n}", HF_ROBERTA: f"{CLASSIFIER}.{n}"})
      for n in ("dense", "out_proj")],
    (QA_OUTPUTS, (QA_OUTPUTS,), DENSE, {HF_ELECTRA: QA_OUTPUTS}),
    (SEQUENCE_SUMMARY, (SEQUENCE_SUMMARY, "summary"), DENSE, {HF_ELECTRA: f"{SEQUENCE_SUMMARY}.summary"}),
    (DENSE_CLASSIFIER, (CLASSIFIER,), DENSE, {HF_ELECTRA: CLASSIFIER}),
]
for _part, _, _, _names in ROWS:  # BERT's and RoBERTa's layers are named as ELECTRA's (all three: BertLayer)
  if _part == LAYERS:
    _names.update(dict.fromkeys((HF_BERT, HF_ROBERTA), _names[HF_ELECTRA]))


def name_map(column: Column, c: ModelConfig, parts: tuple[str, ...] | None = None,
             encoder: Path = ENCODER) -> list[Entry]:
  """(our param path, the column's name, transposed?) of every parameter of `parts` (default: all the column has)
  of a model of config `c` whose encoder sits under `encoder`. The E->H projection is there when `c` has one; the
  layers are `c`'s groups (one per layer without sharing) times its inner layers."""
  groups = c.num_hidden_layers if c.sharing == "none" else c.num_hidden_groups
  entries = []
  for part, rows in itertools.groupby(ROWS, key=lambda row: row[0]):
    rows = [(ours, kind, names[column]) for _, ours, kind, names in rows if column in names]
    if (parts is not None and part not in parts) or (part == PROJECTION and not c.has_embedding_projection):
      continue
    if part == PROJECTION:
      rows = [(encoder + ours, kind, name) for ours, kind, name in rows]
    if part != LAYERS:
      entries += [entry for ours, kind, name in rows for entry in _entries(column, kind, ours, name)]
      continue
    for g in range(groups):
      for i in range(c.inner_group_num):
        layer = encoder + (f"group_{g}", f"inner_{i}")
        prefix = column.layer.format(g=g, i=i) + SEPARATORS[column.format]
        entries += [entry for ours, kind, name in rows for entry in _entries(column, kind, layer + ours, prefix + name)]
  return entries


def _entries(column: Column, kind: str, ours: Path, name: str) -> list[Entry]:
  sep = SEPARATORS[column.format]
  return [(ours + ((leaf,) if leaf else ()), f"{name}{sep}{suffix}" if suffix else name, transposed)
          for leaf, suffix, transposed in KINDS[kind][column.format]]
