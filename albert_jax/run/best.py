"""A fine-tuning run's best record (`best/best.json`, kept by `best_keeper.BestKeeper`) and the head identity
recorded with weights (the record's, else `head.json` of a run or of a converted directory); `head_identity`
judges what these say."""
from __future__ import annotations

import json

from albert_jax import storage
from albert_jax.errors import InputError
from albert_jax.run.layout import Run

# The fields of a best record that the readers use, and their types (`best_keeper.BestKeeper` writes them).
BEST_FIELDS = {"step": int, "metric": str, "value": (int, float), "weights": str}


def read_best(run: Run) -> dict | None:
  """The run's best record (None without one), refused in one line unless it is the JSON object that fine-tuning
  writes (not a file cut short or edited into another shape). Its `weights` are this run's best/step_N, whatever
  path the run had when it wrote the record (a workdir copied or moved since)."""
  path = storage.path(run.best_record)
  if not path.exists():
    return None
  try:
    best = json.loads(path.read_text())
  except ValueError:  # not JSON (nor UTF-8)
    best = None
  if not (isinstance(best, dict) and all(isinstance(best.get(k), t) for k, t in BEST_FIELDS.items())
          and isinstance(best.get("head", {}), dict)):
    raise InputError(f"{path} is not a best-checkpoint record (a JSON object with " + ", ".join(BEST_FIELDS) +
                     "); restore it from a copy, or remove it: eval and predict then use the latest checkpoint, "
                     "and training keeps a new best from its next evaluation.")
  return {**best, "weights": run.best_weights(best)}


def recorded_identity(run: Run, best: dict | None = None) -> dict | None:
  """The head identity recorded with the weights eval/predict use: the best record's, else the run's (or a
  converted directory's) `head.json` (None for runs older than the record, and for weights without a head)."""
  if best and "head" in best:
    return best["head"]
  path = storage.path(run.head)
  return json.loads(path.read_text()) if path.exists() else None
