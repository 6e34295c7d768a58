"""The ids a run's trackers resume by, kept in the run's folder."""
from __future__ import annotations

import hashlib
import secrets

from albert_jax import storage
from albert_jax.run.layout import Run


def wandb_run_id(run: Run) -> str:
  """The W&B run id of `run`, made at its first start and kept in its folder (WANDB_ID_FILE): every later start
  continues that W&B run, and a new run in a path used before (a deleted workdir, the same local path on another
  machine) starts its own. A run that logged before ids were kept (a metrics.jsonl, no id file) keeps the one it
  had, a hash of the workdir's path."""
  path = storage.path(run.wandb_id)
  if path.exists():
    return path.read_text().strip()
  if storage.path(run.metrics).exists():
    run_id = hashlib.sha256(storage.absolute(run.workdir).encode()).hexdigest()[:16]
  else:
    run_id = secrets.token_hex(8)
  storage.write_atomic(run.wandb_id, run_id)
  return run_id
