"""Every mode of `albert_jax.main`, in one table: what it does and which method of the config's job kind
(`job_kinds`) runs it. A mode applies to the kinds that implement its method."""
from __future__ import annotations

import dataclasses
from typing import Callable

from albert_jax.errors import InputError
from albert_jax.job_kinds import JobKind, RunArgs, kind_for
from albert_jax.run import Run


@dataclasses.dataclass(frozen=True)
class Mode:
  help: str
  method: Callable          # the JobKind method that runs the mode, given (Run or None, RunArgs)
  needs_workdir: bool = True
  reads_run: bool = False   # scores or uses a training run's weights: the workdir must exist


MODES: dict[str, Mode] = {
    "train": Mode("train, resuming from the workdir's latest checkpoint; fine-tuning keeps the best dev "
                  "checkpoint in workdir/best and predicts the test split with it", JobKind.train),
    "eval": Mode("score the workdir's weights: held-out MLM/sentence metrics (pretraining), dev splits with "
                 "predictions (fine-tuning); prints one JSON line", JobKind.evaluate, reads_run=True),
    "predict": Mode("fine-tuned weights on your own file: --input=FILE --output=PATH; or on a split of the task: "
                    "--split=NAME (test, dev, test_mismatched, ax, ...) [--output=PATH]",
                    JobKind.predict, reads_run=True),
    "embed": Mode("one vector per line of a text file, from the backbone of the workdir's weights (else "
                  "init_checkpoint): --input=FILE --output=OUT.npy [--pooling=mean|pooled]", JobKind.embed),
    "compile": Mode("compile the exact train step for a TPU slice on this host (no TPU needed): memory per "
                    "device, headroom, collectives; --topology=v3-256 [--num_slices=2] [--fit]; exit 3 if it does "
                    "not fit", JobKind.compile, needs_workdir=False),
    "describe": Mode("parameter counts and FLOPs per token of the config's model; no devices, no workdir",
                     JobKind.describe, needs_workdir=False),
}


def modes_help() -> str:
  return "\n".join(f"  {name:<9} {mode.help}" for name, mode in MODES.items())


def check_applies(mode_name: str, kind: JobKind) -> None:
  """Refuses a mode that the config's kind does not implement, naming the modes it does."""
  if not kind.has(MODES[mode_name].method):
    usable = ", ".join(name for name, mode in MODES.items() if kind.has(mode.method))
    raise InputError(f"--mode={mode_name} does not apply to {kind.label} configs; use one of: {usable}.")


def run_mode(kind: JobKind, run: Run | None, mode_name: str, args: RunArgs = RunArgs()):
  """Runs `mode_name` for `run` with the kind's method, refused where the kind has none."""
  check_applies(mode_name, kind)
  return getattr(kind, MODES[mode_name].method.__name__)(run, args)


def run(config, run: Run | None, mode_name: str, args: RunArgs = RunArgs()):
  """Runs `mode_name` for `config` and `run`, as `albert_jax.main` does once its checks passed."""
  return run_mode(kind_for(config), run, mode_name, args)
