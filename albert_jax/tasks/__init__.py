"""Fine-tuning tasks: `get_task(config)` returns the object the training engine drives (see `base.Task`)."""
from __future__ import annotations

from albert_jax.tasks.base import Split, Task, make_tokenizer, model_inputs
from albert_jax.tasks.glue import GlueTask
from albert_jax.tasks.race import RaceTask
from albert_jax.tasks.squad import SquadTask

TASKS: dict[str, type[Task]] = {"glue": GlueTask, "squad_v1": SquadTask, "squad_v2": SquadTask, "race": RaceTask}


def get_task(config) -> Task:
  if config.task not in TASKS:
    raise ValueError(f"Unknown fine-tuning task {config.task!r}; choose one of {sorted(TASKS)} "
                     "(GLUE's sub-task goes in config.task_name).")
  return TASKS[config.task](config)


__all__ = ["Split", "Task", "TASKS", "get_task", "make_tokenizer", "model_inputs"]
