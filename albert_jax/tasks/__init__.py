"""Fine-tuning tasks: `get_task(config)` returns the object the training engine drives (see `base.Task`)."""
from __future__ import annotations

from albert_jax.errors import InputError
from albert_jax.model_config import ModelConfig
from albert_jax.tasks.base import Split, Task, TaskSettings, make_tokenizer, model_inputs
from albert_jax.tasks.classification import ClassificationTask, MultiLabelClassificationTask
from albert_jax.tasks.glue import GlueTask
from albert_jax.tasks.multiple_choice import MultipleChoiceTask
from albert_jax.tasks.race import RaceTask
from albert_jax.tasks.squad import SquadTask
from albert_jax.tasks.token_classification import TokenClassificationTask

TASKS: dict[str, type[Task]] = {"glue": GlueTask, "squad_v1": SquadTask, "squad_v2": SquadTask, "race": RaceTask,
                                "classification": ClassificationTask,
                                "multi_label_classification": MultiLabelClassificationTask,
                                "token_classification": TokenClassificationTask,
                                "multiple_choice": MultipleChoiceTask}


def get_task(config) -> Task:
  """The task of an experiment config (checked against its model's position table), or of `TaskSettings`."""
  settings = config if isinstance(config, TaskSettings) else TaskSettings.from_config(config)
  if settings.task not in TASKS:
    raise InputError(f"Unknown fine-tuning task {settings.task!r}; choose one of {sorted(TASKS)} "
                     "(GLUE's sub-task goes in config.task_name).")
  task = TASKS[settings.task](settings)
  if not isinstance(config, TaskSettings) and "model" in config:
    task.check_seq_length(ModelConfig.from_mapping(config.model))
  return task

__all__ = ["Split", "Task", "TASKS", "TaskSettings", "get_task", "make_tokenizer", "model_inputs"]
