"""Every mode of `albert_jax.main`, in one table: what it does and which function runs it for a pretraining
or a fine-tuning config. Functions are named as "module:function" and imported only when run, so `--help` and
flag parsing stay fast and nothing touches a device before `jax.distributed.initialize`."""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any


@dataclasses.dataclass(frozen=True)
class Mode:
  help: str
  pretrain: str | None           # "module:function" taking (config, workdir, RunArgs); None = not for pretraining
  finetune: str | None           # the same for fine-tuning configs (GLUE, SQuAD, RACE)
  needs_workdir: bool = True
  reads_run: bool = False        # scores or uses a training run's weights: the workdir must exist


MODES: dict[str, Mode] = {
    "train": Mode("train, resuming from the workdir's latest checkpoint; fine-tuning keeps the best dev "
                  "checkpoint in workdir/best and predicts the test split with it",
                  "albert_jax.pretrain:train", "albert_jax.finetune:train"),
    "eval": Mode("score the workdir's weights: held-out MLM/sentence metrics (pretraining), dev splits with "
                 "predictions (fine-tuning); prints one JSON line",
                 "albert_jax.pretrain:evaluate_checkpoint", "albert_jax.finetune:evaluate", reads_run=True),
    "predict": Mode("fine-tuned weights on your own file: --input=FILE --output=PATH; or on a split of the task: "
                    "--split=NAME (test, dev, test_mismatched, ax, ...) [--output=PATH]",
                    None, "albert_jax.finetune:predict", reads_run=True),
    "embed": Mode("one vector per line of a text file, from the backbone of the workdir's weights (else "
                  "init_checkpoint): --input=FILE --output=OUT.npy [--pooling=mean|pooled]",
                  "albert_jax.embed:embed", "albert_jax.embed:embed"),
    "compile": Mode("compile the exact train step for a TPU slice on this host (no TPU needed): memory per "
                    "device, headroom, collectives; --topology=v3-256 [--num_slices=2] [--fit]; exit 3 if it does "
                    "not fit", "albert_jax.tpu_compile:run", "albert_jax.tpu_compile:run", needs_workdir=False),
    "describe": Mode("parameter counts and FLOPs per token of the config's model; no devices, no workdir",
                     "albert_jax.describe:describe_config", "albert_jax.describe:describe_config",
                     needs_workdir=False),
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


def resolve(mode_name: str, config) -> Any:
  """The function that runs `mode_name` for this config, or a ValueError naming the modes that apply."""
  mode = MODES[mode_name]
  kind = "pretrain" if config.task == "pretrain" else "finetune"
  target = getattr(mode, kind)
  if target is None:
    usable = ", ".join(name for name, m in MODES.items() if getattr(m, kind))
    raise ValueError(f"--mode={mode_name} does not apply to {'pretraining' if kind == 'pretrain' else 'fine-tuning'}"
                     f" configs; use one of: {usable}.")
  module, function = target.split(":")
  return getattr(importlib.import_module(module), function)


def run(config, workdir: str | None, mode_name: str, args: RunArgs = RunArgs()) -> None:
  resolve(mode_name, config)(config, workdir, args)
