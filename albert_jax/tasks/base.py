"""What every fine-tuning task shares: the Split container, the read -> featurize flow, input packing, losses.

A task turns files into fixed-shape int32 arrays (`Split.features`, one row per model input), runs the model on
them (`predict_step`), maps per-feature outputs back to per-example predictions (`postprocess`), scores them with
the benchmark's own rules (`score`) and writes them in the benchmark's submission format (`write_predictions`).
The training engine only sees `features`; everything else stays on the host.
"""
from __future__ import annotations

import abc
import collections
import dataclasses
import math
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from albert_jax import families, storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.model_config import ModelConfig
from albert_jax.tasks.input_text import DataFileError, as_read, control_character
from data_pipeline.pair_layout import BERT, PairLayout
from data_pipeline.tokenization import Tokenizer
from data_pipeline.tokenizer_json import JsonTokenizer
from data_pipeline.wordpiece import WordPieceTokenizer, load_tokenizer

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
SPLIT_NAME = re.compile(r"\w[\w.-]*")  # a file (or folder) of the data folder, without a path


@dataclasses.dataclass
class Split:
  """A featurized split. `features` rows are model inputs (+ labels); `examples` are what scoring reads;
  `info` holds per-feature host-side arrays that postprocessing needs (e.g. SQuAD token -> char offsets)."""
  name: str
  path: str
  examples: list[Any]
  features: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  info: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

  @property
  def num_features(self) -> int:
    return len(next(iter(self.features.values()))) if self.features else 0


def make_tokenizer(config) -> Tokenizer | WordPieceTokenizer | JsonTokenizer:
  """The tokenizer data.spm_model names: a SentencePiece model, a WordPiece vocab.txt (what the released
  checkpoints of a "wordpiece" family ship, `families.Family.tokenizer`), a tokenizer.json or a BPE vocab.json
  (`wordpiece.load_tokenizer`)."""
  if not config.data.spm_model:
    init = config.get("init_checkpoint", "")
    if init and not storage.path(init).exists():  # the weights would name it: that is what to fix
      raise MissingFileError(f"init_checkpoint={init} not found, so nothing names the SentencePiece model "
                             "(config.data.spm_model is empty); pass the weights' folder (a convert output or a "
                             "training workdir), or --config.data.spm_model=PATH.")
    named = "" if init else (" and init_checkpoint is empty (weights whose run records their SentencePiece model "
                             "would name it)")
    raise InputError(f"config.data.spm_model is empty{named}; pass the SentencePiece model the checkpoint was trained "
                     "with (ALBERT's is spiece.model / 30k-clean.model), e.g. --config.data.spm_model=PATH.")
  # Pretraining configs (`--mode=embed` with one) have no such field: their data is prepared uncased by default.
  return load_tokenizer(config.data.spm_model, do_lower_case=config.data.get("do_lower_case", True))


def pack(first: list[int], second: list[int] | None, cls_id: int, sep_id: int, max_seq_length: int,
         layout: PairLayout = BERT) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The texts' ids joined in the tokenizer's `layout` (`[CLS] first [SEP] (second [SEP])`, segment 1 from second
  on, by default), right-padded with 0: (input_ids, attention_mask, token_type_ids)."""
  ids, types = layout.join(first, second, cls_id, sep_id)
  if len(ids) > max_seq_length:
    raise AssertionError(f"packed length {len(ids)} > {max_seq_length}: truncate before packing")
  out = np.zeros((3, max_seq_length), np.int32)
  out[0, :len(ids)] = ids
  out[1, :len(ids)] = 1
  out[2, :len(ids)] = types
  return out[0], out[1], out[2]


def stack_packed(rows: list[tuple[np.ndarray, ...]], shape: tuple[int, ...]) -> dict[str, np.ndarray]:
  """Rows of `pack` outputs -> {input_ids, attention_mask, token_type_ids}, each reshaped to `shape` + [S]."""
  if not rows:
    raise InputError("no examples to featurize")
  arrays = np.stack([np.stack(r) for r in rows], axis=1)  # [3, N, S]
  return {name: a.reshape(*shape, -1) for name, a in zip(MODEL_INPUTS, arrays)}


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
  return {name: batch[name] for name in MODEL_INPUTS}


def cross_entropy(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean softmax cross-entropy and accuracy over the batch (labels are integer classes)."""
  logits = logits.astype(jnp.float32)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  return loss, (logits.argmax(-1) == labels).mean()


# The heads of sequence classification (GLUE, your own data) and multiple choice (RACE, your own data), each named
# after the family that owns it (`families.Family.classifier`, `multiple_choice`); the other tasks' heads export as
# that family's transformers classes. "auto", the fine-tuning configs' default, becomes the family of the weights
# (`record.with_classifier_head`) and is the default family otherwise.
CLASSIFIER_HEADS = families.classifier_heads()


# Counts of the settings below that 0 (or less) makes degenerate, and what it would do (SQuAD v2's beam widths,
# bounded by the sequence too, are SquadTask's).
AT_LEAST_ONE = {"doc_stride": "never moves the window along the context, so windowing a context would not end",
                "max_query_length": "keeps no token of the question", "max_answer_length": "allows no answer span",
                "n_best_size": "keeps no candidate answer", "max_qa_length": "keeps no token of the question and option",
                "num_choices": "leaves no option to choose"}


@dataclasses.dataclass(frozen=True)
class TaskSettings:
  """What a task reads of an experiment config, typed. Defaults are the original's recipes (run_squad_v1/v2,
  run_race), so a task can be built for scoring alone (`albert_jax.evaluate`) without an experiment file."""
  task: str                               # "glue" | "squad_v1" | "squad_v2" | "race" | your own data's tasks
  task_name: str = ""                     # GLUE's sub-task, e.g. "sst-2"
  path: str = ""                          # the task's data folder
  max_seq_length: int = 512
  classifier_dropout_prob: float = 0.1    # on the pooled vector (GLUE, RACE), in SQuAD v2's answer class
  classifier_head: str = families.DEFAULT  # the family of the task's head (CLASSIFIER_HEADS)
  doc_stride: int = 128                   # SQuAD: tokens between the starts of consecutive context windows
  max_query_length: int = 64              # SQuAD: question tokens kept (the first ones)
  max_answer_length: int = 30             # SQuAD: longest predicted answer, in tokens
  n_best_size: int = 20                   # SQuAD: start and end candidates per window
  null_score_diff_threshold: float = 0.0  # SQuAD v2: answer "" when null_odds > this
  v2_head: str = "null_score"             # SQuAD v2: "null_score" | "answer_class" (tasks/squad.py docstring)
  start_n_top: int = 5                    # SQuAD v2 answer_class: beam width over starts
  end_n_top: int = 5                      # SQuAD v2 answer_class: ends kept per start
  max_qa_length: int = 128                # RACE, multiple_choice: question + option tokens kept (the last ones)
  # Your own data (classification, token_classification, multiple_choice):
  text_column: str = "text"               # classification: the (first) text's column / JSON field
  text_pair_column: str = ""              # classification: the second text's column; "" = single text
  label_column: str = "label"             # classification: the label's column
  id_column: str = ""                     # classification: an id column kept in predictions; "" = row number
  labels: tuple[str, ...] = ()            # class or tag names in output order; () = sorted set of the train file's
  regression: bool = False                # classification: one float output (MSE) instead of classes
  num_choices: int = 4                    # multiple_choice: options per question (fewer are padded and masked)

  def __post_init__(self):
    """Refuses counts that would train or predict nothing (`AT_LEAST_ONE`) and class names that would be misread: a
    name given twice (in either Unicode form) makes a phantom class (the labels map to the first, the other output
    never trains), a control character breaks the prediction files' rows and an invisible one makes a name unlike
    the one it looks like. Names are kept in NFC (see as_read)."""
    if self.classifier_head not in CLASSIFIER_HEADS:
      raise InputError(f"classifier_head={self.classifier_head!r}; choose one of {', '.join(CLASSIFIER_HEADS)}.")
    for field, effect in AT_LEAST_ONE.items():
      if getattr(self, field) < 1:
        raise InputError(f"data.{field}={getattr(self, field)} {effect}; give --config.data.{field}=1 or more.")
    for name in self.labels:
      if problem := control_character(name, "data.labels name"):
        raise InputError(problem)
    object.__setattr__(self, "labels", tuple(as_read(name) for name in self.labels))
    if not math.isfinite(self.null_score_diff_threshold):  # a nan compares false: every question answered
      raise InputError(f"data.null_score_diff_threshold={self.null_score_diff_threshold} (evaluate: --null_threshold) "
                       "is not a finite number; give the null odds above which a SQuAD v2 question is answered \"\" "
                       "(e.g. 0.0).")
    name, count = max(collections.Counter(self.labels).items(), key=lambda item: item[1], default=("", 0))
    if count > 1:
      times = "twice" if count == 2 else f"{count} times"
      raise InputError(f"data.labels={list(self.labels)} names {name!r} {times}; list each class once, in output "
                       "order.")

  @classmethod
  def from_config(cls, config) -> "TaskSettings":
    """The fields an experiment config has (top level or in `data`); the rest keep their defaults."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: config[k] for k in ("task", "task_name", "classifier_dropout_prob", "classifier_head") if k in config}
    values.update({k: v for k, v in config.data.items() if k in names})
    values["labels"] = tuple(values.get("labels", ()))
    return cls(**values)


class Task(abc.ABC):
  """The interface the training engine drives; subclasses fill in the task-specific steps.

  Flow: load_split / read_user_file -> read examples -> featurize -> Split; the engine batches
  `Split.features` through `loss_and_metrics` (training) or `predict_step` (evaluation, concatenated over
  batches in feature order), then calls `postprocess`, `score` and `write_predictions`.
  """
  metric_name: str = "accuracy"
  higher_is_better: bool = True
  eval_splits: tuple[str, ...] = ("dev",)  # scored at every evaluation; the first one selects the checkpoint
  test_splits: tuple[str, ...] = ("test",)  # predicted with the best checkpoint after training, where present
  predictions_suffix: str = ".jsonl"  # the format `write_predictions` writes
  # Outputs per example, which padding does not change: batches are cut to length buckets (albert_jax/buckets.py).
  # Tasks with outputs per token keep every batch at max_seq_length.
  length_buckets_apply: bool = True
  text_pairs: bool = False  # inputs are text pairs, in the tokenizer's layout: max_seq_length holds a token of each
  download: tuple[str, str] | None = None  # (data_pipeline.download --tasks, the folder it writes in DATA); None: yours

  def __init__(self, settings: TaskSettings):
    self.settings = settings

  # --- data -----------------------------------------------------------------------------------------------
  @abc.abstractmethod
  def split_path(self, split: str) -> str:
    ...

  @abc.abstractmethod
  def read_examples(self, path: str, labeled: bool) -> list[Any]:
    ...

  @abc.abstractmethod
  def read_user_examples(self, path: str) -> list[Any]:
    ...

  @abc.abstractmethod
  def featurize(self, examples: list[Any], tokenizer: Tokenizer) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """-> (features, info); features carry labels only when every example has one."""

  def load_split(self, split: str, tokenizer: Tokenizer) -> Split:
    """Split `split` (a name: "../x" would read a file outside the data folder, and its predictions would be written
    outside the run) of the data folder, featurized."""
    if not SPLIT_NAME.fullmatch(split) or ".." in split:
      raise InputError(f"--split={split!r} is not a split name; name one of the task's splits (test, dev, ...) as "
                       "its file in the data folder is named, without a folder.")
    path = self.split_path(split)
    folder = os.path.dirname(path)
    if not storage.path(path).exists() and storage.path(folder).is_dir():
      names = sorted({entry.name.split(".")[0] for entry in storage.path(folder).iterdir()})
      raise MissingFileError(f"split {split!r}: {path} not found; {folder} holds {', '.join(names) or 'nothing'} "
                             "(a split is named by its file): check the split's name, or --config.data.path.")
    if not storage.path(path).exists() and self.download:
      tasks, data_folder = self.download
      raise MissingFileError(f"{path} not found; download the data (python -m data_pipeline.download --tasks={tasks} "
                             f"--output=DATA) and pass data=DATA/{data_folder}, or check --config.data.path.")
    return self._featurized(split, path, self.read_examples(path, labeled=not split.startswith("test")), tokenizer)

  def read_user_file(self, path: str, tokenizer: Tokenizer) -> Split:
    """A user's own unlabelled file (format per task, see docs/finetuning.md) ready for `predict_step`."""
    if not storage.path(path).exists():  # read_text would blame config.data.path
      raise MissingFileError(f"--input={path} not found; pass the file of examples to predict (its format: "
                             "docs/finetuning.md).")
    return self._featurized("user", path, self.read_user_examples(path), tokenizer)

  def gold_split(self, path: str) -> Split:
    """Examples only (no tokenizer, no features): what `score` needs, for the standalone scorer."""
    return Split(name="gold", path=path, examples=self.read_examples(path, labeled=True))

  def _featurized(self, name: str, path: str, examples: list[Any], tokenizer: Tokenizer) -> Split:
    if not examples:
      raise DataFileError(path, None, "no examples found")
    features, info = self.featurize(examples, tokenizer)
    return Split(name=name, path=path, examples=examples, features=features, info=info)

  # --- model ----------------------------------------------------------------------------------------------
  def check_seq_length(self, model_config: ModelConfig, pair_layout: PairLayout = BERT) -> None:
    """The inputs fit the position table and hold a token of each text around `pair_layout`'s special tokens (the
    tokenizer's; BERT's, the fewest, where it is not known yet)."""
    model_config.check_seq_length(self.settings.max_seq_length, pair_layout=pair_layout if self.text_pairs else None)

  def build_model(self, model_config: ModelConfig, pair_layout: PairLayout = BERT):
    """The backbone (submodule "albert") + this task's head, once `check_seq_length` passes."""
    self.check_seq_length(model_config, pair_layout)
    return self.make_model(model_config)

  @abc.abstractmethod
  def make_model(self, model_config: ModelConfig):
    ...

  # What the model's head is called where each family has its own (`Family.classifier`, `multiple_choice`), so
  # that `classifier_head` chooses it; None: every family's weights take the same head.
  family_head: str | None = None

  @property
  def head_family(self) -> families.Family:
    """The family whose head the model has and whose transformers classes it exports as
    (`TaskSettings.classifier_head`)."""
    return families.classifier_family(self.settings.classifier_head)

  def identity(self) -> dict[str, Any]:
    """What the trained head means beyond its weights' shapes, recorded with a fine-tuning run: eval and predict
    refuse weights trained for another task or class order (equal shapes would swap labels silently). A family's
    own head other than the default family's is recorded too (its weights fit no other head); the default
    family's is not, as runs recorded before heads had names."""
    labels = getattr(self, "labels", None)
    name = self.head_family.name
    return {"task": self.settings.task, "task_name": self.settings.task_name,
            "labels": list(labels) if labels is not None else None,
            **({"classifier_head": name} if self.family_head and name != families.DEFAULT else {})}

  hf_head = None  # head_identity.HFHead: the transformers class of this task's model (`convert --to=hf` of best/step_N)

  def describe_head(self, model) -> str | None:
    """A line `--mode=describe` prints about the head of `model` where the config chose it; None: nothing to say."""
    if self.family_head is None:
      return None
    return f"{self.family_head} head: {self.head_family.title}'s ({type(model).__name__})"

  @abc.abstractmethod
  def dummy_batch(self, batch_size: int) -> dict[str, np.ndarray]:
    ...

  def init_params(self, model, rng: jax.Array):
    return model.init(rng, **model_inputs(self.dummy_batch(1)))["params"]

  @abc.abstractmethod
  def loss_and_metrics(self, model, params, batch, rng, deterministic: bool):
    ...

  @abc.abstractmethod
  def predict_step(self, model, params, batch) -> dict[str, jax.Array]:
    ...

  def predictor(self, model):
    """`predict_step` as a function of (params, batch), what `prediction.predict_features` runs."""
    return lambda params, batch: self.predict_step(model, params, batch)

  # --- outputs --------------------------------------------------------------------------------------------
  @abc.abstractmethod
  def postprocess(self, split: Split, outputs: dict[str, np.ndarray]):
    ...

  @abc.abstractmethod
  def score(self, split: Split, predictions) -> dict[str, float]:
    ...

  @abc.abstractmethod
  def write_predictions(self, split: Split, predictions, path: str) -> None:
    ...

  def tune(self, predictions: dict[str, tuple[Split, Any]], directory: str) -> None:
    """Decisions tuned on the eval predictions of a new best checkpoint, beyond its weights (multi-label
    thresholds): applied from then on and saved into `directory`, its weights' folder. Most tasks tune none."""

  def use_tuning(self, directory: str) -> None:
    """Applies what `tune` saved with the weights in `directory` (nothing saved there: the defaults)."""

  def predictions_name(self, split: str) -> str:
    """The file name of `split`'s predictions beside weights they were made with (`best/step_N/`, `--mode=eval`)."""
    return f"{split}_predictions{self.predictions_suffix}"

  def submission_name(self, split: str) -> str:
    """The file name predictions of `split` are written under in the workdir (benchmarks' own names where they
    have them)."""
    return self.predictions_name(split)

  @abc.abstractmethod
  def read_predictions(self, path: str, split: Split):
    """Inverse of `write_predictions` (used by `albert_jax.evaluate`)."""


def apply_model(model, params, batch, rng=None, deterministic: bool = True, **extra):
  """The model on the batch's inputs; `extra` are head arguments beyond the inputs (e.g. teacher-forced labels)."""
  rngs = {} if deterministic or rng is None else {"dropout": rng}
  return model.apply({"params": params}, **model_inputs(batch), deterministic=deterministic, rngs=rngs, **extra)


def check_outputs(split: Split, outputs: dict[str, np.ndarray]) -> None:
  for name, value in outputs.items():
    if len(value) != split.num_features:
      raise InputError(f"predict output {name!r} has {len(value)} rows but split {split.name!r} has "
                       f"{split.num_features} features; concatenate predict_step outputs over all batches in order "
                       "and drop padding rows.")
