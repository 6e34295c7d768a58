"""`resolve`: whatever names the weights a run reads (a run's folder, its best/step_N, a `convert` output, a
Hugging Face folder or Hub name, a TF1 checkpoint converted by `convert --from=tf1`) turned, once, into one
`Weights` value: the config the run takes from them, their family, the head they hold, their tokenizer and where
they came from. The params are loaded when first asked for: a caller that needs only the rest loads nothing.
`resolve_ours` reads our weights with the config they record, for the writers of other formats (`convert --to`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Collection

import ml_collections

from albert_jax import families, head_identity, storage
from albert_jax.errors import InputError
from albert_jax.formats import registry, weight_files
from albert_jax.model_config import ModelConfig
from albert_jax.run import Run, as_run, config as run_config, run_of_best, run_of_weights
from albert_jax.run.best import read_best, recorded_identity
from albert_jax.tasks import get_task
from albert_jax.weights import loading, record, store

INIT_CHECKPOINT, REVISION = "init_checkpoint", "init_checkpoint_revision"


@dataclasses.dataclass(frozen=True)
class Weights:
  """Weights named by the flag `flag` (init_checkpoint, --workdir, --src), read from `path` (the conversion of
  another format's weights, else the value given). `config`: the run's config with what the weights fix (config.model among
  it) taken from their record (`resolve`), or the config they record (`resolve_ours`). `head`: the identity of the
  head they were fine-tuned with (`run.best.recorded_identity`), None for a backbone. `tokenizer`: (model file,
  do_lower_case or None) they were trained with, None where none is recorded. `best`: the best record of the
  fine-tuning run whose folder `path` is (its params are that record's best/step_N), else None. `run`: the training
  run they come from (`path` itself or WORKDIR of WORKDIR/best/step_N), None for converted weights. `given`: the
  value the flag gave where `path` is its conversion (a Hugging Face folder or Hub name, a TF1 checkpoint), which
  messages name; "" otherwise."""
  path: str
  flag: str
  config: ml_collections.ConfigDict
  family: families.Family
  head: dict | None
  tokenizer: tuple[str, bool | None] | None
  best: dict | None = None
  run: Run | None = None
  given: str = ""

  @property
  def named(self) -> str:
    """How messages name them: the flag and the value it was given ('init_checkpoint=bert-base-uncased', not the
    conversion they are read from)."""
    return f"{self.flag}={self.given or self.path}"

  @property
  def folder(self) -> str:
    """Where the params are kept: a fine-tuning run's best dev checkpoint, else `path`."""
    return self.best["weights"] if self.best else self.path

  @property
  def model(self) -> ModelConfig:
    return ModelConfig.from_mapping(self.config.model.to_dict())

  @functools.cached_property
  def params(self) -> Any:
    """The params as host arrays (`loading.load_init_params`), loaded on first use, checked against config.model."""
    return loading.load_init_params(self.path, self.flag, model=self.config.model, given=self.given)

  @functools.cached_property
  def stored_params(self) -> Any:
    """Every param kept at `folder`, as saved (an ELECTRA pretraining run's generator too): what an export writes."""
    return loading.load_params(self.folder, self.flag)

  @functools.cached_property
  def trained_task(self):
    """The task of the fine-tuning run whose best dev checkpoint these weights are (given as the run's folder or as
    its best/step_N), with the class order the run recorded (`head_identity.as_recorded`); None for other weights
    and for a run whose config names no task."""
    run = run_of_best(storage.absolute(self.folder))
    config = run_config.read(run, self.flag) if run and run_config.exists(run) else {}
    if "task" not in config:
      return None
    return head_identity.as_recorded(get_task(ml_collections.ConfigDict(config)),
                                     recorded_identity(run, read_best(run)))


def resolve(source: str, config: ml_collections.ConfigDict, overrides: Collection[str] | None = None,
            flag: str = INIT_CHECKPOINT) -> Weights:
  """The weights that `source` names, for a run of `config`. `overrides`: the `a.b` names of the command line's
  `--config.a.b` values (the entry computes them), which stay as given; the model fields and the tokenizer the
  weights fix are taken from their record for the rest, said in one line (`record.take_recorded`). None: a config
  built in Python, used as it is but for its classifier head "auto" (`record.with_classifier_head`). Weights of
  another format (a Hugging Face folder or Hub name, at config.init_checkpoint_revision for init_checkpoint; a TF1
  checkpoint) are read through their conversion (`formats.registry.converted`), which init_checkpoint then names
  in the config, as the run's config.json records it. A missing source is refused in one line, as is a damaged
  record."""
  path, config = _through_conversion(source, config, flag)
  if not storage.path(path).exists():
    raise loading.not_weights(path, flag)
  recorded = record.read(path)
  config = record.with_classifier_head(config, recorded)
  if overrides is not None:
    config, said = record.take_recorded(config, recorded, overrides)
    if said:
      record.say(said)
  return _weights(recorded, flag, config, "" if path == source else source)


def _through_conversion(source: str, config: ml_collections.ConfigDict, flag: str
                        ) -> tuple[str, ml_collections.ConfigDict]:
  """(where the weights `source` names are read: the conversion of another format's weights, else `source`;
  `config` with init_checkpoint naming that conversion when `flag` is init_checkpoint)."""
  revision = config.get(REVISION, "") if flag == INIT_CHECKPOINT else ""
  path = registry.converted(source, revision, flag) or source
  if path != source and flag == INIT_CHECKPOINT:
    config = config.copy_and_resolve_references()
    config.init_checkpoint = path
    if REVISION in config:
      config[REVISION] = ""  # part of the conversion's path now
  return path, config


def resolve_init_checkpoint(config: ml_collections.ConfigDict, overrides: Collection[str] | None = None
                            ) -> Weights | None:
  """The weights config.init_checkpoint names (`resolve`), None when it names none; a folder that holds no weights
  and a revision of nothing are refused in one line."""
  value, revision = config.get(INIT_CHECKPOINT, ""), config.get(REVISION, "")
  if revision and not value:
    raise InputError(f"{REVISION}={revision} pins a revision of nothing: set --config.{INIT_CHECKPOINT}=NAME (a "
                     "Hugging Face Hub model) too, or drop it.")
  if not value:
    return None
  weights = resolve(value, config, overrides)
  if weights.path == value:  # not another format's conversion: refused when it holds none of ours either
    weight_files.check_holds_weights(value, INIT_CHECKPOINT)
  return weights


def resolve_ours(source: str, flag: str = "--src") -> Weights:
  """Our weights at `source` (a converted folder, a training run, a fine-tuning run's best/step_N) with the config
  they record (`record.recorded_config`): what a writer of another format reads. Any other folder is refused in
  one line."""
  if not (store.is_pretrained_dir(source) or as_run(source).has_weights()):
    raise loading.not_weights(source, flag)
  weights = _weights(record.read(source), flag, ml_collections.ConfigDict())
  return dataclasses.replace(weights, config=ml_collections.ConfigDict(record.recorded_config(weights.folder, flag)))


def _weights(recorded: record.Recorded, flag: str, config: ml_collections.ConfigDict, given: str = "") -> Weights:
  own = as_run(recorded.path)
  best = read_best(own)
  return Weights(recorded.path, flag, config, recorded.family, recorded_identity(own, best), recorded.tokenizer, best,
                 run_of_weights(recorded.path), given)
