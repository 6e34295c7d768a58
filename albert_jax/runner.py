"""Every mode of `albert_jax.main`, in one table: what it does and which function runs it for a pretraining
or a fine-tuning config. The table names the job functions (`jobs.finetune.train`) through `JobFunction`, which
imports the job's module at the first call only: `--help` and flag parsing stay fast (the job modules import
jax, flax and orbax: seconds), and nothing touches a device before `jax.distributed.initialize`."""
from __future__ import annotations

import dataclasses
import importlib
import types
from typing import Any, Callable

from albert_jax.errors import InputError
from albert_jax.model_config import is_electra, is_pretraining


@dataclasses.dataclass(frozen=True)
class JobFunction:
  """`module.function`, called as the function itself; the module is imported at the first call (`load`)."""
  module: str
  function: str

  def load(self) -> Callable[..., Any]:
    return getattr(importlib.import_module(self.module), self.function)

  def __call__(self, *args, **kwargs) -> Any:
    return self.load()(*args, **kwargs)


class _JobModule:
  """A job module by name, whose attributes are its functions as `JobFunction`s (nothing imported)."""

  def __init__(self, module: str):
    self._module = module

  def __getattr__(self, function: str) -> JobFunction:
    if function.startswith("__"):
      raise AttributeError(function)
    return JobFunction(self._module, function)


# The job modules the table names functions of: `jobs.finetune.train` is albert_jax.finetune.train.
jobs = types.SimpleNamespace(**{name: _JobModule(f"albert_jax.{name}")
                                for name in ("pretrain", "finetune", "embed", "tpu_compile", "describe", "electra")})


@dataclasses.dataclass(frozen=True)
class Mode:
  help: str
  pretrain: JobFunction | None   # runs the mode for a pretraining config, given (config, workdir, RunArgs); None = n/a
  finetune: JobFunction | None   # the same for fine-tuning configs (GLUE, SQuAD, RACE, your own data)
  needs_workdir: bool = True
  reads_run: bool = False        # scores or uses a training run's weights: the workdir must exist


MODES: dict[str, Mode] = {
    "train": Mode("train, resuming from the workdir's latest checkpoint; fine-tuning keeps the best dev "
                  "checkpoint in workdir/best and predicts the test split with it",
                  jobs.pretrain.train, jobs.finetune.train),
    "eval": Mode("score the workdir's weights: held-out MLM/sentence metrics (pretraining), dev splits with "
                 "predictions (fine-tuning); prints one JSON line",
                 jobs.pretrain.evaluate_checkpoint, jobs.finetune.evaluate, reads_run=True),
    "predict": Mode("fine-tuned weights on your own file: --input=FILE --output=PATH; or on a split of the task: "
                    "--split=NAME (test, dev, test_mismatched, ax, ...) [--output=PATH]",
                    None, jobs.finetune.predict, reads_run=True),
    "embed": Mode("one vector per line of a text file, from the backbone of the workdir's weights (else "
                  "init_checkpoint): --input=FILE --output=OUT.npy [--pooling=mean|pooled]",
                  jobs.embed.embed, jobs.embed.embed),
    "compile": Mode("compile the exact train step for a TPU slice on this host (no TPU needed): memory per "
                    "device, headroom, collectives; --topology=v3-256 [--num_slices=2] [--fit]; exit 3 if it does "
                    "not fit", jobs.tpu_compile.run, jobs.tpu_compile.run, needs_workdir=False),
    "describe": Mode("parameter counts and FLOPs per token of the config's model; no devices, no workdir",
                     jobs.describe.describe_config, jobs.describe.describe_config,
                     needs_workdir=False),
}


# ELECTRA's replaced-token detection (config.task="electra"): the modes that apply to it, run by albert_jax.electra
# where the objective matters and by the shared functions elsewhere.
ELECTRA_MODES: dict[str, JobFunction] = {
    "train": jobs.electra.train, "eval": jobs.electra.evaluate_checkpoint, "embed": jobs.embed.embed,
    "compile": jobs.tpu_compile.run, "describe": jobs.electra.describe_config,
}


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


def modes_help() -> str:
  return "\n".join(f"  {name:<9} {mode.help}" for name, mode in MODES.items())


def resolve(mode_name: str, config) -> JobFunction:
  """The function that runs `mode_name` for this config, or an InputError naming the modes that apply."""
  if is_electra(config):
    if mode_name not in ELECTRA_MODES:
      raise InputError(f"--mode={mode_name} does not apply to ELECTRA pretraining configs; use one of: "
                       f"{', '.join(ELECTRA_MODES)}.")
    return ELECTRA_MODES[mode_name]
  mode = MODES[mode_name]
  kind = "pretrain" if is_pretraining(config) else "finetune"
  function = getattr(mode, kind)
  if function is None:
    usable = ", ".join(name for name, m in MODES.items() if getattr(m, kind))
    raise InputError(f"--mode={mode_name} does not apply to {'pretraining' if kind == 'pretrain' else 'fine-tuning'}"
                     f" configs; use one of: {usable}.")
  return function


def run(config, workdir: str | None, mode_name: str, args: RunArgs = RunArgs()) -> None:
  resolve(mode_name, config)(config, workdir, args)
