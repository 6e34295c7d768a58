"""The kinds of job a config runs, one class each: `Pretraining` (config.task "pretrain"), `Electra` ("electra")
and `FineTuning` (a task name of `albert_jax.tasks`). A kind implements the modes of `albert_jax.main` as methods (`train`, `evaluate`,
`predict`, `embed`, `compile`, `describe`); a mode it does not override is refused in one line naming the modes it
has (`runner.run`). The kind is chosen once, from `config.task`, by `kind_for`; another kind registers its task with
`@register("name")`, usually subclassing `Pretraining` and overriding its job (`make_job`) and where its weights
keep the encoder (`backbone_params`).

This module imports no jax: each method imports its job module (jax, flax, orbax: seconds) when it runs, so `--help`
and flag parsing stay fast and nothing touches a device before `jax.distributed.initialize`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import ml_collections

from albert_jax.errors import InputError
from albert_jax.run import Run


@dataclasses.dataclass(frozen=True)
class RunArgs:
  """The command-line values that only some modes read."""
  input: str | None = None
  output: str | None = None
  topology: str | None = None
  num_slices: int = 1
  fit: bool = False
  pooling: str = "mean"
  split: str | None = None
  overrides: tuple[str, ...] | None = None  # the `a.b` of each --config.a.b given; None: a config built in Python


class JobKind:
  """One kind of job for one experiment config. The mode methods here are the ones no kind has until it overrides
  them; `runner.run` refuses such a mode before calling it."""
  label = "any"  # how a message names the kind's configs: "pretraining configs"

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config

  def train(self, run: Run, args: RunArgs) -> Any:
    self._lacks("train")

  def evaluate(self, run: Run, args: RunArgs) -> Any:
    self._lacks("eval")

  def predict(self, run: Run, args: RunArgs) -> Any:
    self._lacks("predict")

  def embed(self, run: Run, args: RunArgs) -> None:
    self._lacks("embed")

  def compile(self, run: Run | None, args: RunArgs) -> None:
    self._lacks("compile")

  def describe(self, run: Run | None = None, args: RunArgs | None = None) -> None:
    self._lacks("describe")

  def _lacks(self, mode_name: str) -> None:
    raise InputError(f"--mode={mode_name} does not apply to {self.label} configs.")

  def has(self, mode: Callable) -> bool:
    """Whether this kind implements the mode method `mode` (a method of JobKind)."""
    return getattr(type(self), mode.__name__) is not mode

  def eval_reads_only(self) -> bool:
    """Whether `--mode=eval` only reads the workdir (it writes no predictions there)."""
    return False

  def check_seeds_recipe(self) -> None:
    """Refuses a config that `albert_jax.seeds` cannot repeat: one keeping no best dev checkpoint to compare by."""
    raise InputError(f"--config is a {self.label} config; albert_jax.seeds repeats a fine-tuning recipe "
                     "(experiments/glue.py, squad_v1.py, race.py, classification.py, ...).")

  # What the jobs of a kind build, for modes that share them (embed, compile, describe).
  def model_config(self, config: ml_collections.ConfigDict):
    """The encoder's ModelConfig."""
    from albert_jax.model_config import model_config_from
    return model_config_from(config)

  def make_job(self, config: ml_collections.ConfigDict, run: Run | None = None):
    """The `engine.Job` that `--mode=train` runs for `config` (a variant of self.config: compile changes the remat
    policy and micro batch); `run` None: one that reads no data until its batches are asked for."""
    raise TypeError(f"{type(self).__name__} builds no engine.Job: a kind of job overrides make_job.")

  def embedding_job(self, config: ml_collections.ConfigDict, backbone):
    """The job `engine.setup` takes the mesh, batch split and shardings from when embedding with `backbone`."""
    return self.make_job(config)

  def backbone_params(self, params: dict, which: str) -> Any:
    """The encoder's parameters within a checkpoint's `params`, which `which` names in a message."""
    if "albert" not in params:
      raise InputError(f"The weights ({which}) have no backbone 'albert' (found {sorted(params)}).")
    return params["albert"]

  def bucket_lengths(self, config: ml_collections.ConfigDict) -> tuple[int, ...]:
    """The sequence lengths a train step is compiled for, longest last; () for a single length."""
    return ()


KINDS: dict[str, type[JobKind]] = {}


def register(task: str) -> Callable[[type[JobKind]], type[JobKind]]:
  """Class decorator: configs whose `task` is `task` run as this kind."""
  def add(kind: type[JobKind]) -> type[JobKind]:
    KINDS[task] = kind
    return kind
  return add


class EncoderJob(JobKind):
  """The modes every kind that trains the encoder shares: embedding with its weights' encoder, and compiling its
  train step for a TPU slice; both build what they need through the kind (`make_job`, `backbone_params`)."""

  def embed(self, run: Run, args: RunArgs) -> None:
    from albert_jax import embed
    embed.embed(self.config, run, args, self)

  def compile(self, run: Run | None, args: RunArgs) -> None:
    from albert_jax import tpu_compile
    tpu_compile.run(self.config, args, self)


@register("pretrain")
class Pretraining(EncoderJob):
  """MLM plus a sentence task over prepared (or synthetic) data: `albert_jax.pretrain`."""
  label = "pretraining"

  def train(self, run: Run, args: RunArgs | None = None) -> dict[str, float]:
    from albert_jax import pretrain
    return pretrain.train(self.config, run, args)

  def evaluate(self, run: Run, args: RunArgs | None = None) -> dict[str, float]:
    from albert_jax import pretrain
    return pretrain.evaluate_checkpoint(self.config, run, args)

  def describe(self, run: Run | None = None, args: RunArgs | None = None) -> None:
    from albert_jax import describe, pretrain
    model_config = self.model_config(self.config)
    model_config.check_seq_length(self.config.data.max_seq_length, self.config.data.max_predictions_per_seq)
    describe.print_description(model_config, self.config.data.max_seq_length,
                               pretrain.prediction_slots(self.config.data))

  def eval_reads_only(self) -> bool:
    return True

  def make_job(self, config: ml_collections.ConfigDict, run: Run | None = None):
    from albert_jax import pretrain
    return pretrain.make_job(config, run)


@register("electra")
class Electra(Pretraining):
  """ELECTRA's replaced-token detection over pretraining's data: a generator and a discriminator sharing the
  embeddings (`albert_jax.families.electra_pretraining`). Fine-tuning and embedding take the discriminator, kept
  as the backbone `albert`."""
  label = "ELECTRA pretraining"

  def train(self, run: Run, args: RunArgs | None = None) -> dict[str, float]:
    from albert_jax.families import electra_pretraining
    return electra_pretraining.train(self.config, run, args)

  def evaluate(self, run: Run, args: RunArgs | None = None) -> dict[str, float]:
    from albert_jax.families import electra_pretraining
    return electra_pretraining.evaluate_checkpoint(self.config, run, args)

  def describe(self, run: Run | None = None, args: RunArgs | None = None) -> None:
    from albert_jax.families import electra_pretraining
    electra_pretraining.describe_config(self.config)

  def make_job(self, config: ml_collections.ConfigDict, run: Run | None = None):
    from albert_jax.families import electra_pretraining
    return electra_pretraining.make_job(config, run)


class FineTuning(EncoderJob):
  """A task's head on the encoder (GLUE, SQuAD, RACE, your own data): `albert_jax.finetune`."""
  label = "fine-tuning"

  def train(self, run: Run, args: RunArgs | None = None) -> None:
    from albert_jax import finetune
    # train.num_train_steps=0: a prediction-only task (GLUE AX uses the MNLI model as it is)
    predicts = self.config.train.num_train_steps == 0
    (finetune.predict_test if predicts else finetune.train)(self.config, run, args)

  def evaluate(self, run: Run, args: RunArgs | None = None) -> None:
    from albert_jax import finetune
    finetune.evaluate(self.config, run, args)

  def predict(self, run: Run, args: RunArgs) -> None:
    from albert_jax import finetune
    finetune.predict(self.config, run, args)

  def describe(self, run: Run | None = None, args: RunArgs | None = None) -> None:
    """The task's model (the same encoder, the task's head): the counts of the parameters it trains."""
    import jax
    from albert_jax import describe
    from albert_jax.tasks import get_task
    from albert_jax.weights import record
    init = self.config.get("init_checkpoint")
    config = record.with_classifier_head(self.config, record.read(init) if init else None)
    model_config = self.model_config(config)
    task = get_task(config)
    model = task.build_model(model_config)
    if said := task.describe_head(model):
      print(said)
    params = jax.eval_shape(lambda rng: task.init_params(model, rng), jax.random.key(0))
    describe.print_description(model_config, config.data.max_seq_length, None, params)

  def check_seeds_recipe(self) -> None:
    config = self.config
    if config.train.num_train_steps == 0 or not config.train.eval_every:
      raise InputError(f"train.num_train_steps={config.train.num_train_steps}, train.eval_every="
                       f"{config.train.eval_every}: this run keeps no best dev checkpoint to compare seeds by; "
                       "train (num_train_steps > 0) and score dev (eval_every > 0).")

  def make_job(self, config: ml_collections.ConfigDict, run: Run | None = None):
    from albert_jax import finetune
    from albert_jax.tasks import get_task
    task = get_task(config)
    return finetune.make_job(task, task.build_model(self.model_config(config)))

  def embedding_job(self, config: ml_collections.ConfigDict, backbone):
    """The task's job around the backbone alone: its head plays no part in embedding, and building it could need
    the class set of a train file that embedding does not read."""
    from albert_jax import finetune
    from albert_jax.model import init_params
    from albert_jax.tasks import get_task
    job = finetune.make_job(get_task(config), backbone)
    return dataclasses.replace(job, init_params=lambda rng: init_params(backbone, rng))

  def bucket_lengths(self, config: ml_collections.ConfigDict) -> tuple[int, ...]:
    from albert_jax import feature_batches
    from albert_jax.tasks import get_task
    return feature_batches.length_buckets(config, get_task(config))


def kind_for(config: ml_collections.ConfigDict) -> JobKind:
  """The kind of job `config` runs: the one registered for its task, else fine-tuning of the task it names."""
  return KINDS.get(config.task, FineTuning)(config)
