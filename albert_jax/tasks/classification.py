"""`classification`: your own sentence or sentence-pair data, the single most common fine-tuning use.

`data.path` holds `train`, `dev` (and optionally `test`) as `.tsv`, `.csv` or `.jsonl`, each with named
columns/fields: `data.text_column`, optionally `data.text_pair_column`, `data.label_column` and `data.id_column`.
The label set is `data.labels` when given, else the sorted set of the train file's labels (numbers in numeric
order), so the output order never depends on the order of the rows; `data.regression=True` reads the label as a
number and trains one output with MSE. Predictions are JSON lines with the label and every class's probability.
"""
from __future__ import annotations

import functools
import json
import os
import re

import numpy as np

from albert_jax import storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.tasks.base import DataFileError, Split, TaskSettings, check_outputs, score_label
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

  def __init__(self, settings: TaskSettings):
    super().__init__(settings)
    if settings.regression and settings.labels:
      raise InputError("data.regression=True takes no data.labels; drop one of them.")
    if len(settings.labels) == 1:
      raise InputError(f"data.labels={list(settings.labels)} names one class; a classifier needs two or more "
                       "(list every class, e.g. labels=neg|pos).")
    self.metric_names = ("pearson", "spearman", "mse") if settings.regression else ("accuracy", "macro_f1")
    self.metric_name = self.metric_names[0]

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
      names.setdefault(self._label_cell(record, path, line), line)
    check_spellings(names, path)
    if len(names) < 2:
      raise DataFileError(path, None, f"column {s.label_column!r} has {len(names)} distinct label(s) {sorted(names)}; "
                                   "a classifier needs two or more (or set data.regression=True for numbers).")
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
      label = self._label(self._label_cell(record, path, line), path, line) if labeled else None
      examples.append(GlueExample(guid, cell(record, s.text_column, path, line), pair, label))
    return examples

  def _label_cell(self, record: dict, path: str, line: int) -> str:
    """The label cell of a labelled row; an empty one is refused (it would be a class "", or an unknown label)."""
    text = cell(record, self.settings.label_column, path, line)
    if not text.strip():
      raise DataFileError(path, line, f"missing label: column {self.settings.label_column!r} is empty; every row of "
                                   "train and dev needs its label (unlabelled rows belong in the test file).")
    return check_name(text, "label", path, line)

  def _label(self, text: str, path: str, line: int) -> int | float:
    if self.is_regression:
      return score_label(text, path, line, "data.regression=True")
    if text not in self.labels:
      raise DataFileError(path, line, f"unknown label {text!r}{near_miss(text, self.labels)}; expected one of "
                                   f"{list(self.labels)} (the label set is data.labels, else the train file's "
                                   "labels: add it there).")
    return self.labels.index(text)

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
