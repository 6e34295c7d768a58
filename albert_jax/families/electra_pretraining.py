"""ELECTRA's replaced-token detection (Clark et al., ICLR 2020) as an engine `Job`, on pretraining's data path.

The generator does MLM on the masked batches of `data.kind` (`sentence_task=none`); its samples (softmax at
temperature 1, no gradient through them) replace the masked tokens; the discriminator says, for every non-pad
position, whether its token was replaced, a sample equal to the original counting as original. The loss is
L_MLM + `electra.discriminator_weight` · L_disc (the paper: 50), each normalised over the global batch as
`engine.Job` asks, so accumulated micro batches give the full batch's gradient. Model: `electra_model.py`. Runs as
the job kind registered for config.task "electra" (`job_kinds`).
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from albert_jax import describe, engine, flops, pretrain
from albert_jax.errors import InputError
from albert_jax.families import electra_continued
from albert_jax.families.electra import GENERATOR
from albert_jax.families.electra_model import ElectraForPreTraining, generator_config
from albert_jax.model import count_params, dummy_inputs
from albert_jax.model_config import ModelConfig
from albert_jax.run import Run


def electra_totals(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Pretraining's normalisers over the global batch, and its non-pad tokens: the discriminator's."""
  return {**pretrain.pretraining_totals(batch),
          "tokens": jnp.maximum(batch["attention_mask"].astype(jnp.float32).sum(), 1.0)}


def at_masked_positions(ids: jax.Array, batch: dict[str, jax.Array], values: jax.Array) -> jax.Array:
  """`ids` [B, S] with `values` [B, M] written at the masked positions of `batch` whose weight is non-zero (a
  one-hot over positions, not a scatter: padded slots, whose position is any, write nothing)."""
  hit = ((batch["masked_lm_positions"][..., None] == jnp.arange(ids.shape[1]))
         & (batch["masked_lm_weights"][..., None] > 0))   # [B, M, S]
  written = (hit * values[..., None].astype(jnp.int32)).sum(1)
  return jnp.where(hit.any(1), written, ids).astype(ids.dtype)


def corrupt(batch: dict[str, jax.Array], samples: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(the discriminator's input: the original ids with the masked positions replaced by `samples`, the labels:
  1 where that input differs from the original on a non-pad position)."""
  original = at_masked_positions(batch["input_ids"], batch, batch["masked_lm_ids"])
  replaced_input = at_masked_positions(original, batch, samples)
  labels = (replaced_input != original) & (batch["attention_mask"] > 0)
  return replaced_input, labels


def electra_loss(model: ElectraForPreTraining, discriminator_weight: float, params: Any, batch: dict[str, jax.Array],
                 rng: jax.Array, totals: dict[str, jax.Array], deterministic: bool = False):
  """This micro batch's share of mlm + weight · disc over the global batch (`electra_totals`); returns (loss, sums)."""
  return electra_objective(*electra_forward(model, params, batch, rng, deterministic), batch, totals,
                           discriminator_weight)


def electra_forward(model: ElectraForPreTraining, params: Any, batch: dict[str, jax.Array], rng: jax.Array,
                    deterministic: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(the generator's logits at the masked positions, the discriminator's at every position of the input its
  samples corrupted, the replaced labels)."""
  generator_rng, sample_rng, discriminator_rng = jax.random.split(rng, 3)
  inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
  mlm_logits = model.apply({"params": params}, *inputs, batch["masked_lm_positions"], deterministic,
                           method=model.generator_logits, rngs={"dropout": generator_rng})
  samples = jax.random.categorical(sample_rng, jax.lax.stop_gradient(mlm_logits))
  replaced_input, labels = corrupt(batch, samples)
  disc_logits = model.apply({"params": params}, replaced_input, *inputs[1:], deterministic,
                            method=model.discriminator_logits, rngs={"dropout": discriminator_rng})
  return mlm_logits, disc_logits, labels


def electra_objective(mlm_logits: jax.Array, disc_logits: jax.Array, labels: jax.Array, batch: dict[str, jax.Array],
                      totals: dict[str, jax.Array], discriminator_weight: float):
  """(loss, sums) from the two towers' logits and the replaced labels; pad positions count nowhere."""
  tokens = batch["attention_mask"].astype(jnp.float32)
  labels_f = labels.astype(jnp.float32)
  predicted = (disc_logits > 0).astype(jnp.float32) * tokens
  sums = {**pretrain.mlm_sums(mlm_logits, batch),
          "disc_loss_sum": (optax.sigmoid_binary_cross_entropy(disc_logits, labels_f) * tokens).sum(),
          "disc_tokens": tokens.sum(),
          "disc_correct": ((predicted == labels_f) * tokens).sum(),
          "disc_replaced": labels_f.sum(),
          "disc_predicted_replaced": predicted.sum(),
          "disc_true_positives": (predicted * labels_f).sum()}
  loss = (sums["mlm_loss_sum"] / totals["mlm_weight"]
          + discriminator_weight * sums["disc_loss_sum"] / totals["tokens"])
  return loss, sums


def summarize_electra(discriminator_weight: float, sums: dict[str, float]) -> dict[str, float]:
  """Sums over steps or batches -> the generator's MLM loss and accuracy, the discriminator's loss, accuracy,
  precision and recall on replaced tokens, the replaced share of the tokens, its chance loss, and the weighted
  total."""
  tokens = max(sums["disc_tokens"], 1.0)
  out = {**pretrain.mlm_metrics(sums),
         "disc_loss": sums["disc_loss_sum"] / tokens,
         "disc_accuracy": sums["disc_correct"] / tokens,
         "disc_precision": sums["disc_true_positives"] / max(sums["disc_predicted_replaced"], 1.0),
         "disc_recall": sums["disc_true_positives"] / max(sums["disc_replaced"], 1.0),
         "replaced_share": sums["disc_replaced"] / tokens}
  share = min(max(out["replaced_share"], 1e-7), 1 - 1e-7)
  # Chance: the loss of a discriminator that knows only the replaced share; learning is disc_loss below it.
  out["disc_chance_loss"] = -(share * math.log(share) + (1 - share) * math.log(1 - share))
  out["loss"] = out["mlm_loss"] + discriminator_weight * out["disc_loss"]
  return out


def check_config(config: ml_collections.ConfigDict) -> None:
  """What ELECTRA refuses of a pretraining config, by field name."""
  if config.data.sentence_task != "none":
    raise InputError(f"data.sentence_task={config.data.sentence_task!r}: ELECTRA has no sentence task; set "
                     "--config.data.sentence_task=none.")
  if config.electra.discriminator_weight <= 0:
    raise InputError(f"electra.discriminator_weight={config.electra.discriminator_weight} must be positive (the "
                     "paper: 50).")
  multiplier = generator_lr_multiplier(config)
  if not (math.isfinite(multiplier) and multiplier > 0):
    raise InputError(f"electra.generator_lr_multiplier={multiplier} must be a positive number (1: the "
                     "discriminator's rate).")


def generator_lr_multiplier(config: ml_collections.ConfigDict) -> float:
  """`electra.generator_lr_multiplier` (a config saved before it existed: 1)."""
  return config.electra.get("generator_lr_multiplier", 1.0)


def generator_update_factors(multiplier: float):
  """The `engine.Job.update_factors` that scale the generator's updates (its encoder and MLM head, not the
  embeddings it shares) by `multiplier`; None at 1, so the optimizer and its state stay as without it."""
  if multiplier == 1.0:
    return None
  return lambda params: {name: jax.tree.map(lambda _: multiplier if name.startswith(GENERATOR) else 1.0, part)
                         for name, part in params.items()}


def make_model(config: ml_collections.ConfigDict) -> ElectraForPreTraining:
  """The generator and discriminator of `config` (its `model` is the discriminator), checked."""
  check_config(config)
  model_config = pretrain.checked_model_config(config)
  return ElectraForPreTraining(model_config, config.electra.generator_fraction)


def make_job(config: ml_collections.ConfigDict, run: Run | None = None) -> engine.Job:
  """ELECTRA pretraining of `config` as an engine job (data read for `run` only when batches are asked for)."""
  model = make_model(config)
  seq_len, weight = config.data.max_seq_length, config.electra.discriminator_weight
  loss_fn = lambda params, batch, rng, totals, deterministic=False: electra_loss(
      model, weight, params, batch, rng, totals, deterministic)
  return engine.Job(
      init_params=lambda rng: model.init(rng, **dummy_inputs(1, seq_len))["params"],
      loss_fn=loss_fn, totals_fn=electra_totals, summarize=lambda sums, steps: summarize_electra(weight, sums),
      flops_per_token=train_flops_per_token(config),
      update_factors=generator_update_factors(generator_lr_multiplier(config)), **pretrain.data_fields(config, run))


def train_flops_per_token(config: ml_collections.ConfigDict) -> float:
  model = make_model(config)
  return pair_train_flops_per_token(model.config, generator_config(model.config, model.generator_fraction),
                                    config.data.max_seq_length, pretrain.prediction_slots(config.data))


def pair_train_flops_per_token(discriminator: ModelConfig, generator: ModelConfig, seq_len: int,
                               num_predictions: int) -> float:
  """The generator's encoder and MLM head (`flops.train_flops_per_token`), the discriminator's encoder and its head
  on every position, 6·(H² + H) (dense H -> H, then H -> 1). Sampling and the shared embedding lookups are not
  matmuls."""
  h = discriminator.hidden_size
  return (flops.train_flops_per_token(generator, seq_len, num_predictions)
          + flops.encoder_train_flops_per_token(discriminator, seq_len) + 6 * (h * h + h))


def train(config: ml_collections.ConfigDict, run: Run, args=None) -> dict[str, float]:
  """Pretrains the pair from scratch, a warm start (`electra_continued`: a discriminator folder and its generator's)
  or the run's latest checkpoint (`pretrain.train` with this job)."""
  return pretrain.train(config, run, args, job_for=make_job, warm_start_for=electra_continued.pair_warm_start)


def evaluate_checkpoint(config: ml_collections.ConfigDict, run: Run, args=None) -> dict[str, float]:
  """`--mode=eval`: the held-out metrics of the run's latest checkpoint, as one JSON line."""
  return pretrain.evaluate_checkpoint(config, run, args, job_for=make_job)


def describe_config(config: ml_collections.ConfigDict, workdir=None, args=None) -> dict:
  """`--mode=describe`: the pair's parameters (`params_backbone`: the discriminator with the shared embeddings, what
  fine-tuning takes; `params_generator`: its encoder and MLM head) and FLOPs per token, both towers counted."""
  model = make_model(config)
  params = nn.unbox(jax.eval_shape(lambda rng: model.init(rng, **dummy_inputs(1, 8))["params"], jax.random.key(0)))
  gen = generator_config(model.config, model.generator_fraction)
  seq_len, slots = config.data.max_seq_length, pretrain.prediction_slots(config.data)
  print(f"ELECTRA generator: H={gen.hidden_size} FFN={gen.intermediate_size} heads={gen.num_attention_heads} "
        f"(x{model.generator_fraction:g} of the discriminator's, below); discriminator loss weight "
        f"{config.electra.discriminator_weight:g}")
  added = {"params_generator": count_params({k: v for k, v in params.items() if k.startswith(GENERATOR)}),
           "params_discriminator_head": count_params(params["discriminator_predictions"]),
           "train_flops_per_token": train_flops_per_token(config), "max_predictions_per_seq": slots,
           "generator": gen.to_dict()}
  return describe.print_description(model.config, seq_len, slots, params, (
      f"{slots} generator predictions, both towers", added))
