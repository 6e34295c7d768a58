"""Standalone scorer: `python -m albert_jax.evaluate --task=TASK --data=GOLD --predictions=FILE`.

TASK is a GLUE task (cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, rte, wnli), squad_v1, squad_v2 or race. GOLD is
the labelled file (GLUE dev TSV, SQuAD JSON) or folder (RACE split with middle/ and high/); FILE is what
`write_predictions` wrote (SQuAD v2: its `.null_odds.json` sibling is read too). The metrics are printed as one
JSON object on the last line.
"""
from __future__ import annotations

import argparse
import json

from albert_jax import storage
from albert_jax.errors import InputError, MissingFileError, one_line_user_errors
from albert_jax.tasks import TaskSettings, get_task
from albert_jax.tasks.glue import SPECS

SCORED_GLUE = tuple(name for name, spec in SPECS.items() if spec.columns is not None)  # AX has no public labels


def task_settings(task: str, null_threshold: float = 0.0) -> TaskSettings:
  if task in SCORED_GLUE:
    return TaskSettings(task="glue", task_name=task)
  if task in ("squad_v1", "squad_v2", "race"):
    return TaskSettings(task=task, null_score_diff_threshold=null_threshold)
  raise InputError(f"Unknown task {task!r}; choose a GLUE task ({', '.join(SCORED_GLUE)}), squad_v1, squad_v2 or "
                   "race.")


def check_paths(task: str, data: str, predictions: str) -> None:
  """Both paths exist and are what the task reads (RACE's gold is a folder, every other input a file)."""
  for flag, path, folder in (("--data", data, task.lower() == "race"), ("--predictions", predictions, False)):
    found = storage.path(path)
    if not found.exists():
      raise MissingFileError(f"{flag}={path} does not exist.")
    if found.is_dir() != folder:
      wanted = "a RACE split folder (with middle/ and high/)" if folder else "a file"
      raise InputError(f"{flag}={path} is a {'folder' if found.is_dir() else 'file'}; pass {wanted}.")


def evaluate(task_name: str, gold_path: str, predictions_path: str, null_threshold: float = 0.0) -> dict:
  settings = task_settings(task_name.lower(), null_threshold)
  check_paths(task_name, gold_path, predictions_path)
  task = get_task(settings)
  gold = task.gold_split(gold_path)
  return task.score(gold, task.read_predictions(predictions_path, gold))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--task", required=True)
  parser.add_argument("--data", required=True, help="gold file (GLUE TSV, SQuAD JSON) or RACE split folder")
  parser.add_argument("--predictions", required=True)
  parser.add_argument("--null_threshold", type=float, default=0.0,
                      help="SQuAD v2: predict no answer when null odds exceed this")
  args = parser.parse_args(argv)
  with one_line_user_errors("evaluate: error: "):
    print(json.dumps(evaluate(args.task, args.data, args.predictions, args.null_threshold)), flush=True)


if __name__ == "__main__":
  main()
