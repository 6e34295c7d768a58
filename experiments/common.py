"""Shared building blocks of every experiment file (after big_vision `configs/common.py`).

A config has these sections:
  model      the ModelConfig fields (albert_jax/model_config.py), from a named size
  data       where examples come from and how they are built (data_pipeline/)
  train      optimizer, schedule, batch split, step counts
  mesh       device mesh shape and the logical-axis -> mesh-axis rules (albert_jax/sharding.py)
  checkpoint how often and how many checkpoints are kept
  log        metric and progress output
"""
from __future__ import annotations

import ml_collections

from albert_jax.model_config import MODEL_SIZES


def parse_arg(arg: str | None, **defaults):
  """'size=large,smoke' -> ConfigDict(size='large', smoke=True), typed after `defaults`."""
  parsed = ml_collections.ConfigDict(dict(defaults))
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    if key not in defaults:
      raise ValueError(f"Unknown config argument {key!r}; valid: {sorted(defaults)}.")
    kind = type(defaults[key])
    if kind is bool:
      parsed[key] = value.lower() in ("", "1", "true", "yes")
    else:
      parsed[key] = kind(value)
  return parsed


def model_config(size: str, **overrides) -> ml_collections.ConfigDict:
  if size not in MODEL_SIZES:
    raise ValueError(f"Unknown model size {size!r}; choose one of {sorted(MODEL_SIZES)}.")
  from albert_jax.model_config import ModelConfig
  fields = ModelConfig(**{**MODEL_SIZES[size], **overrides}).to_dict()
  # embedding_projection may be None or bool: give it a placeholder type so --config overrides accept a bool.
  config = ml_collections.ConfigDict(fields)
  return config


def pretraining_config(size: str) -> ml_collections.ConfigDict:
  """The paper's pretraining recipe (batch 4096, seq 512, LAMB 0.00176, 125k steps, warmup 3125)."""
  c = ml_collections.ConfigDict()
  c.task = "pretrain"
  c.model_size = size
  c.model = model_config(size)
  c.seed = 0
  c.init_checkpoint = ""          # warm start (params only) from a run or `albert_jax.convert` output

  c.data = ml_collections.ConfigDict()
  c.data.kind = "prepared"        # "prepared" (data_pipeline.prepare output) | "synthetic" (benchmarks, smoke)
  c.data.path = ""                # directory written by `python -m data_pipeline.prepare`
  c.data.max_seq_length = 512
  c.data.max_predictions_per_seq = 20   # 0 = no budget: exactly masked_lm_prob of the tokens
  c.data.masked_lm_prob = 0.15
  c.data.short_seq_prob = 0.1
  c.data.ngram = 3
  c.data.favor_shorter_ngram = True
  c.data.sentence_task = "sop"    # "sop" | "nsp" | "none"
  c.data.masking = "dynamic"      # "dynamic" (fresh masks each epoch) | "static" (dupe_factor fixed copies)
  c.data.dupe_factor = 40
  c.data.num_workers = 0          # grain worker processes (0 = in the training process)
  c.data.prefetch = 2

  c.train = ml_collections.ConfigDict()
  c.train.global_batch_size = 4096
  c.train.micro_batch_size = 0    # per data-parallel device per accumulation step; 0 = global / devices
  c.train.num_train_steps = 125_000
  c.train.optimizer = "lamb"      # "lamb" (the original: no bias correction) | "optax_lamb" | "adamw"
  c.train.learning_rate = 0.00176
  c.train.warmup_steps = 3125
  c.train.poly_power = 1.0
  c.train.weight_decay = 0.01
  c.train.b1 = 0.9
  c.train.b2 = 0.999
  c.train.eps = 1e-6
  c.train.clip_grad_norm = 1.0
  c.train.eval_every = 5000
  c.train.eval_batches = 100

  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (("data", -1), ("fsdp", 1), ("tensor", 1))   # -1: all remaining devices
  c.mesh.logical_axis_rules = (
      ("act_batch", ("data", "fsdp")),
      ("embed", "fsdp"),
      ("mlp", "tensor"),
      ("qkv", "tensor"),
      ("vocab", "tensor"),
  )

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 5000
  c.checkpoint.keep = 5
  c.checkpoint.async_save = True

  c.log = ml_collections.ConfigDict()
  c.log.every = 100
  c.log.profile_start = -1        # step at which to start a jax.profiler trace (-1 = never)
  c.log.profile_steps = 5
  return c
