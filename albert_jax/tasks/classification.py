"""`classification`: your own sentence or sentence-pair data, the single most common fine-tuning use.

`data.path` holds `train`, `dev` (and optionally `test`) as `.tsv`, `.csv` or `.jsonl`, each with named
columns/fields: `data.text_column`, optionally `data.text_pair_column`, `data.label_column` and `data.id_column`.
The label set is `data.labels` when given, else the sorted set of the train file's labels (numbers in numeric
order), so the output order never depends on the order of the rows; `data.regression=True` reads the label as a
number and trains one output with MSE. Predictions are JSON lines with the label and every class's probability.
`multi_label_classification` (`MultiLabelClassificationTask`) reads any number of classes per row.
"""
from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from albert_jax import storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.head_identity import MULTI_LABEL, HFHead
from albert_jax.tasks import metrics
from albert_jax.tasks.base import Split, TaskSettings, apply_model, check_outputs
from albert_jax.tasks.input_text import DataFileError, score_label
from albert_jax.tasks.glue import GlueExample
from albert_jax.tasks.records import Ids, check_name, class_spelling, field, near_miss, user_records
from albert_jax.tasks.sequence import SequenceClassificationTask

FORMATS = (".tsv", ".csv", ".jsonl")
INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII digits: str.isdigit() takes "²", which int() refuses


def find_split_file(folder: str, split: str) -> str:
  """`folder/split.{tsv,csv,jsonl}`: the one that exists (`.tsv` named when none does); two are ambiguous."""
  candidates = [os.path.join(folder, split + ext) for ext in FORMATS]
  found = [path for path in candidates if storage.path(path).exists()]
  if len(found) > 1:
    raise InputError(f"{folder} has {len(found)} files for split {split!r} ({found}); keep one.")
  return found[0] if found else os.path.join(folder, split + FORMATS[0])


def label_order(names: set[str]) -> tuple[str, ...]:
  """Sorted; numerically when every name is an integer ("-1" before "+1" before "2" before "10"; equal numbers
  written differently, "1" and "01", by their text), else as strings."""
  if all(INTEGER.fullmatch(name) for name in names):
    return tuple(sorted(names, key=lambda name: (int(name), name)))
  return tuple(sorted(names))


def cell(record: dict, key: str, path: str, line: int) -> str:
  """A text or label cell as a string (JSON lines may hold numbers or booleans)."""
  value = field(record, key, path, line, (str, int, float, bool))
  return json.dumps(value) if isinstance(value, bool) else str(value)


def check_spellings(first_line: dict[str, int], path: str) -> None:
  """Refuses two labels of a train file that say one class but for their spacing or number format ("0", "0 ",
  "0.0"): the label set would get a class per spelling, each trained on part of the class's rows."""
  said: dict[str | float, str] = {}
  for name, line in first_line.items():
    other = said.setdefault(class_spelling(name), name)
    if other != name:
      raise DataFileError(path, line, f"label {name!r} differs from label {other!r} (line {first_line[other]}) only in "
                                   "spacing or number format; write each class one way (or list both in data.labels "
                                   "to keep them apart).")


class ClassificationTask(SequenceClassificationTask):
  metric_names = ("accuracy", "macro_f1")
  metric_name = "accuracy"
  few_classes_fix = "or set data.regression=True for numbers"  # told when the train file has fewer than 2 labels

  def __init__(self, settings: TaskSettings):
    super().__init__(settings)
    if settings.regression and settings.labels:
      raise InputError("data.regression=True takes no data.labels; drop one of them.")
    if len(settings.labels) == 1:
      raise InputError(f"data.labels={list(settings.labels)} names one class; a classifier needs two or more "
                       "(list every class, e.g. labels=neg|pos).")
    if settings.regression:
      self.metric_names = ("pearson", "spearman", "mse")
      self.metric_name = self.metric_names[0]

  @property
  def text_pairs(self) -> bool:
    return bool(self.settings.text_pair_column)

  @functools.cached_property
  def labels(self) -> tuple[str, ...] | None:
    if self.settings.regression:
      return None
    if self.settings.labels:
      return self.settings.labels
    path = self.split_path("train")
    if not storage.path(path).exists():
      raise MissingFileError(f"{path} not found, and the label set comes from the train file unless given: set "
                             "--config.data.labels='(\"neg\", \"pos\")' (the class names in output order).")
    s = self.settings
    names: dict[str, int] = {}  # label -> its first line
    for line, record in user_records(path):
      for name in self._row_labels(record, path, line):
        names.setdefault(name, line)
    check_spellings(names, path)
    if len(names) < 2:
      raise DataFileError(path, None, f"column {s.label_column!r} has {len(names)} distinct label(s) {sorted(names)}; "
                                   f"a classifier needs two or more ({self.few_classes_fix}).")
    return label_order(set(names))

  @property
  def is_regression(self) -> bool:  # without reading the train file's labels
    return self.settings.regression

  # --- data -----------------------------------------------------------------------------------------------
  def split_path(self, split: str) -> str:
    return find_split_file(self.settings.path, split)

  def read_examples(self, path: str, labeled: bool) -> list[GlueExample]:
    return self._read(path, labeled)

  def read_user_examples(self, path: str) -> list[GlueExample]:
    """The same columns as the train file, without the label."""
    return self._read(path, labeled=False)

  def _read(self, path: str, labeled: bool) -> list[GlueExample]:
    s = self.settings
    examples, ids = [], Ids(path)
    for line, record in user_records(path):
      guid = ids.add(cell(record, s.id_column, path, line), line) if s.id_column else str(len(examples))
      pair = cell(record, s.text_pair_column, path, line) if s.text_pair_column else None
      label = self._label(record, path, line) if labeled else None
      examples.append(GlueExample(guid, cell(record, s.text_column, path, line), pair, label))
    return examples

  def _row_labels(self, record: dict, path: str, line: int) -> list[str]:
    """The labels a labelled row gives (the label set is collected from the train file's): its label cell, which
    must not be empty (it would be a class "", or an unknown label)."""
    text = cell(record, self.settings.label_column, path, line)
    if not text.strip():
      raise DataFileError(path, line, f"missing label: column {self.settings.label_column!r} is empty; every row of "
                                   "train and dev needs its label (unlabelled rows belong in the test file).")
    return [check_name(text, "label", path, line)]

  def _label(self, record: dict, path: str, line: int) -> int | float:
    """A labelled row's target: its class index, or its score for a regression."""
    text = self._row_labels(record, path, line)[0]
    if self.is_regression:
      return score_label(text, path, line, "data.regression=True")
    return self._class_index(text, path, line)

  def _class_index(self, name: str, path: str, line: int) -> int:
    if name not in self.labels:
      raise DataFileError(path, line, f"unknown label {name!r}{near_miss(name, self.labels)}; expected one of "
                                   f"{list(self.labels)} (the label set is data.labels, else the train file's "
                                   "labels: add it there).")
    return self.labels.index(name)

  # --- outputs --------------------------------------------------------------------------------------------
  def postprocess(self, split: Split, outputs) -> np.ndarray:
    """Per example: the score (regression) or the probability of every class [N, C]."""
    check_outputs(split, outputs)
    logits = np.asarray(outputs["logits"], np.float64)
    if self.is_regression:
      return logits[:, 0]
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    return probabilities / probabilities.sum(-1, keepdims=True)

  def score(self, split: Split, predictions) -> dict[str, float]:
    return super().score(split, predictions if self.is_regression else np.asarray(predictions).argmax(-1))

  def write_predictions(self, split: Split, predictions, path: str) -> None:
    """JSON lines: {"id", "label", "probabilities": {class: p}} or, for a regression, {"id", "score"}."""
    with storage.open_atomic(path) as f:
      for ex, pred in zip(split.examples, predictions, strict=True):
        if self.is_regression:
          row = {"id": ex.guid, "score": float(pred)}
        else:
          row = {"id": ex.guid, "label": self.labels[int(np.argmax(pred))],
                 "probabilities": {name: round(float(p), 6) for name, p in zip(self.labels, pred)}}
        f.write(json.dumps(row) + "\n")

  def read_predictions(self, path: str, split: Split) -> np.ndarray:
    """Inverse of `write_predictions`, in the order of `split`; every example needs exactly one row."""
    by_id = {}
    for line, record in user_records(path):
      key = str(field(record, "id", path, line, (str, int)))
      if key in by_id:
        raise DataFileError(path, line, f"id {key} is predicted twice; keep one row.")
      if self.is_regression:
        by_id[key] = float(field(record, "score", path, line, (int, float)))
      else:
        probabilities = field(record, "probabilities", path, line, dict)
        by_id[key] = [float(probabilities.get(name, 0.0)) for name in self.labels]
    missing = [ex.guid for ex in split.examples if ex.guid not in by_id]
    if missing:
      raise DataFileError(path, None, f"no prediction for {len(missing)} example(s), e.g. id {missing[0]}")
    return np.asarray([by_id[ex.guid] for ex in split.examples])


SEPARATOR = "|"  # between the classes of a multi-label row's label cell
THRESHOLDS_FILE = "thresholds.json"  # beside the best weights: the per-class decision thresholds tuned on dev
DEFAULT_THRESHOLD = 0.5


def binary_cross_entropy(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Sigmoid cross-entropy averaged over rows and classes (torch's BCEWithLogitsLoss, transformers' multi-label
  loss) and the subset accuracy at probability 0.5 (logit 0), of multi-hot labels [B, C]."""
  logits = logits.astype(jnp.float32)
  loss = optax.sigmoid_binary_cross_entropy(logits, labels.astype(jnp.float32)).mean()
  return loss, jnp.all((logits >= 0) == (labels == 1), axis=-1).mean()


class MultiLabelClassificationTask(ClassificationTask):
  """`classification` with any number of classes per row (`experiments/classification.py:multi_label=true`): the
  label cell lists them separated by "|" ("sports|politics"; empty: none), one sigmoid output per class trained
  with binary cross-entropy. Dev is scored at probability 0.5 (micro F1 selects the checkpoint) and with per-class
  thresholds tuned on dev (`tuned_*`, optimistic: chosen on the rows they score); the best checkpoint's thresholds
  are saved with it (THRESHOLDS_FILE) and choose the labels of every prediction made with those weights.
  Predictions are JSON lines {"id", "label": "a|b", "probabilities": {class: p}}."""
  few_classes_fix = "a row may list several, separated by '|'"
  metric_names = ("micro_f1", "macro_f1", "subset_accuracy")
  metric_name = "micro_f1"

  def __init__(self, settings: TaskSettings):
    if settings.regression:
      raise InputError("data.regression=True has one output, multi-label classification one per class; drop one "
                       "of them.")
    super().__init__(settings)
    for name in settings.labels:
      if SEPARATOR in name or not name.strip():
        raise InputError(f"data.labels name {name!r} {'holds the separator' if name.strip() else 'is empty'}: a "
                         f"multi-label row lists its classes separated by {SEPARATOR!r}; rename the class.")
    self.thresholds: np.ndarray | None = None  # per class; None: DEFAULT_THRESHOLD for every class

  @property
  def hf_head(self) -> HFHead:
    return HFHead(self.hf_architecture, self.labels, problem_type=MULTI_LABEL)

  # --- data -----------------------------------------------------------------------------------------------
  def _row_labels(self, record: dict, path: str, line: int) -> list[str]:
    """The classes of a row's label cell ("a|b"; empty or blank: none), each named once and not empty."""
    text = cell(record, self.settings.label_column, path, line)
    if not text.strip():
      return []
    names = [check_name(name, "label", path, line) for name in text.split(SEPARATOR)]
    if not all(name.strip() for name in names):
      raise DataFileError(path, line, f"label {text!r} has an empty class between its {SEPARATOR!r} separators; "
                                   f"write the classes as a{SEPARATOR}b (an empty cell: no class).")
    if len(set(names)) < len(names):
      twice = next(name for name in names if names.count(name) > 1)
      raise DataFileError(path, line, f"label {text!r} names class {twice!r} twice; list each class once.")
    return names

  def read_examples(self, path: str, labeled: bool) -> list[GlueExample]:
    """Refuses a train file whose rows name no class at all (with data.labels given): every target would be all
    zeros, and the classifier would learn to predict no class, with nothing said."""
    examples = super().read_examples(path, labeled)
    if labeled and path == self.split_path("train") and not any(any(ex.label) for ex in examples):
      raise DataFileError(path, None, f"no row names a class (column {self.settings.label_column!r} is empty on all "
                                   f"{len(examples)} rows); a classifier trained on it learns to predict none: label "
                                   f"the rows (classes separated by {SEPARATOR!r}), or point data.label_column at "
                                   "the column that holds them.")
    return examples

  def _label(self, record: dict, path: str, line: int) -> tuple[int, ...]:
    """Multi-hot over `labels`."""
    hot = [0] * len(self.labels)
    for name in self._row_labels(record, path, line):
      hot[self._class_index(name, path, line)] = 1
    return tuple(hot)

  # --- model ----------------------------------------------------------------------------------------------
  def dummy_batch(self, batch_size: int) -> dict[str, np.ndarray]:
    return {**super().dummy_batch(batch_size), "label": np.zeros((batch_size, self.num_outputs), np.int32)}

  def loss_and_metrics(self, model, params, batch, rng, deterministic: bool):
    loss, exact = binary_cross_entropy(apply_model(model, params, batch, rng, deterministic), batch["label"])
    return loss, {"loss": loss, "subset_accuracy": exact}

  # --- outputs --------------------------------------------------------------------------------------------
  def postprocess(self, split: Split, outputs) -> np.ndarray:
    """Per example, every class's probability [N, C] (a sigmoid each)."""
    check_outputs(split, outputs)
    return np.exp(-np.logaddexp(0.0, -np.asarray(outputs["logits"], np.float64)))

  def _gold(self, split: Split) -> np.ndarray:
    if any(ex.label is None for ex in split.examples):
      raise InputError(f"split {split.name!r} ({split.path}) has no labels to score against.")
    return np.asarray([ex.label for ex in split.examples], bool)

  def score(self, split: Split, predictions) -> dict[str, float]:
    """At probability 0.5, and with each class's threshold tuned on `split` itself (`tuned_*`)."""
    gold, probabilities = self._gold(split), np.asarray(predictions)
    tuned = metrics.best_thresholds(gold, probabilities, DEFAULT_THRESHOLD)
    return {**metrics.multi_label_scores(gold, probabilities >= DEFAULT_THRESHOLD),
            **{f"tuned_{k}": v for k, v in metrics.multi_label_scores(gold, probabilities >= tuned).items()}}

  def tune(self, predictions: dict[str, tuple[Split, Any]], directory: str) -> None:
    """Thresholds tuned on the checkpoint-selecting split's predictions: applied from now on, and saved."""
    split, probabilities = predictions[self.eval_splits[0]]
    self.thresholds = metrics.best_thresholds(self._gold(split), probabilities, DEFAULT_THRESHOLD)
    record = {"labels": list(self.labels), "thresholds": [float(t) for t in self.thresholds], "tuned_on": split.path}
    storage.write_atomic(os.path.join(directory, THRESHOLDS_FILE), json.dumps(record, indent=2))

  def use_tuning(self, directory: str) -> None:
    """The thresholds saved with the weights in `directory`; without a file (the latest checkpoint of a run that
    kept no best): DEFAULT_THRESHOLD."""
    path = os.path.join(directory, THRESHOLDS_FILE)
    if not storage.path(path).exists():
      self.thresholds = None
      return
    try:
      record = json.loads(storage.path(path).read_text())
    except ValueError:  # not JSON (nor UTF-8)
      record = None
    thresholds = record.get("thresholds") if isinstance(record, dict) else None
    if not (isinstance(thresholds, list) and record.get("labels") == list(self.labels)
            and len(thresholds) == len(self.labels)
            and all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 1 for t in thresholds)):
      raise InputError(f"{path} holds no thresholds for the classes {list(self.labels)} (one number in [0, 1] per "
                       "class, as training writes them); delete it to predict at probability 0.5.")
    self.thresholds = np.asarray(thresholds, np.float64)

  def chosen(self, probabilities: np.ndarray) -> list[str]:
    """The classes whose probability reaches their threshold."""
    thresholds = DEFAULT_THRESHOLD if self.thresholds is None else self.thresholds
    return [name for name, chosen in zip(self.labels, probabilities >= thresholds) if chosen]

  def write_predictions(self, split: Split, predictions, path: str) -> None:
    """JSON lines: {"id", "label": the chosen classes joined by "|" ("" for none), "probabilities": {class: p}}."""
    with storage.open_atomic(path) as f:
      for ex, probabilities in zip(split.examples, predictions, strict=True):
        row = {"id": ex.guid, "label": SEPARATOR.join(self.chosen(probabilities)),
               "probabilities": {name: round(float(p), 6) for name, p in zip(self.labels, probabilities)}}
        f.write(json.dumps(row) + "\n")
