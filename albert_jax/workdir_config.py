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
# Beyond config.model: the ELECTRA generator's widths are a fraction of the discriminator's.
OTHER_SHAPE_FIELDS = ("electra.generator_fraction",)


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


def check_workdir_config(workdir: str, config: ml_collections.ConfigDict) -> tuple[str, str] | None:
  """Before a run writes into `workdir`: refuses a different model shape, and settings changed in ways that break
  an exact resume; says legitimate changes and returns (where the previous resolved config is to be kept:
  `config.<step>.json`, or `config.<step>.<n>.json` after earlier resumes at that step, its text), None without a
  change. Every process must decide alike (opening the checkpoints is a barrier), so nothing is written here: the
  kept and the new config.json are written by `write_workdir_config`, once the run is past every refusal."""
  path = storage.path(Run(workdir).config)
  latest = latest_step(workdir) if path.exists() else None
  if latest is not None:
    text = path.read_text()
    saved = json.loads(text)
    model = saved.get("model", {})   # without the fields of a later albert_jax, whose defaults keep the shapes
    diffs = {f"model.{k}": (model[k], config.model.get(k)) for k in SHAPE_FIELDS
             if k in model and model[k] != config.model.get(k)}
    before, now = _flat(saved), _flat(json.loads(config.to_json_best_effort()))
    diffs.update({k: (before[k], now[k]) for k in OTHER_SHAPE_FIELDS
                  if k in before and k in now and before[k] != now[k]})
    if diffs:
      listed = ", ".join(f"{k}: saved {a!r} vs now {b!r}" for k, (a, b) in diffs.items())
      raise InputError(f"Workdir {workdir} holds checkpoints of a different model ({listed}). Use a new --workdir, "
                       "or the saved config (config.json there) to resume.")
    changed = {k: (before.get(k), now.get(k)) for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)}
    if changed:
      listed = ", ".join(f"{k}: {a!r} -> {b!r}" if k in before else f"{k}: {b!r} (new field)" for k, (a, b) in
                         changed.items())   # a field of a later albert_jax: no saved value to restore, not refused
      breaking = [k for k in changed if k.startswith(EXACT_RESUME_FIELDS) and k in before and k in now]
      if breaking and not config.get("resume_with_changes", False):
        raise InputError(f"Resuming {workdir} at step {latest} with changed {', '.join(breaking)} would not continue "
                         f"the same run (data order, dropout or step size change). Restore the saved values "
                         f"(config.json there), use a new --workdir, or pass --config.resume_with_changes=True.")
      kept = _kept_config(workdir, latest, text)
      if jax.process_index() == 0:
        print(f"Resuming at step {latest} with changed settings: {listed} (the previous config is kept as "
              f"{os.path.basename(kept)}).", flush=True)
      return kept, text
  return None


def _kept_config(workdir: str, step: int, text: str) -> str:
  """Where to keep `text`, the config.json a resume with changes replaces: the first free one of
  `config.<step>.json`, `config.<step>.1.json`, ..., since writing over an earlier one would lose its settings
  (unless one of them holds `text` already)."""
  for n in itertools.count():
    kept = Run(workdir).config_history(step, n)
    if not storage.path(kept).exists() or storage.path(kept).read_text() == text:
      return kept


def latest_step(workdir: str) -> int | None:
  """The step of the workdir's newest checkpoint, None without one (opening the checkpoints is a barrier of all
  processes; a workdir without checkpoints/ is left without it)."""
  directory = checkpointing.checkpoint_dir(workdir)
  return checkpointing.Checkpointer(directory, 1, 1).latest_step() if storage.path(directory).is_dir() else None


def keep_replaced_config(replaced: tuple[str, str] | None) -> None:
  """Writes the config a resume with changes replaces where `check_workdir_config` said it is kept."""
  if replaced and jax.process_index() == 0 and not storage.path(replaced[0]).exists():
    storage.write_atomic(replaced[0], replaced[1])


def write_workdir_config(workdir: str, config: ml_collections.ConfigDict, made_of: dict | None = None,
                         replaced: tuple[str, str] | None = None) -> None:
  """config.json, after keeping the one it replaces (`replaced`: what `check_workdir_config` returned)."""
  keep_replaced_config(replaced)
  if jax.process_index() == 0:
    storage.write_atomic(Run(workdir).config, config.to_json_best_effort(indent=2))
    provenance.record(workdir, made_of or {})  # what it is made from (`provenance`), with the config
