"""A run's resolved config (`config.json`) across resumes, and the run's config as an experiment file.

Across resumes: a resume is refused on a different model shape or on settings changed in ways that break an exact
resume; legitimate changes are said and the replaced config kept as `config.<step>[.<n>].json`; the config is
written with what the run is made from (`provenance`). jax and the checkpoints are imported where a resume is
checked, so that the command line reads a run's config without them.

As an experiment file: `--config=albert_jax/run/config.py:WORKDIR`. `main` passes it when `--config` is left out,
so eval, predict, embed and a resume run with the settings the run was trained with, and `--config.<field>`
overrides still go through ml_collections (typed, misspelt fields named). JSON drops two things that a
ConfigDict's overrides and the resume checks rely on, restored here: tuples (saved as lists; every sequence of an
experiment config is a tuple) and the type of a `bool | None` model field left at None
(`experiments/common.model_config` makes it a bool placeholder). The config read back writes the same JSON again,
so a resume sees no change that was not asked for.
"""
from __future__ import annotations

import itertools
import json
import os

import ml_collections

from albert_jax import storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.model_config import optional_field_types
from albert_jax.run import provenance
from albert_jax.run.layout import Run

PASS_CONFIG = ("pass --config=FILE, the experiment file the run was trained with (and its --config.<field> "
               "overrides)")

# Fields that fix the shapes of the parameters: a workdir's saved run must agree on them to resume.
SHAPE_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "num_hidden_groups", "inner_group_num", "max_position_embeddings",
                "type_vocab_size", "sharing", "embedding_projection")
# Beyond config.model: the ELECTRA generator's widths are a fraction of the discriminator's.
OTHER_SHAPE_FIELDS = ("electra.generator_fraction",)

# Settings whose change breaks an exact resume (data order, dropout, the function the weights compute, what a step
# means): refused unless `resume_with_changes` is set. Every other change (schedule length, logging, checkpoints,
# mesh, micro batch) is legitimate: said on the console and recorded.
EXACT_RESUME_FIELDS = ("seed", "train.global_batch_size", "train.optimizer", "train.adam_bias_correction", "data.",
                       "model.hidden_act", "model.layer_norm_eps", "model.position_offset", "model.hidden_dropout_prob",
                       "model.attention_probs_dropout_prob")


def exists(run: Run) -> bool:
  return storage.path(run.config).is_file()


def read(run: Run, name: str = "--workdir", fix: str = PASS_CONFIG) -> dict:
  """The resolved config of `run` as saved, refused in one line naming `fix` when it is missing or is not a run's
  config (a file cut short or edited into another shape). `name`: the flag that gave the run's folder."""
  path = run.config
  if not exists(run):
    raise MissingFileError(f"{name}={run.workdir} holds no run config ({path} not found); {fix}.")
  try:
    saved = json.loads(storage.path(path).read_text())
  except ValueError:  # not JSON (nor UTF-8)
    saved = None
  if not (isinstance(saved, dict) and isinstance(saved.get("task"), str) and isinstance(saved.get("model"), dict)):
    raise InputError(f"{path} is not a run's config (a JSON object with task and model); {fix}, or restore it from "
                     "a copy or from a config.<step>.json kept there.")
  return saved


def _tuples(value):
  if isinstance(value, dict):
    return {key: _tuples(item) for key, item in value.items()}
  if isinstance(value, list):
    return tuple(_tuples(item) for item in value)
  return value


def _typed_model_nones(model: dict) -> dict:
  """`model` with each None whose ModelConfig field is `X | None` as a placeholder of X, so that
  `--config.model.<field>=value` parses as it does on the experiment file's config."""
  kinds = optional_field_types()
  return {name: ml_collections.config_dict.placeholder(kinds[name]) if value is None and name in kinds else value
          for name, value in model.items()}


def from_saved(saved: dict) -> ml_collections.ConfigDict:
  """The ConfigDict that `saved` (a config.json's object) was written from."""
  values = _tuples(saved)
  return ml_collections.ConfigDict({**values, "model": _typed_model_nones(values["model"])})


def get_config(workdir: str) -> ml_collections.ConfigDict:
  """The experiment file's entry: `workdir` is the text after its ':'."""
  return from_saved(read(Run(workdir)))


def _flat(tree: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def check_resume(run: Run, config: ml_collections.ConfigDict) -> tuple[str, str] | None:
  """Before a run writes into its folder: refuses a different model shape, and settings changed in ways that break
  an exact resume; says legitimate changes and returns (where the previous resolved config is to be kept:
  `config.<step>.json`, or `config.<step>.<n>.json` after earlier resumes at that step, its text), None without a
  change. Every process must decide alike (opening the checkpoints is a barrier), so nothing is written here: the
  kept and the new config.json are written by `write`, once the run is past every refusal."""
  import jax
  workdir, path = run.workdir, storage.path(run.config)
  latest = latest_step(run) if path.exists() else None
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
      kept = _kept_config(run, latest, text)
      if jax.process_index() == 0:
        print(f"Resuming at step {latest} with changed settings: {listed} (the previous config is kept as "
              f"{os.path.basename(kept)}).", flush=True)
      return kept, text
  return None


def _kept_config(run: Run, step: int, text: str) -> str:
  """Where to keep `text`, the config.json a resume with changes replaces: the first free one of
  `config.<step>.json`, `config.<step>.1.json`, ..., since writing over an earlier one would lose its settings
  (unless one of them holds `text` already)."""
  for n in itertools.count():
    kept = run.config_history(step, n)
    if not storage.path(kept).exists() or storage.path(kept).read_text() == text:
      return kept


def latest_step(run: Run) -> int | None:
  """The step of the run's newest checkpoint, None without one (opening the checkpoints is a barrier of all
  processes; a run without checkpoints/ is left without it)."""
  from albert_jax import checkpointing
  if not storage.path(run.checkpoints).is_dir():
    return None
  return checkpointing.Checkpointer(run.checkpoints, 1, 1).latest_step()


def keep_replaced(replaced: tuple[str, str] | None) -> None:
  """Writes the config a resume with changes replaces where `check_resume` said it is kept."""
  import jax
  if replaced and jax.process_index() == 0 and not storage.path(replaced[0]).exists():
    storage.write_atomic(replaced[0], replaced[1])


def write(run: Run, config: ml_collections.ConfigDict, made_of: dict | None = None,
          replaced: tuple[str, str] | None = None) -> None:
  """The resolved config and what the run is made from (`provenance`), by process 0, after keeping the config it
  replaces (`replaced`: what `check_resume` returned)."""
  import jax
  keep_replaced(replaced)
  if jax.process_index() == 0:
    storage.write_atomic(run.config, config.to_json_best_effort(indent=2))
    provenance.record(run, made_of or {})
