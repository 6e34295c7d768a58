"""Head identity: what a head in a weights directory was trained for, and whether it fits the run at hand.

Weight shapes cannot tell two heads of the same size apart (MNLI's 3 classes in another order, a regression from a
multiple-choice scorer), nor a model with another head count or activation. This module decides, from what is
recorded with the weights:
- which head they hold: a fine-tuning run's `Task.identity()` (as `run.best` reads it), or a converted transformers
  head, `HFHead` (kind, class names and order, class count, problem type);
- whether that head is the one the task being run was trained for (`check_identity`, `head_trained_for`), and
  in which class order the task reads it (`as_recorded`, `task_for_weights`);
- which transformers class fine-tuned params leave as and come in from (`hf_head_from_config`, `hf_head_for`,
  `hf_config_fields`; SQuAD v2's answer-class head has none);
- whether weights hold the config's model: its parameter tree (sharing, layers, sizes) and what no shape shows (heads,
  activation) (`check_same_model`, run at every weight load by `record.check_same_function`).
The Flax heads themselves are in `tasks/heads.py`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from albert_jax import families
from albert_jax.errors import InputError
from albert_jax.run.config import SHAPE_FIELDS


# --- transformers' head classes -----------------------------------------------------------------------------
HF_ARCHITECTURE = "hf_architecture"  # the key that marks a converted head's record
# The default family's classes: what a head without a record exports as (`hf_head_for`).
_DEFAULT = families.get(families.DEFAULT)
SEQUENCE_CLASSIFICATION = _DEFAULT.hf_class(families.SEQUENCE_CLASSIFICATION)
QUESTION_ANSWERING = _DEFAULT.hf_class(families.QUESTION_ANSWERING)
TOKEN_CLASSIFICATION = _DEFAULT.hf_class(families.TOKEN_CLASSIFICATION)
MASKED_LM = _DEFAULT.hf_class(families.MASKED_LM)
# Every family's classes of each fine-tuned head: sequence classifiers (`Family.classifier`: classes, named or
# not, or a regression), question answering, token classifiers and multiple-choice scorers.
CLASSIFIERS = families.hf_classes(families.SEQUENCE_CLASSIFICATION)
LABELLED = (*CLASSIFIERS, *families.hf_classes(families.TOKEN_CLASSIFICATION))  # whose config names its classes
MULTI_LABEL = "multi_label_classification"  # the problem_type of a classifier with a sigmoid per class
# Every family's fine-tuned heads by the param name of ours that holds them.
HF_HEAD_PARAMS = {**dict.fromkeys((*LABELLED, *families.hf_classes(families.MULTIPLE_CHOICE)), "classifier"),
                  **dict.fromkeys(families.hf_classes(families.QUESTION_ANSWERING), "qa_outputs")}
# The answer-class head's top-level param names (the original's variable scopes, `heads.AnswerClassSpanHead`);
# HF has no class holding them.
ANSWER_CLASS_PARAMS = ("start_logits", "end_logits", "answer_class")


@dataclasses.dataclass(frozen=True)
class HFHead:
  """A head as transformers names it, so a fine-tuned model leaves as the class its users load (`formats.hf_albert.save_hf`).
  Our `classifier` is HF's `classifier` (sequence classification, regression, multiple choice: one score per
  option) and our `qa_outputs` HF's; the architecture tells regression [H, 1] from multiple choice [H, 1]."""
  architecture: str                      # AlbertFor{SequenceClassification,QuestionAnswering,MultipleChoice,...}
  labels: tuple[str, ...] | None = None  # class names (HF id2label) of a classifier; None: regression, or unnamed
  num_labels: int | None = None          # a converted classifier's classes, named or not (HF's LABEL_i)
  problem_type: str | None = None        # HF config.json's; None: regression for one output, else single-label

  def identity(self) -> dict[str, Any]:
    """What a converted directory records of its head (HEAD_FILE), in place of a fine-tuning run's
    `Task.identity()`: eval, predict and warm starts then read the classes in the order they were trained in."""
    return {HF_ARCHITECTURE: self.architecture, "labels": list(self.labels) if self.labels else None,
            "num_labels": self.num_labels, "problem_type": self.problem_type}

  @classmethod
  def from_identity(cls, identity: dict[str, Any] | None) -> HFHead | None:
    """The head a converted directory recorded; None for a fine-tuning run's record (a task, not a class)."""
    if not identity or HF_ARCHITECTURE not in identity:
      return None
    return cls(identity[HF_ARCHITECTURE], tuple(identity["labels"]) if identity.get("labels") else None,
               identity.get("num_labels"), identity.get("problem_type"))


def hf_head_from_config(hf_config: Mapping[str, Any], path: str) -> HFHead | None:
  """What the fine-tuned head of a transformers directory was trained for, from its config.json (None for the
  pretraining and backbone classes): the class names in id order (None when they are HF's default LABEL_i, which
  say nothing), their count and problem_type (a multi-label classifier fits a `multi_label=true` task only,
  `converted_head_fits`)."""
  architecture = (hf_config.get("architectures") or [""])[0]
  if architecture not in HF_HEAD_PARAMS:
    return None
  if architecture not in LABELLED:
    return HFHead(architecture)
  problem_type = hf_config.get("problem_type")
  id2label = {int(i): name for i, name in (hf_config.get("id2label") or {}).items()}
  if sorted(id2label) != list(range(len(id2label))):
    raise InputError(f"{path}: config.json's id2label has ids {sorted(id2label)}; expected 0 to "
                     f"{len(id2label) - 1}, one per output of the classifier.")
  names = tuple(id2label[i] for i in range(len(id2label)))
  unnamed = names == tuple(f"LABEL_{i}" for i in range(len(names)))
  return HFHead(architecture, None if unnamed else names, len(names), problem_type)


def check_hf_exportable(top_level: set[str]) -> None:
  """Refuses params holding SQuAD v2's answer-class head, which no transformers class has."""
  if top_level & set(ANSWER_CLASS_PARAMS):
    raise InputError(f"params hold SQuAD v2's answer-class head ({', '.join(ANSWER_CLASS_PARAMS)}), which no "
                     "transformers class has: export the encoder only (convert --encoder_only; in Python pass "
                     "{'albert': params['albert']}) or fine-tune with --config.data.v2_head=null_score.")


def hf_head_for(name: str, outputs: int, head: HFHead | None) -> tuple[HFHead, int]:
  """(transformers class, expected outputs) of fine-tuned params whose head is our `name` ("classifier" or
  "qa_outputs") with `outputs` outputs: `head` when given (the task's, or the converted one), else told by the
  param name; a one-output classifier without `head` is refused (regression or multiple choice?)."""
  if head is None:
    if name == "classifier" and outputs == 1:
      raise InputError("A one-output classifier is either a regression (AlbertForSequenceClassification) or a "
                       "multiple-choice scorer (AlbertForMultipleChoice), which the weights cannot tell apart: "
                       "convert the best/step_N directory inside its fine-tuning workdir (whose config.json names "
                       "the task), or pass head= (the task's hf_head) to save_hf.")
    head = HFHead(QUESTION_ANSWERING if name == "qa_outputs" else SEQUENCE_CLASSIFICATION)
  if HF_HEAD_PARAMS[head.architecture] != name:
    raise InputError(f"{head.architecture} keeps its head in {HF_HEAD_PARAMS[head.architecture]!r}, but params "
                     f"have {name!r}.")
  expected = {families.QUESTION_ANSWERING: 2, families.MULTIPLE_CHOICE: 1}.get(
      _role(head.architecture), len(head.labels) if head.labels else outputs)
  return head, expected


def hf_config_fields(head: HFHead, outputs: int) -> dict[str, Any]:
  """The config.json fields that say what `head` was trained for (`hf_head_from_config` reads them back)."""
  config: dict[str, Any] = {}
  if head.architecture in LABELLED:
    labels = head.labels or [f"LABEL_{i}" for i in range(outputs)]
    config = {"id2label": dict(enumerate(labels)), "label2id": {label: i for i, label in enumerate(labels)}}
  if head.architecture in CLASSIFIERS:
    config["problem_type"] = head.problem_type or (
        "single_label_classification" if head.labels or outputs > 1 else "regression")
  return config


# --- a task against recorded weights -------------------------------------------------------------------------
def as_recorded(task, recorded: dict | None):
  """`task` with the class order its weights recorded, when the config names none: re-deriving it from the train
  file gives the sorted labels, perhaps not training's (nor a converted head's). A task whose classes are fixed
  (GLUE's) stays as it is."""
  if not (recorded and recorded.get("labels") and not task.settings.labels and not task.settings.regression):
    return task
  reordered = type(task)(dataclasses.replace(task.settings, labels=tuple(recorded["labels"])))
  return reordered if reordered.identity()["labels"] == recorded["labels"] else task


def task_for_weights(task, recorded: dict | None, warm_start: bool = False):
  """The task as the weights recorded as `recorded` read it (`as_recorded`); by a warm start only for the train
  file's classes: a head for other classes starts afresh (`head_trained_for`)."""
  if warm_start and recorded and set(recorded.get("labels") or ()) != set(task.identity()["labels"] or ()):
    return task
  return as_recorded(task, recorded)


def _role(architecture: str) -> str | None:
  family = families.for_hf_class(architecture)
  return family.role_of(architecture) if family else None


def same_head(converted: str, ours: str) -> bool:
  """Whether a converted head of the transformers class `converted` is the head a task of class `ours` trains: the
  same class, or the same role outside sequence classification (a task names the default family's class for a
  span, token or choice head, which every family's backbone takes as it is; sequence classifiers differ)."""
  return converted == ours or _role(converted) == _role(ours) != families.SEQUENCE_CLASSIFICATION


def converted_head_fits(task, recorded: dict) -> bool:
  """A converted transformers head (`HFHead.identity()`) names a class, not a task: it fits a task of that class
  whose classes it names in the same order (HF's default LABEL_i names say nothing: the shapes decide) and that
  picks one class per row, or several (multi-label), as the head was trained to."""
  head, ours = HFHead.from_identity(recorded), task.hf_head
  return (head is not None and ours is not None and same_head(head.architecture, ours.architecture)
          and head.labels in (None, ours.labels)
          and (head.problem_type == MULTI_LABEL) == (ours.problem_type == MULTI_LABEL))


def describe(identity: dict) -> str:
  return ", ".join(f"{k}={'|'.join(v) if isinstance(v, list) else v}" for k, v in identity.items() if v)


def check_identity(task, recorded: dict | None, where: str) -> None:
  """Refuses weights whose head was trained for another task, class or class order, naming both and the fix."""
  now = task.identity()
  if recorded is None or recorded == now or converted_head_fits(task, recorded):
    return
  raise InputError(f"{where} holds a head trained for {describe(recorded)}, not for this run's {describe(now)}; "
                   f"its outputs would be read wrongly. To use it, {_identity_fix(task, recorded)}.")


def _identity_fix(task, recorded: dict) -> str:
  now, converted = task.identity(), HFHead.from_identity(recorded)
  labels = "|".join(recorded.get("labels") or ())
  if converted is None:
    if all(recorded.get(k) == v for k, v in now.items() if k != "labels") and labels:
      return (f"pass labels={labels} (--config.data.labels) as at training" if now["labels"]
              else "run with the training run's settings (its config.json)")
    return "run with the experiment config it was trained with (config.json there), or use another --workdir"
  if task.hf_head is None or not same_head(converted.architecture, task.hf_head.architecture):
    return (f"use it with a task whose model is an {converted.architecture}, or fine-tune from it "
            "(--config.init_checkpoint: a head for other classes starts afresh)")
  if (converted.problem_type == MULTI_LABEL) != (task.hf_head.problem_type == MULTI_LABEL):
    return "fine-tune from it (--config.init_checkpoint: its head, of another problem_type, then starts afresh)"
  if task.settings.labels:
    return f"pass labels={labels} (--config.data.labels), the order of its transformers config.json (id2label)"
  return ("as this task's class order is fixed, fine-tune from it (--config.init_checkpoint: its head then starts "
          f"afresh) or use it with your own data's task (experiments/classification.py) and labels={labels}")


def head_trained_for(task, recorded: dict | None) -> bool:
  """Whether weights recorded as `recorded` hold a head for the task's classes in the task's order: a converted
  head that fits, or a fine-tuning run's head with the same labels, of any task (MNLI's head predicts AX)."""
  if recorded is None or HFHead.from_identity(recorded) is None:
    return not (recorded and recorded.get("labels")) or recorded["labels"] == task.identity()["labels"]
  return converted_head_fits(task, recorded)


def check_head_trained_for(task, recorded: dict | None, where: str) -> None:
  """Refuses (as `check_identity`) weights whose head is not `head_trained_for` the task: prediction with a head
  of another task is fine when it has the task's classes in the task's order (AX with the MNLI model)."""
  if not head_trained_for(task, recorded):
    check_identity(task, recorded, where)


# --- the model, beyond its shapes ----------------------------------------------------------------------------
# Fields that change the function without changing any weight shape, so the shape check of the warm start misses
# them: the head count (the xlarge v2 TF-Hub weights have 32, the `xlarge` size 16), shared-layer repetitions, etc.
SHAPELESS_FIELDS = ("num_attention_heads", "num_hidden_layers", "hidden_act", "layer_norm_eps", "position_offset")


def check_same_model(saved: Mapping[str, Any] | None, model: Mapping[str, Any], who: str) -> None:
  """Refuses weights (named in the message as `who`: `flag=value`) whose recorded model `saved` differs from `model` (the config.model they are about
  to be loaded into) in a field that fixes their parameter tree (`run.config.SHAPE_FIELDS`: sizes, vocabulary,
  sharing, layer groups, the embedding projection) or what no weight shape shows (`SHAPELESS_FIELDS`): loaded,
  their layers would be dropped, reused or misfit, or compute another function. Each field is named with the
  weights' value, which is the fix."""
  fields = [k for k in dict.fromkeys(SHAPE_FIELDS + SHAPELESS_FIELDS) if saved and k in saved]
  diffs = {k: (_meaning(saved, k), _meaning(model, k)) for k in fields if _differs(saved, model, k)}
  if diffs:
    raise InputError(f"{who} was saved with " + ", ".join(
        f"model.{k}={a!r} but this run has {b!r}" for k, (a, b) in diffs.items()) + "; loaded into this run's "
        "model, the weights would lose, reuse or misfit layers, or compute a different function. Pass " +
        " ".join(f"--config.model.{k}={a}" for k, (a, _) in diffs.items()) + ".")


def _meaning(model: Mapping[str, Any], field: str) -> Any:
  """What `field` of `model` builds: an embedding_projection left at None is one where E != H (`ModelConfig`)."""
  if field == "embedding_projection" and model.get(field) is None:
    return model.get("embedding_size") != model.get("hidden_size")
  return model.get(field)


def _differs(saved: Mapping[str, Any], model: Mapping[str, Any], field: str) -> bool:
  """Whether `field` builds another model; an embedding_projection left at None in both follows E and H, which
  are compared themselves."""
  if field == "embedding_projection" and saved[field] is None and model.get(field) is None:
    return False
  return _meaning(saved, field) != _meaning(model, field)
