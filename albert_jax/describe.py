"""`--mode=describe`: a readable model summary and, as the LAST line, one JSON object (counts and FLOPs).

A pretraining config is described with its MLM and sentence-order heads; a fine-tuning config with its task's
model (the same backbone, the task's head instead), so the counts are those of the parameters it trains.
"""
from __future__ import annotations

import json
import math
from typing import Any

import flax

from albert_jax import flops
from albert_jax.model import AlbertForPreTraining, abstract_params, count_params
from albert_jax.model_config import ModelConfig


def _params(model_config: ModelConfig, params: Any) -> Any:
  return flax.linen.unbox(abstract_params(AlbertForPreTraining(model_config)) if params is None else params)


def describe(model_config: ModelConfig, seq_len: int, num_predictions: int | None, params: Any = None) -> dict:
  """Counts and FLOPs of `params` (default: the pretraining model's); with the task's `params` of a fine-tuning
  model, FLOPs are the encoder's (its head is a few H-wide outputs)."""
  pretraining = params is None
  params = _params(model_config, params)
  backbone = params["albert"]
  encoder = backbone["encoder"]
  projection = encoder.get("embedding_hidden_mapping_in", {})
  return {
      "params_total": count_params(params),
      "params_backbone": count_params(backbone),
      "params_embeddings": count_params(backbone["embeddings"]),
      "params_embedding_projection": count_params(projection),
      "params_layers": count_params(encoder) - count_params(projection),
      "params_pooler": count_params(backbone.get("pooler", {})),
      "params_heads": count_params(params) - count_params(backbone),
      "train_flops_per_token": (flops.train_flops_per_token(model_config, seq_len, num_predictions) if pretraining
                                else flops.encoder_train_flops_per_token(model_config, seq_len)),
      "seq_len": seq_len,
      "max_predictions_per_seq": num_predictions if pretraining else None,
      "layer_applications": model_config.num_hidden_layers * model_config.inner_group_num,
      "model": model_config.to_dict(),
  }


def print_description(model_config: ModelConfig, seq_len: int, num_predictions: int | None,
                      params: Any = None, objective: tuple[str, dict] | None = None) -> dict:
  """`objective`: (what its FLOPs count, its counts added to or replacing `describe`'s) for another pretraining
  objective's `params` (a generator and discriminator pair)."""
  info = describe(model_config, seq_len, num_predictions, params)
  counted = (f"{num_predictions} predictions" if params is None
             else "the encoder's: the task head is not counted")
  counted, added = objective or (counted, {})
  info.update(added)
  c = model_config
  params = _params(model_config, params)
  print(f"ALBERT encoder: L={c.num_hidden_layers} H={c.hidden_size} E={c.embedding_size} heads="
        f"{c.num_attention_heads} FFN={c.intermediate_size} V={c.vocab_size} sharing={c.sharing} "
        f"groups={c.num_hidden_groups} inner={c.inner_group_num} dtype={c.dtype}")
  print(f"{'parameter':<72}{'shape':>18}{'count':>14}")
  for path, leaf in flax.traverse_util.flatten_dict(params, sep="/").items():
    print(f"{path:<72}{str(tuple(leaf.shape)):>18}{math.prod(leaf.shape):>14,}")
  for key in ("params_embeddings", "params_embedding_projection", "params_layers", "params_pooler",
              "params_backbone", "params_heads", *(k for k in added if k.startswith("params_")), "params_total"):
    print(f"{key:<40}{info[key]:>16,}")
  print(f"{'train_flops_per_token':<40}{info['train_flops_per_token']:>16,.0f}  (seq {seq_len}, {counted}; "
        "every layer application counted)")
  print(json.dumps(info), flush=True)
  return info

