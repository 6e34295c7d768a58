"""Model hyperparameters: one frozen dataclass, the paper's size table, and validation.

Field names follow the original `AlbertConfig` (google-research/albert `modeling.py`) and Hugging Face's, so a
config.json from either maps one to one (see `interop.py`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from albert_jax.errors import InputError

SHARING_MODES = ("all", "attention", "ffn", "none")
ACTIVATIONS = ("gelu_new", "gelu", "relu")  # gelu_new = tanh approximation (the original's `gelu`)
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable",
                  "everything_saveable")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")
# Keys of earlier versions that no longer change anything, ignored where a saved config.json still has them:
# softmax_custom_jvp (the attention softmax now always differentiates from its output, albert_jax.ops).
RETIRED_KEYS = ("softmax_custom_jvp",)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything that fixes the function the encoder computes (and how it is computed)."""
  vocab_size: int = 30000
  embedding_size: int = 128
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  num_hidden_groups: int = 1
  inner_group_num: int = 1
  hidden_act: str = "gelu_new"
  hidden_dropout_prob: float = 0.0
  attention_probs_dropout_prob: float = 0.0
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12
  # "all" (ALBERT), "attention" (attention shared, FFN per layer), "ffn" (FFN shared), "none" (BERT).
  sharing: str = "all"
  # The original has an E->H projection only when E != H; Hugging Face always creates one. True keeps it.
  embedding_projection: bool | None = None
  # Computation, not function:
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_layers: bool = True
  # Layer applications per while-loop iteration of the scan (1 = compile once; count = straight-line code without
  # the loop's saved-activation stacks, as fast as the Python loop: see bench.train_step --scan-unroll).
  scan_unroll: int = 1
  remat_policy: str = "none"
  # Dense layers and the tied decoder as products over all tokens at once ([B*T, K] x [K, N]): their kernel
  # gradients become plain matmuls (model.flat_dot_general). Same function. On CPU +10% step speed at tiny256, +6% at
  # ALBERT-base; compiled for TPU it costs memory (ALBERT-large on v4-128: 21.2 vs 20.1 GiB). None: on where the
  # step is compiled for the CPU backend, off elsewhere (`--mode=compile` compiles for a TPU: off).
  flat_matmuls: bool | None = None
  # How attention runs: "xla" (einsums and albert_jax.ops.masked_softmax, any backend), "cudnn" (cuDNN's fused
  # kernel: GPU, bfloat16/float16, no attention-probability dropout), "auto" (cuDNN's where the step is traced for a
  # GPU in half precision and cuDNN takes the shapes, else XLA's: model.attention_implementation). Same function.
  attention_implementation: str = "auto"

  def __post_init__(self):
    validate(self)

  @property
  def has_embedding_projection(self) -> bool:
    if self.embedding_projection is None:
      return self.embedding_size != self.hidden_size
    return bool(self.embedding_projection)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  def replace(self, **kwargs) -> "ModelConfig":
    return dataclasses.replace(self, **kwargs)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def check_seq_length(self, max_seq_length: int, max_predictions_per_seq: int | None = None) -> None:
    """Positions are a slice of the learned table, so longer inputs have no embedding (the original asserts too).
    Inputs are [CLS] text [SEP]; with `max_predictions_per_seq` (pretraining) [CLS] A [SEP] B [SEP], whose masked
    positions follow [CLS] (0: masked_lm_prob of the tokens)."""
    if max_seq_length > self.max_position_embeddings:
      raise InputError(f"data.max_seq_length={max_seq_length} exceeds model.max_position_embeddings="
                       f"{self.max_position_embeddings}; lower --config.data.max_seq_length.")
    pretraining = max_predictions_per_seq is not None
    shortest, form = (5, "[CLS] A [SEP] B [SEP]") if pretraining else (2, "[CLS] and [SEP]")
    if max_seq_length < shortest:
      raise InputError(f"data.max_seq_length={max_seq_length} leaves no room for {form}; give "
                       f"--config.data.max_seq_length={shortest} or more.")
    if pretraining and not 0 <= max_predictions_per_seq < max_seq_length:
      raise InputError(f"data.max_predictions_per_seq={max_predictions_per_seq} must be from 0 (masked_lm_prob of "
                       f"the tokens) to {max_seq_length - 1} (the positions after [CLS]); fix "
                       "--config.data.max_predictions_per_seq.")

  @classmethod
  def from_mapping(cls, values: Mapping[str, Any]) -> "ModelConfig":
    """Builds from a dict or ConfigDict, rejecting unknown keys with the list of valid ones."""
    values = {k: v for k, v in dict(values).items() if k not in RETIRED_KEYS}
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise InputError(f"Unknown model config key(s) {unknown}. Valid keys: {sorted(known)}.")
    return cls(**values)


def validate(c: ModelConfig) -> None:
  """Raises ValueError naming the bad field and how to fix it."""
  positive = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "intermediate_size", "num_hidden_groups", "inner_group_num", "max_position_embeddings",
              "type_vocab_size", "scan_unroll")
  for name in positive:
    if getattr(c, name) < 1:
      raise InputError(f"model.{name} must be >= 1, got {getattr(c, name)}.")
  if c.hidden_size % c.num_attention_heads:
    raise InputError(
        f"model.hidden_size={c.hidden_size} is not divisible by model.num_attention_heads="
        f"{c.num_attention_heads}; choose a head count that divides it (the paper uses H/64 heads).")
  if c.num_hidden_groups > c.num_hidden_layers:
    raise InputError(f"model.num_hidden_groups={c.num_hidden_groups} exceeds model.num_hidden_layers="
                     f"{c.num_hidden_layers}; use at most one group per layer.")
  if c.sharing not in SHARING_MODES:
    raise InputError(f"model.sharing={c.sharing!r}; choose one of {SHARING_MODES}.")
  if c.sharing != "all" and (c.num_hidden_groups != 1 or c.inner_group_num != 1):
    raise InputError("model.sharing other than 'all' needs num_hidden_groups=1 and inner_group_num=1 "
                     "(groups are the original's own form of partial sharing).")
  if c.hidden_act not in ACTIVATIONS:
    raise InputError(f"model.hidden_act={c.hidden_act!r}; choose one of {ACTIVATIONS}.")
  if c.remat_policy not in REMAT_POLICIES:
    raise InputError(f"model.remat_policy={c.remat_policy!r}; choose one of {REMAT_POLICIES}.")
  for name in ("dtype", "param_dtype"):
    if getattr(c, name) not in ("float32", "bfloat16", "float16"):
      raise InputError(f"model.{name}={getattr(c, name)!r}; choose float32, bfloat16 or float16.")
  if c.attention_implementation not in ATTENTION_IMPLEMENTATIONS:
    raise InputError(f"model.attention_implementation={c.attention_implementation!r}; choose one of "
                     f"{ATTENTION_IMPLEMENTATIONS}.")
  if c.attention_implementation == "cudnn":
    if c.dtype == "float32":
      raise InputError("model.attention_implementation='cudnn' runs in bfloat16 or float16 only; set "
                       "model.dtype=bfloat16, or model.attention_implementation=xla.")
    if c.attention_probs_dropout_prob > 0:
      raise InputError("model.attention_implementation='cudnn' has no attention-probability dropout; set "
                       "model.attention_probs_dropout_prob=0 (ALBERT v2), or model.attention_implementation=xla.")
  for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
    if not 0.0 <= getattr(c, name) < 1.0:
      raise InputError(f"model.{name} must be in [0, 1), got {getattr(c, name)}.")


def _albert(L, H, heads, dropout, act):
  return dict(embedding_size=128, hidden_size=H, num_hidden_layers=L, num_attention_heads=heads,
              intermediate_size=4 * H, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
              hidden_act=act, sharing="all")


def _bert(L, H, heads):
  return dict(embedding_size=H, hidden_size=H, num_hidden_layers=L, num_attention_heads=heads,
              intermediate_size=4 * H, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
              hidden_act="gelu", sharing="none")


# The released configs (v1: dropout 0.1 except xxlarge; v2: no dropout, gelu_new). Head counts are explicit:
# xlarge ships with 16 heads in the Hugging Face configs but 32 in the TF-Hub v2 tarball (google-research/albert
# #180, transformers #3164); the paper's rule H/64 also gives 32. We follow the Hugging Face/TF v1 configs (16),
# because head count is not visible in any weight shape and those are the checkpoints users load; pass
# `--config.model.num_attention_heads=32` for the TF-Hub v2 weights.
MODEL_SIZES: dict[str, dict[str, Any]] = {
    "base": _albert(12, 768, 12, 0.0, "gelu_new"),
    "large": _albert(24, 1024, 16, 0.0, "gelu_new"),
    "xlarge": _albert(24, 2048, 16, 0.0, "gelu_new"),
    "xxlarge": _albert(12, 4096, 64, 0.0, "gelu_new"),
    "base_v1": _albert(12, 768, 12, 0.1, "gelu_new"),
    "large_v1": _albert(24, 1024, 16, 0.1, "gelu_new"),
    "xlarge_v1": _albert(24, 2048, 16, 0.1, "gelu_new"),
    "xxlarge_v1": _albert(12, 4096, 64, 0.0, "gelu_new"),
    "bert_base": _bert(12, 768, 12),
    "bert_large": _bert(24, 1024, 16),
    "bert_xlarge": _bert(24, 2048, 32),
    # CPU tests and the laptop smoke run.
    "tiny": dict(embedding_size=32, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=256, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                 hidden_act="gelu_new", sharing="all", max_position_embeddings=128),
}
# v2 is the default flavour, as in the released README's first table.
for _size in ("base", "large", "xlarge", "xxlarge"):
  MODEL_SIZES[f"{_size}_v2"] = MODEL_SIZES[_size]


def model_config_for(size: str, **overrides) -> ModelConfig:
  """Returns the ModelConfig of a named size, e.g. `model_config_for("large", dtype="bfloat16")`."""
  if size not in MODEL_SIZES:
    raise InputError(f"Unknown model size {size!r}; choose one of {sorted(MODEL_SIZES)}.")
  return ModelConfig(**{**MODEL_SIZES[size], **overrides})


def model_config_from(config) -> ModelConfig:
  """The ModelConfig of an experiment config's `model` section."""
  return ModelConfig.from_mapping(config.model.to_dict())


PRETRAINING_TASK = "pretrain"  # an experiment config's `task` for pretraining; any other names a fine-tuning task


def is_pretraining(config) -> bool:
  """Whether an experiment config pretrains (MLM + SOP) rather than fine-tunes a task: the one test of it."""
  return config.task == PRETRAINING_TASK
