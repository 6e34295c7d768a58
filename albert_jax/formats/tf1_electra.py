"""google-research/electra's TF1 checkpoints -> our ELECTRA folders: the tf1 format's ELECTRA reader (`tf1.from_tf1`
hands it a checkpoint whose variables are ELECTRA's).

Its run_pretraining.py saves both towers in one checkpoint: the discriminator (`electra/encoder/...`,
`discriminator_predictions/...`) and the generator (`generator/encoder/...`, `generator_predictions/...`) over the
discriminator's embeddings (`electra/embeddings/...`); names as the name table's TF1_ELECTRA and
TF1_ELECTRA_GENERATOR columns (`formats.names`). They are written as the hf format writes an ELECTRA run: the
discriminator in the folder (as a converted ElectraForPreTraining), the generator in `generator/` inside it (as a
converted ElectraForMaskedLM), each with the released folder's vocab.txt. A checkpoint of the discriminator alone
(fine-tuning's) gives the backbone.

The released folders hold no config file: each tower's sizes are read from its weights' shapes, and its head count,
which no shape shows, is the released code's rule (`training_utils.get_bert_config`: hidden size / 64, at least 1);
its activation is BERT's exact GELU, its LayerNorm epsilon 1e-12.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable

from absl import logging
from flax import traverse_util
import numpy as np

from albert_jax import storage
from albert_jax.errors import InputError
from albert_jax.families.electra import ELECTRA
from albert_jax.formats import names
from albert_jax.formats.hf_electra import (DISCRIMINATOR_HEAD, GENERATOR_DIR, GENERATOR_HEAD, initialised_pooler,
                                          pair_shapes)
from albert_jax.formats.hf_files import check_shape
from albert_jax.model_config import ModelConfig
from albert_jax.weights import store
from data_pipeline import wordpiece

TOWERS = {"electra": names.TF1_ELECTRA, "generator": names.TF1_ELECTRA_GENERATOR}  # scope -> its column
HEADS = {"electra": DISCRIMINATOR_HEAD, "generator": GENERATOR_HEAD}
_EMBEDDINGS = "electra/embeddings/word_embeddings"
HEAD_SIZE = 64  # the released code's hidden size per attention head


def holds_electra(variables: set[str]) -> bool:
  """Whether a checkpoint's weight names are ELECTRA's (its shared embeddings)."""
  return _EMBEDDINGS in variables


def tower_config(shapes: dict[str, tuple[int, ...]], scope: str) -> ModelConfig | None:
  """The ModelConfig of the tower under `scope` ("electra" or "generator") from the weights' shapes; None when the
  checkpoint has no such tower."""
  layers = {int(m.group(1)) for name in shapes if (m := re.match(rf"{scope}/encoder/layer_(\d+)/", name))}
  if not layers:
    return None
  first = f"{scope}/encoder/layer_0"
  (vocab, embedding), hidden = shapes[_EMBEDDINGS], shapes[f"{first}/attention/self/query/kernel"][1]
  return ModelConfig(vocab_size=vocab, embedding_size=embedding, hidden_size=hidden, num_hidden_layers=max(layers) + 1,
                     num_attention_heads=max(1, hidden // HEAD_SIZE),
                     intermediate_size=shapes[f"{first}/intermediate/dense/kernel"][1], hidden_act="gelu",
                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                     max_position_embeddings=shapes["electra/embeddings/position_embeddings"][0],
                     type_vocab_size=shapes["electra/embeddings/token_type_embeddings"][0], layer_norm_eps=1e-12,
                     sharing="none")


def load(variables: dict[str, tuple[int, ...]], read: Callable[[str], np.ndarray],
         where: str) -> dict[str, tuple[ModelConfig, dict[str, Any]]]:
  """Each tower of the checkpoint at `where` whose weight names and shapes are `variables`, `read` giving a
  weight's values: {"electra": the discriminator, "generator": the generator} as (ModelConfig, float32 numpy
  params), each with its head where the checkpoint has it."""
  left, towers = dict(variables), {}
  for scope, column in TOWERS.items():
    c = tower_config(variables, scope)
    if c is None:
      continue
    entries = names.name_map(column, c)
    if not any(tf in variables for ours, tf, _ in entries if ours[0] == HEADS[scope]):  # fine-tuning's: no head
      entries = [entry for entry in entries if entry[0][0] == "albert"]
    params = initialised_pooler(c)
    for ours, tf, transpose in entries:
      if tf not in variables:
        raise InputError(f"{where}: variable {tf} (ours {'/'.join(ours)}) is missing; the {scope}/ tower of this "
                         "checkpoint is incomplete (a copy cut short?).")
      left.pop(tf, None)
      value = read(tf)
      params[ours] = np.ascontiguousarray(value.T if transpose else value, dtype=np.float32)
    _check_shapes(c, params, where)
    towers[scope] = (c, traverse_util.unflatten_dict(params))
  ours_left = sorted(n for n in left if n.split("/")[0] in (*TOWERS, *HEADS.values()))
  if ours_left:
    raise InputError(f"{where}: variables {ours_left[:5]} have no place in ELECTRA's pair as this reader knows it "
                     "(untied generator embeddings, a two-tower generator?); only google-research/electra's "
                     "ELECTRA objective with tied embeddings is read.")
  if left:
    logging.warning("tf1_electra.load(%s): skipping variables albert_jax has no module for: %s", where, sorted(left))
  return towers


def _check_shapes(c: ModelConfig, params: dict[tuple[str, ...], np.ndarray], where: str) -> None:
  """Every weight in the shape that the config its tower's shapes gave predicts (an inconsistent copy shows)."""
  shapes = pair_shapes(c)
  for path, value in params.items():
    check_shape("/".join(path), path, value.shape, shapes[path], where)


def save(towers: dict[str, tuple[ModelConfig, dict[str, Any]]], src: str, dst: str) -> str:
  """Writes the discriminator to `dst` and the generator to `dst/generator` (module docstring), with `src`'s
  vocab.txt beside each; returns what was written."""
  vocab = os.path.join(src if os.path.isdir(src) else os.path.dirname(src), wordpiece.VOCAB_FILE)
  said = []
  for scope, folder in (("electra", dst), ("generator", os.path.join(dst, GENERATOR_DIR))):
    if scope not in towers:
      continue
    c, params = towers[scope]
    store.save_pretrained(folder, c, params, family=ELECTRA.name)
    if os.path.isfile(vocab):
      storage.write_atomic(os.path.join(folder, wordpiece.VOCAB_FILE), storage.path(vocab).read_bytes())
    said.append(f"{folder}: {', '.join(sorted(params))} (H={c.hidden_size}, heads={c.num_attention_heads})")
  return "; ".join(said) + (f"; its tokenizer {wordpiece.VOCAB_FILE}" if os.path.isfile(vocab) else
                            f"; no {wordpiece.VOCAB_FILE} beside the checkpoint, so runs need data.spm_model")
