"""GLUE: the original TSV files, `[CLS] a [SEP] b [SEP]` inputs, a pooled classifier (MSE regression for STS-B),
GLUE's metrics and its submission TSVs.

Columns per task follow the files that GLUE's download script writes (and google-research/albert
`classifier_utils.py`); the selection metric is the original's: Matthews corr. for CoLA, Pearson for STS-B,
accuracy elsewhere (F1 for MRPC/QQP and Spearman for STS-B are reported too, as on the GLUE leaderboard).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from albert_jax import storage
from albert_jax.errors import InputError
from albert_jax.tasks.base import Split, TaskSettings
from albert_jax.tasks.input_text import DataFileError, score_label
from albert_jax.tasks.records import Ids, check_name, column, field, near_miss, optional_id, tsv_rows, user_records
from albert_jax.tasks.sequence import SequenceClassificationTask

_NLI = ("contradiction", "entailment", "neutral")
_ENTAIL = ("entailment", "not_entailment")
_BINARY = ("0", "1")


@dataclasses.dataclass(frozen=True)
class GlueSpec:
  """Where a task's text and labels are. `columns` = (text_a, text_b or None, label) of train/dev files;
  `test_columns` = (text_a, text_b) of the unlabelled test file, whose first column is the submission index."""
  directory: str
  labels: tuple[str, ...] | None        # None: regression (STS-B)
  columns: tuple[int, int | None, int] | None
  test_columns: tuple[int, int | None]
  files: dict[str, str]
  submission: dict[str, str]            # split -> file name the GLUE server expects
  metric_name: str = "accuracy"
  headerless_fields: int = 0            # train/dev files without a header (CoLA): their number of fields
  companions: tuple[str, ...] = ()      # test-only tasks predicted with this task's model (MNLI: AX)

  @property
  def is_regression(self) -> bool:
    return self.labels is None


_STANDARD = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}

SPECS: dict[str, GlueSpec] = {
    "cola": GlueSpec("CoLA", _BINARY, (3, None, 1), (1, None), _STANDARD, {"test": "CoLA.tsv"}, "mcc",
                     headerless_fields=4),
    "sst-2": GlueSpec("SST-2", _BINARY, (0, None, 1), (1, None), _STANDARD, {"test": "SST-2.tsv"}),
    "mrpc": GlueSpec("MRPC", _BINARY, (3, 4, 0), (3, 4), _STANDARD, {"test": "MRPC.tsv"}),
    "sts-b": GlueSpec("STS-B", None, (7, 8, 9), (7, 8), _STANDARD, {"test": "STS-B.tsv"}, "pearson"),
    "qqp": GlueSpec("QQP", _BINARY, (3, 4, 5), (1, 2), _STANDARD, {"test": "QQP.tsv"}),
    "mnli": GlueSpec("MNLI", _NLI, (8, 9, -1), (8, 9),
                     {"train": "train.tsv", "dev": "dev_matched.tsv", "dev_mismatched": "dev_mismatched.tsv",
                      "test": "test_matched.tsv", "test_mismatched": "test_mismatched.tsv"},
                     {"test": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}, companions=("ax",)),
    "qnli": GlueSpec("QNLI", _ENTAIL, (1, 2, 3), (1, 2), _STANDARD, {"test": "QNLI.tsv"}),
    "rte": GlueSpec("RTE", _ENTAIL, (1, 2, 3), (1, 2), _STANDARD, {"test": "RTE.tsv"}),
    "wnli": GlueSpec("WNLI", _BINARY, (1, 2, 3), (1, 2), _STANDARD, {"test": "WNLI.tsv"}),
    # The diagnostic set: test only, predicted with an MNLI model (init_checkpoint = the MNLI run).
    "ax": GlueSpec("diagnostic", _NLI, None, (1, 2), {"test": "diagnostic.tsv"}, {"test": "AX.tsv"}),
}
# Reported next to the selection metric, as on the GLUE leaderboard.
_EXTRA_METRICS = {"mrpc": ("f1",), "qqp": ("f1",), "sts-b": ("spearman",)}


@dataclasses.dataclass
class GlueExample:
  guid: str                       # the test file's index (submission key); the row number otherwise
  text_a: str
  text_b: str | None
  label: int | float | None       # class index, STS-B score, or None (test / user input)


def spec_for(task_name: str) -> GlueSpec:
  name = task_name.lower()
  if name not in SPECS:
    raise InputError(f"Unknown GLUE task {task_name!r}; choose one of {sorted(SPECS)}.")
  return SPECS[name]


class GlueTask(SequenceClassificationTask):
  predictions_suffix = ".tsv"
  download = ("glue", "glue")

  def __init__(self, settings: TaskSettings):
    super().__init__(settings)
    self.name = settings.task_name.lower()
    self.spec = spec_for(self.name)
    self.metric_name = self.spec.metric_name
    self.metric_names = (self.metric_name, *_EXTRA_METRICS.get(self.name, ()))
    # MNLI: matched selects the checkpoint, mismatched is reported with it.
    self.eval_splits = tuple(s for s in self.spec.files if s.startswith("dev"))

  @property
  def labels(self) -> tuple[str, ...] | None:
    return self.spec.labels

  @property
  def text_pairs(self) -> bool:
    return self.spec.test_columns[1] is not None

  @property
  def test_splits(self) -> tuple[str, ...]:
    """MNLI: matched, mismatched and AX (the diagnostic set, from the folder beside MNLI/)."""
    return (*(s for s in self.spec.files if s.startswith("test")), *self.spec.companions)

  def _companion(self, split: str) -> GlueTask | None:
    """The test-only task named `split` (AX for MNLI), reading its own folder beside this task's."""
    if split not in self.spec.companions:
      return None
    folder = os.path.join(os.path.dirname(os.path.normpath(self.settings.path)), SPECS[split].directory)
    return GlueTask(dataclasses.replace(self.settings, task_name=split, path=folder))

  def load_split(self, split: str, tokenizer) -> Split:
    companion = self._companion(split)
    if companion is None:
      return super().load_split(split, tokenizer)
    return dataclasses.replace(companion.load_split("test", tokenizer), name=split)

  # --- data -----------------------------------------------------------------------------------------------
  def split_path(self, split: str) -> str:
    if self._companion(split):
      return self._companion(split).split_path("test")
    if split not in self.spec.files:
      raise InputError(f"GLUE {self.name} has no split {split!r}; choose one of "
                       f"{sorted([*self.spec.files, *self.spec.companions])}.")
    return os.path.join(self.settings.path, self.spec.files[split])

  def read_examples(self, path: str, labeled: bool) -> list[GlueExample]:
    """Every row must have as many fields as the header (CoLA's header-less train/dev files: 4), since a stray tab
    inside a sentence otherwise shifts the columns silently (text_a = its first words, text_b lost). A test file's
    index is the submission's key, so it is unique (`Ids`)."""
    rows = tsv_rows(path)
    if labeled and self.spec.headerless_fields:
      width, expected = self.spec.headerless_fields, f"{self.spec.directory} files have {self.spec.headerless_fields}"
    else:  # every GLUE test file has a header, even CoLA's
      header_line, header = next(rows, (1, []))
      width, expected = len(header), f"the header (line {header_line}) has {len(header)}"
    if labeled and self.spec.columns is None:
      raise InputError(f"GLUE {self.name} has no labelled files (test only: predict with --mode=predict).")
    examples, ids = [], Ids(path)
    for number, fields in rows:
      if len(fields) != width:
        raise DataFileError(path, number, f"{len(fields)} tab-separated fields but {expected}; a tab inside the text? "
                                       "Replace it by a space on that line.")
      get = lambda i: None if i is None else column(fields, i, path, number)
      if labeled:
        a, b, label = self.spec.columns
        examples.append(GlueExample(str(len(examples)), get(a), get(b), self._label(get(label), path, number)))
      else:
        a, b = self.spec.test_columns
        examples.append(GlueExample(ids.add(get(0), number), get(a), get(b), None))
    return examples

  def _label(self, text: str, path: str, line: int) -> int | float:
    text = check_name(text, "label", path, line)
    if self.spec.is_regression:
      return score_label(text, path, line, "STS-B scores are 0-5")
    if text not in self.spec.labels:
      raise DataFileError(path, line, f"unknown label {text!r} for {self.name}{near_miss(text, self.spec.labels)}; "
                                   f"expected one of {self.spec.labels}")
    return self.spec.labels.index(text)

  def read_user_examples(self, path: str) -> list[GlueExample]:
    """TSV with a header (or JSON lines) with fields `text_a`, plus `text_b` for pair tasks; optional `id` (else
    the row number), unique in the file."""
    pair = self.spec.test_columns[1] is not None
    examples, ids = [], Ids(path)
    for line, record in user_records(path):
      examples.append(GlueExample(optional_id(record, path, line, len(examples), ids),
                                  field(record, "text_a", path, line),
                                  field(record, "text_b", path, line) if pair else None, None))
    return examples

  # --- outputs --------------------------------------------------------------------------------------------
  def write_predictions(self, split: Split, predictions, path: str) -> None:
    """GLUE's submission format: header `index<TAB>prediction`, label names (STS-B: the score)."""
    values = [f"{float(p):.6f}" if self.spec.is_regression else self.spec.labels[int(p)] for p in predictions]
    rows = [f"{ex.guid}\t{value}\n" for ex, value in zip(split.examples, values, strict=True)]
    storage.write_atomic(path, "index\tprediction\n" + "".join(rows))

  def read_predictions(self, path: str, split: Split) -> np.ndarray:
    """The submission format only: the header, then one `index<TAB>prediction` per example of `split`; refuses
    what would be scored wrongly without it (a missing header, a conflicting repeat, an unknown index)."""
    rows = tsv_rows(path)
    number, header = next(rows, (1, []))
    if header != ["index", "prediction"]:
      raise DataFileError(path, number, f"the first line must be the header 'index<TAB>prediction', got {header}; "
                                     "add that line (write_predictions writes it).")
    by_guid, line_of = {}, {}
    for number, fields in rows:
      if len(fields) != 2:
        raise DataFileError(path, number, f"{len(fields)} tab-separated fields, expected 2 (index, prediction); "
                                       "fix that line.")
      guid, prediction = fields[0], self._label(fields[1], path, number)
      if guid in by_guid and by_guid[guid] != prediction:
        raise DataFileError(path, number, f"index {guid} has another prediction on line {line_of[guid]}; keep one.")
      by_guid[guid], line_of[guid] = prediction, number
    extra = sorted(set(by_guid) - {ex.guid for ex in split.examples}, key=line_of.get)
    if extra:
      raise DataFileError(path, line_of[extra[0]], f"{len(extra)} index(es) are not in {split.path}, e.g. {extra[0]}; "
                                                "score against the gold file these predictions are for.")
    missing = [ex.guid for ex in split.examples if ex.guid not in by_guid]
    if missing:
      raise DataFileError(path, None, f"no prediction for {len(missing)} example(s), e.g. index {missing[0]}")
    return np.asarray([by_guid[ex.guid] for ex in split.examples])

  def submission_name(self, split: str) -> str:
    if self._companion(split):
      return self._companion(split).submission_name("test")
    return self.spec.submission.get(split, f"{self.spec.directory}-{split}.tsv")
