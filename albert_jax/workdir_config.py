"""A workdir's config.json across resumes: a resume is refused on a different model shape or on settings changed in
ways that break an exact resume, legitimate changes are said and the replaced config kept; the config is written
with what the run is made from."""
from __future__ import annotations

import itertools
import json
import os

import jax
import ml_collections

from albert_jax import checkpointing, provenance, storage
from albert_jax.errors import InputError
from albert_jax.run import Run

# Fields that fix the shapes of the parameters: a workdir's saved run must agree on them to resume.
SHAPE_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "num_hidden_groups", "inner_group_num", "max_position_embeddings",
                "type_vocab_size", "sharing", "embedding_projection")


# Settings whose change breaks an exact resume (data order, dropout, the function the weights compute, what a step
# means): refused unless `resume_with_changes` is set. Every other change (schedule length, logging, checkpoints,
# mesh, micro batch) is legitimate: said on the console and recorded.
EXACT_RESUME_FIELDS = ("seed", "train.global_batch_size", "train.optimizer", "data.", "model.hidden_act",
                       "model.layer_norm_eps", "model.hidden_dropout_prob", "model.attention_probs_dropout_prob")


def _flat(tree: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def check_workdir_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Before a run writes into `workdir`: refuses a different model shape, and settings changed in ways that break
  an exact resume; says and records legitimate changes (the previous resolved config is kept as
  `config.<step>.json`, or `config.<step>.<n>.json` after earlier resumes at that step). Every process must decide
  alike (opening the checkpoints is a barrier), so the new config.json is written later, by
  `write_workdir_config`, once all of them are past this check."""
  path = storage.path(Run(workdir).config)
  latest = latest_step(workdir) if path.exists() else None
  if latest is not None:
    text = path.read_text()
    saved = json.loads(text)
    model = saved.get("model", {})   # without the fields of a later albert_jax, whose defaults keep the shapes
    diffs = {k: (model[k], config.model.get(k)) for k in SHAPE_FIELDS if k in model and model[k] != config.model.get(k)}
    if diffs:
      listed = ", ".join(f"model.{k}: saved {a!r} vs now {b!r}" for k, (a, b) in diffs.items())
      raise InputError(f"Workdir {workdir} holds checkpoints of a different model ({listed}). Use a new --workdir, "
                       "or the saved config (config.json there) to resume.")
    before, now = _flat(saved), _flat(json.loads(config.to_json_best_effort()))
    changed = {k: (before.get(k), now.get(k)) for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)}
    if changed:
      listed = ", ".join(f"{k}: {a!r} -> {b!r}" if k in before else f"{k}: {b!r} (new field)" for k, (a, b) in
                         changed.items())   # a field of a later albert_jax: no saved value to restore, not refused
      breaking = [k for k in changed if k.startswith(EXACT_RESUME_FIELDS) and k in before and k in now]
      if breaking and not config.get("resume_with_changes", False):
        raise InputError(f"Resuming {workdir} at step {latest} with changed {', '.join(breaking)} would not continue "
                         f"the same run (data order, dropout or step size change). Restore the saved values "
                         f"(config.json there), use a new --workdir, or pass --config.resume_with_changes=True.")
      if jax.process_index() == 0:
        print(f"Resuming at step {latest} with changed settings: {listed} (the previous config is kept as "
              f"{_keep_config(workdir, latest, text)}).", flush=True)


def _keep_config(workdir: str, step: int, text: str) -> str:
  """The name of the file that keeps `text`, the config.json a resume with changes replaces: the first free one of
  `config.<step>.json`, `config.<step>.1.json`, ..., since writing over an earlier one would lose its settings
  (unless one of them holds `text` already)."""
  for n in itertools.count():
    kept = storage.path(Run(workdir).config_history(step, n))
    if not kept.exists():
      storage.write_atomic(os.fspath(kept), text)
      return kept.name
    if kept.read_text() == text:
      return kept.name


def latest_step(workdir: str) -> int | None:
  """The step of the workdir's newest checkpoint, None without one (opening the checkpoints is a barrier of all
  processes; a workdir without checkpoints/ is left without it)."""
  directory = checkpointing.checkpoint_dir(workdir)
  return checkpointing.Checkpointer(directory, 1, 1).latest_step() if storage.path(directory).is_dir() else None


def write_workdir_config(workdir: str, config: ml_collections.ConfigDict, made_of: dict | None = None) -> None:
  if jax.process_index() == 0:
    storage.write_atomic(Run(workdir).config, config.to_json_best_effort(indent=2))
    provenance.record(workdir, made_of or {})  # what it is made from (`provenance`), with the config
