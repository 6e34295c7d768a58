"""Model hyperparameters: one frozen dataclass, the paper's size table, and validation.

Field names follow the original `AlbertConfig` (google-research/albert `modeling.py`) and Hugging Face's, so a
config.json from either maps one to one (see `formats/hf_albert.py`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import numbers
import os
import resource
import typing
from typing import Any, Mapping

from albert_jax.errors import InputError
from data_pipeline.pair_layout import BERT, PairLayout

SHARING_MODES = ("all", "attention", "ffn", "none")
ACTIVATIONS = ("gelu_new", "gelu", "relu")  # gelu_new = tanh approximation (the original's `gelu`)
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable",
                  "everything_saveable")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")
# Keys of earlier versions that no longer change anything, ignored where a saved config.json still has them:
# softmax_custom_jvp (the attention softmax now always differentiates from its output, albert_jax.ops).
RETIRED_KEYS = ("softmax_custom_jvp",)
# The sizes: positive integers, each at most INT32_MAX, the largest index or counter the compiled step holds (token
# ids, positions and loop counters are int32).
SIZE_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "intermediate_size", "num_hidden_groups", "inner_group_num", "max_position_embeddings",
               "type_vocab_size", "scan_unroll")
INT32_MAX = 2**31 - 1


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
  # The position table's row of a sequence's first token: 0, or RoBERTa's padding index + 1 (2), whose positions
  # are counted past the padding row (a right-padded sequence's token i has row offset + i).
  position_offset: int = 0
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
  # the loop's saved-activation stacks and copies, as fast as the Python loop: see bench.train_step --scan-unroll).
  # None: every layer where the step is traced for a GPU (H200: 1.19x the step at ALBERT-base seq 128, 1.12x at
  # ALBERT-large seq 512, same memory and compile time), 1 elsewhere (model.scan_unroll).
  scan_unroll: int | None = None
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
  # The query, key and value projections as one [H, 3H] product (model.fused_qkv_heads; parameters still the
  # three [H, H] kernels), or as three. The same function, the gradients to rounding. None: one product except where
  # the step is traced for a TPU (model.fused_qkv).
  fused_qkv: bool | None = None

  def __post_init__(self):
    validate(self)

  @property
  def has_embedding_projection(self) -> bool:
    if self.embedding_projection is None:
      return self.embedding_size != self.hidden_size
    return bool(self.embedding_projection)

  @property
  def positions(self) -> int:
    """The longest sequence the position table embeds: its rows from `position_offset` on."""
    return self.max_position_embeddings - self.position_offset

  @property
  def positions_said(self) -> str:
    """`positions` as messages say it."""
    offset = f" - position_offset={self.position_offset} = {self.positions}" if self.position_offset else ""
    return f"model.max_position_embeddings={self.max_position_embeddings}{offset}"

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  def replace(self, **kwargs) -> "ModelConfig":
    return dataclasses.replace(self, **kwargs)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def check_seq_length(self, max_seq_length: int, max_predictions_per_seq: int | None = None,
                       pair_layout: PairLayout | None = None) -> None:
    """Positions are a slice of the learned table, so longer inputs have no embedding (the original asserts too).
    Inputs are [CLS] text [SEP], holding a token of text at least; with `pair_layout` (text pairs: the tokenizer's
    layout, whose separators between the texts differ) or `max_predictions_per_seq` (pretraining, in BERT's layout)
    two texts of a token each around the layout's special tokens, whose masked positions follow [CLS] (0:
    masked_lm_prob of the tokens)."""
    if max_seq_length + self.position_offset > self.max_position_embeddings:
      raise InputError(f"data.max_seq_length={max_seq_length} exceeds {self.positions_said}; lower "
                       "--config.data.max_seq_length.")
    pretraining = max_predictions_per_seq is not None
    pair_layout = pair_layout or (BERT if pretraining else None)
    shortest, form = ((pair_layout.special_tokens(pair=True) + 2, pair_layout.pair_form) if pair_layout
                      else (3, "[CLS] text [SEP]"))
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


def optional_field_types() -> dict[str, type]:
  """{field: X} for each field typed `X | None` (None: decided where the step is traced), so that a ConfigDict can
  give a None a type for `--config.model.<field>=value` to parse as."""
  found = {}
  for name, hint in typing.get_type_hints(ModelConfig).items():
    kinds = [kind for kind in typing.get_args(hint) if kind is not type(None)]
    if type(None) in typing.get_args(hint) and len(kinds) == 1:
      found[name] = kinds[0]
  return found


def validate(c: ModelConfig) -> None:
  """Raises ValueError naming the bad field and how to fix it."""
  for name in SIZE_FIELDS:
    value = getattr(c, name)
    if value is None and name in optional_field_types():
      continue
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not 1 <= value <= INT32_MAX:
      raise InputError(f"model.{name}={value!r} must be an integer from 1 to {INT32_MAX:,} (token ids, positions "
                       "and loop counters are int32).")
  if not isinstance(c.position_offset, numbers.Integral) or not 0 <= c.position_offset < c.max_position_embeddings:
    raise InputError(f"model.position_offset={c.position_offset!r} must be an integer from 0 to "
                     f"max_position_embeddings - 1 = {c.max_position_embeddings - 1} (RoBERTa: 2).")
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
  _check_fits_host(c)


def parameter_count(c: ModelConfig, **sizes: int) -> int:
  """The parameters of `AlbertForPreTraining(c)` (describe's params_total), with `sizes` in place of c's fields:
  from the sizes alone, since a config must be checked before the model, even its shapes, can be traced."""
  s = _sizes(c, sizes)
  v, e, h, i = s["vocab_size"], s["embedding_size"], s["hidden_size"], s["intermediate_size"]
  layers = s["num_hidden_layers"]
  projection = c.embedding_projection if c.embedding_projection is not None else e != h
  attention = 4 * (h * h + h) + 2 * h  # query, key, value, dense; LayerNorm
  ffn = 2 * h * i + i + h + 2 * h      # intermediate, output; LayerNorm
  encoder = {"all": s["num_hidden_groups"] * s["inner_group_num"] * (attention + ffn),
             "attention": attention + layers * ffn, "ffn": layers * attention + ffn,
             "none": layers * (attention + ffn)}[c.sharing]
  embeddings = (v + s["max_position_embeddings"] + s["type_vocab_size"]) * e + 2 * e
  heads = (h * e + e) + 2 * e + v + (2 * h + 2)  # MLM dense, LayerNorm, output bias; sentence-order classifier
  return embeddings + projection * (e * h + h) + encoder + (h * h + h) + heads


def _sizes(c: ModelConfig, sizes: Mapping[str, int]) -> dict[str, int]:
  return {**{name: getattr(c, name) for name in SIZE_FIELDS}, **sizes}


CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # v2, v1


def host_memory() -> int:
  """The memory this process may use, in bytes: the host's physical memory, or less where a limit caps it, the
  address space `ulimit -v` allows or a container's cgroup limit (a batch between them and the physical memory
  would pass the memory checks and then fail to allocate)."""
  limits = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
  address_space = resource.getrlimit(resource.RLIMIT_AS)[0]
  if address_space != resource.RLIM_INFINITY:
    limits.append(address_space)
  for path in CGROUP_MEMORY_LIMITS:
    with contextlib.suppress(OSError), open(path) as file:
      limit = file.read().strip()
      if limit.isdigit():  # else "max": none
        limits.append(int(limit))
  return min(limits)


def _memory_needed(c: ModelConfig, **sizes: int) -> int:
  """Bytes that `c` (with `sizes` in place of its fields) needs at least: one copy of the parameters, which
  restores, warm starts and exports hold in host memory, and one longest sequence's input to every layer
  application, which a training step keeps for its backward pass."""
  s = _sizes(c, sizes)
  return parameter_count(c, **sizes) * _bytes(c.param_dtype) + layer_inputs_bytes(c, s["max_position_embeddings"],
                                                                                  **sizes)


def layer_inputs_bytes(c: ModelConfig, tokens: int, **sizes: int) -> int:
  """Bytes of one `tokens`-long sequence's input to every layer application, which a training step keeps for its
  backward pass: a lower bound of its activations."""
  s = _sizes(c, sizes)
  return s["num_hidden_layers"] * s["inner_group_num"] * tokens * s["hidden_size"] * _bytes(c.dtype)


def _bytes(dtype: str) -> int:
  return 4 if dtype == "float32" else 2


def _check_fits_host(c: ModelConfig) -> None:
  """Refuses a model beyond this host's memory, naming the size (of those the need grows with) furthest beyond
  the released models' and the most of it that fits with the others as they are, found by bisection."""
  memory, needed = host_memory(), _memory_needed(c)
  if needed <= memory:
    return
  released = [{**DEFAULT_SIZES, **size} for size in MODEL_SIZES.values()]
  growing = [n for n in SIZE_FIELDS
             if getattr(c, n) is not None and _memory_needed(c, **{n: 2 * getattr(c, n)}) > needed]
  name = max(growing, key=lambda n: getattr(c, n) / max(size[n] for size in released))
  fits, beyond = 0, getattr(c, name)
  while beyond - fits > 1:
    middle = (fits + beyond) // 2
    fits, beyond = (middle, beyond) if _memory_needed(c, **{name: middle}) <= memory else (fits, middle)
  most = f"at most {fits:,} fits with the other sizes as they are" if fits else "no value fits with the other sizes"
  raise InputError(f"model.{name}={getattr(c, name)} makes the model need {needed / 2**30:,.1f} GiB ("
                   f"{parameter_count(c):,} parameters in {c.param_dtype} and one {c.max_position_embeddings}-token "
                   f"sequence through every layer), more than this host's {memory / 2**30:,.1f} GiB of memory: "
                   f"{most}; lower model.{name}.")


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
DEFAULT_SIZES = {name: getattr(ModelConfig, name) for name in SIZE_FIELDS}
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

