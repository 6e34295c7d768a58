"""`multiple_choice`: your own questions with options (SWAG, ARC, CommonsenseQA, ... converted to one format).

`data.path` holds `train.jsonl`, `dev.jsonl` (and optionally `test.jsonl`), one question per line:
{"id" (optional), "context", "question", "options": [strings], "answer": index of the right option}. Inputs and
head are RACE's (`race.py`): per option `[CLS] context [SEP] question option [SEP]`, the question+option part
keeping its last `data.max_qa_length` tokens, one score per option and a softmax across them. Up to
`data.num_choices` options per question; fewer are padded and masked. Predictions: JSON lines
{"id", "answer", "probabilities": [one per option]}.
"""
from __future__ import annotations

import json
import os

import numpy as np

from albert_jax import storage
from albert_jax.errors import InputError
from albert_jax.tasks.base import Split, TaskSettings, check_outputs
from albert_jax.tasks.input_text import DataFileError
from albert_jax.tasks.race import RaceExample, RaceTask
from albert_jax.tasks.records import Ids, field, optional_id, user_records


class MultipleChoiceTask(RaceTask):
  predictions_suffix = ".jsonl"
  download = None  # your own data

  def __init__(self, settings: TaskSettings):
    super().__init__(settings)
    if settings.num_choices < 2:
      raise InputError(f"data.num_choices={settings.num_choices}: a question needs at least 2 options.")
    self.num_choices = settings.num_choices

  def split_path(self, split: str) -> str:
    return os.path.join(self.settings.path, f"{split}.jsonl")

  def read_examples(self, path: str, labeled: bool) -> list[RaceExample]:
    examples, ids = [], Ids(path)
    for line, r in user_records(path):
      options = field(r, "options", path, line, list)
      odd = [o for o in options if isinstance(o, bool) or not isinstance(o, (str, int, float))]
      if odd:
        raise DataFileError(path, line, f"option {json.dumps(odd[0])} is not text (options are strings, or numbers)")
      options = [str(o) for o in options]
      if not 2 <= len(options) <= self.num_choices:
        raise DataFileError(path, line, f"{len(options)} options; between 2 and data.num_choices={self.num_choices} "
                                     "are allowed (raise data.num_choices for more).")
      answer = field(r, "answer", path, line, int) if labeled else None
      if answer is not None and not 0 <= answer < len(options):
        raise DataFileError(path, line, f"answer {answer} is not an index of the {len(options)} options (0-based)")
      examples.append(RaceExample(optional_id(r, path, line, len(examples), ids), "", field(r, "context", path, line),
                                  field(r, "question", path, line), options, answer))
    return examples

  def read_user_examples(self, path: str) -> list[RaceExample]:
    """The train file's fields without "answer"."""
    return self.read_examples(path, labeled=False)

  @staticmethod
  def choice_text(question: str, option: str) -> str:
    return f"{question} {option}".strip()

  # --- outputs --------------------------------------------------------------------------------------------
  def postprocess(self, split: Split, outputs) -> np.ndarray:
    """Every option's probability [N, num_choices] (0 for padding)."""
    check_outputs(split, outputs)
    logits = np.asarray(outputs["logits"], np.float64)
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    return probabilities / probabilities.sum(-1, keepdims=True)

  def score(self, split: Split, predictions) -> dict[str, float]:
    labels = [ex.label for ex in split.examples]
    if any(label is None for label in labels):
      raise InputError(f"split {split.name!r} ({split.path}) has no answers to score against.")
    return {"accuracy": float(np.mean(np.asarray(predictions).argmax(-1) == labels))}

  def write_predictions(self, split: Split, predictions, path: str) -> None:
    with storage.open_atomic(path) as f:
      for ex, p in zip(split.examples, predictions, strict=True):
        f.write(json.dumps({"id": ex.qid, "answer": int(np.argmax(p)),
                            "probabilities": [round(float(v), 6) for v in p[:len(ex.options)]]}) + "\n")

  def read_predictions(self, path: str, split: Split) -> np.ndarray:
    by_id, ids = {}, Ids(path, "keep one row per question")
    for line, r in user_records(path):
      by_id[ids.add(str(field(r, "id", path, line, (str, int))), line)] = field(r, "probabilities", path, line, list)
    missing = [ex.qid for ex in split.examples if ex.qid not in by_id]
    if missing:
      raise DataFileError(path, None, f"no prediction for {len(missing)} question(s), e.g. id {missing[0]}")
    return np.asarray([by_id[ex.qid] + [0.0] * (self.num_choices - len(by_id[ex.qid])) for ex in split.examples])
