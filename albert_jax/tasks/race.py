"""RACE: multiple choice over 4 options, read from the original distribution layout
`<data.path>/<split>/{middle,high}/<n>.txt` (one JSON passage per file: article, questions, options, answers, id).

Per option (google-research/albert `race_utils.py`): `[CLS] article [SEP] question⊕option [SEP]`, where ⊕
replaces every "_" of a cloze question by the option, else appends the option after a space; the qa part keeps
its LAST `max_qa_length` tokens and the article is cut at its end to fit. Features are [N, 4, S]; each option
gets one score from the multiple-choice scorer of the head's family (`classifier_head`: ALBERT's pooled -> dropout
-> dense 1, ELECTRA's on the first token) and a softmax runs across the 4. Accuracy is reported for
middle, high and all (the paper's RACE-M / RACE-H / RACE).
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np

from albert_jax import families, storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.head_identity import HFHead
from albert_jax.tasks.base import (Split, Task, TaskSettings, apply_model, check_outputs, cross_entropy, pack,
                                   stack_packed)
from albert_jax.tasks.input_text import DataFileError, read_text
from albert_jax.tasks.records import Ids, check_ids, field, optional_id, parse_json, read_id_map, user_records

LETTERS = "ABCD"
LEVELS = ("middle", "high")


@dataclasses.dataclass
class RaceExample:
  qid: str                # "<passage id>-<question number>", e.g. "high10024.txt-0"
  level: str              # "middle" | "high" | "" (user input)
  article: str
  question: str
  options: list[str]
  label: int | None       # index of the right option


def qa_text(question: str, option: str) -> str:
  return question.replace("_", option) if "_" in question else f"{question} {option}"


class RaceTask(Task):
  """Also the base of `multiple_choice`, which reads other files and may have other option counts: examples with
  fewer than `num_choices` options are padded with empty ones that `choice_mask` removes from the softmax."""
  num_choices = len(LETTERS)
  predictions_suffix = ".json"
  download = ("race", "RACE")

  def __init__(self, settings: TaskSettings):
    super().__init__(settings)
    d = settings
    if d.max_qa_length + 3 >= d.max_seq_length:
      raise InputError(f"data.max_qa_length={d.max_qa_length} leaves no room for the article in "
                       f"data.max_seq_length={d.max_seq_length}; give --config.data.max_qa_length="
                       f"{max(d.max_seq_length - 4, 1)} or less.")

  # --- data -----------------------------------------------------------------------------------------------
  def split_path(self, split: str) -> str:
    return os.path.join(self.settings.path, split)

  def read_examples(self, path: str, labeled: bool) -> list[RaceExample]:
    levels = [level for level in LEVELS if storage.path(path).joinpath(level).is_dir()]
    if not levels:
      raise MissingFileError(f"{path} has neither middle/ nor high/; point --config.data.path at the RACE folder "
                             "holding train/ dev/ test/ (each with middle/ and high/).")
    examples, ids = [], Ids(path)  # unique across the split's files
    for level in levels:
      folder = os.path.join(path, level)
      for name in sorted(p.name for p in storage.path(folder).iterdir() if p.name.endswith(".txt")):
        examples.extend(self._passage(os.path.join(folder, name), level, labeled, ids))
    return examples

  def _passage(self, path: str, level: str, labeled: bool, ids: Ids) -> list[RaceExample]:
    try:
      passage = parse_json(read_text(path), path)
    except json.JSONDecodeError as e:
      raise DataFileError(path, e.lineno, f"not a RACE JSON passage ({e.msg})") from None
    questions, options = field(passage, "questions", path, 1, list), field(passage, "options", path, 1, list)
    answers = field(passage, "answers", path, 1, list) if labeled else [None] * len(questions)
    if not len(questions) == len(options) == len(answers):
      raise DataFileError(path, 1, f"{len(questions)} questions, {len(options)} option lists, {len(answers)} answers")
    examples = []
    for i, (question, choices, answer) in enumerate(zip(questions, options, answers)):
      where = f"1 (question {i})"
      qid = ids.add(f"{passage.get('id', os.path.basename(path))}-{i}", where, path=path)
      examples.append(self._example(qid, level, field(passage, "article", path, 1), question, choices, answer, path,
                                    where))
    return examples

  @staticmethod
  def _example(qid, level, article, question, options, answer, path, where) -> RaceExample:
    if len(options) != len(LETTERS):
      raise DataFileError(path, where, f"{len(options)} options; RACE questions have exactly 4")
    if answer is not None and answer not in LETTERS:
      raise DataFileError(path, where, f"unknown answer {answer!r}; expected one of A, B, C, D")
    return RaceExample(qid, level, article, question, list(options), None if answer is None else LETTERS.index(answer))

  def read_user_examples(self, path: str) -> list[RaceExample]:
    """JSON lines {"id" (optional: else the row number; unique), "article", "question", "options": [4 strings]}."""
    ids = Ids(path)
    return [self._example(optional_id(r, path, line, row, ids), "", field(r, "article", path, line),
                          field(r, "question", path, line), field(r, "options", path, line, list), None, path, line)
            for row, (line, r) in enumerate(user_records(path))]

  def featurize(self, examples: list[RaceExample], tokenizer):
    d = self.settings
    articles: dict[str, list[int]] = {}
    rows = []
    for ex in examples:
      if ex.article not in articles:  # a passage has several questions: tokenize it once
        articles[ex.article] = tokenizer.encode(ex.article)
      article = articles[ex.article]
      for option in ex.options + [""] * (self.num_choices - len(ex.options)):
        qa = tokenizer.encode(self.choice_text(ex.question, option))[-d.max_qa_length:]
        room = d.max_seq_length - len(qa) - tokenizer.pair_layout.special_tokens(pair=True)
        rows.append(pack(article[:room], qa, tokenizer.cls_id, tokenizer.sep_id, d.max_seq_length,
                         tokenizer.pair_layout))
    features = stack_packed(rows, (len(examples), self.num_choices))
    features["choice_mask"] = np.asarray([[i < len(ex.options) for i in range(self.num_choices)]
                                          for ex in examples], np.int32)
    if all(ex.label is not None for ex in examples):
      features["label"] = np.asarray([ex.label for ex in examples], np.int32)
    return features, {}

  @staticmethod
  def choice_text(question: str, option: str) -> str:
    return qa_text(question, option)

  # --- model ----------------------------------------------------------------------------------------------
  family_head = "multiple-choice"

  def make_model(self, model_config):
    return self.head_family.multiple_choice()(model_config, 1, self.settings.classifier_dropout_prob)

  @property
  def hf_head(self) -> HFHead:
    return HFHead(self.head_family.hf_class(families.MULTIPLE_CHOICE))

  def dummy_batch(self, batch_size: int) -> dict[str, np.ndarray]:
    shape = (batch_size, self.num_choices, self.settings.max_seq_length)
    return {"input_ids": np.zeros(shape, np.int32), "attention_mask": np.ones(shape, np.int32),
            "token_type_ids": np.zeros(shape, np.int32), "label": np.zeros(batch_size, np.int32),
            "choice_mask": np.ones((batch_size, self.num_choices), np.int32)}

  @staticmethod
  def choice_logits(model, params, batch, rng=None, deterministic: bool = True):
    """One score per option [B, num_choices]; padded options get -1e9 (probability 0 in float32, finite gradients)."""
    logits = apply_model(model, params, batch, rng, deterministic)[..., 0]
    return jnp.where(batch["choice_mask"] > 0, logits, -1e9)

  def loss_and_metrics(self, model, params, batch, rng, deterministic: bool):
    loss, acc = cross_entropy(self.choice_logits(model, params, batch, rng, deterministic), batch["label"])
    return loss, {"loss": loss, "accuracy": acc}

  def predict_step(self, model, params, batch):
    return {"logits": self.choice_logits(model, params, batch)}

  # --- outputs --------------------------------------------------------------------------------------------
  def postprocess(self, split: Split, outputs) -> dict[str, str]:
    check_outputs(split, outputs)
    choice = np.asarray(outputs["logits"]).argmax(-1)
    return {ex.qid: LETTERS[c] for ex, c in zip(split.examples, choice, strict=True)}

  def score(self, split: Split, predictions: dict[str, str]) -> dict[str, float]:
    """Accuracy over all questions and per level; a question without a prediction counts as wrong (`missing`)."""
    out = {"missing": sum(ex.qid not in predictions for ex in split.examples)}
    for name, level in (("accuracy", None), *((f"accuracy_{lv}", lv) for lv in LEVELS)):
      chosen = [ex for ex in split.examples if level in (None, ex.level)]
      if chosen:
        out[name] = float(np.mean([predictions.get(ex.qid) == LETTERS[ex.label] for ex in chosen]))
    return out

  def write_predictions(self, split: Split, predictions: dict[str, str], path: str) -> None:
    storage.write_atomic(path, json.dumps(predictions, indent=1))

  def read_predictions(self, path: str, split: Split) -> dict[str, str]:
    """{question id: letter} for ids of `split` only (a SQuAD or GLUE file is refused by its values or ids)."""
    predictions = read_id_map(path, "one of the letters A, B, C, D", lambda v: v in tuple(LETTERS))
    check_ids(path, predictions, split)
    return predictions
