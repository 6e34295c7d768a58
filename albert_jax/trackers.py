"""Where a run's metrics and config go: one class per tracker behind `Tracker`'s three methods, so another tracker
is one more class. `metrics.MetricWriter` opens those the config asks for (`open_trackers`) and fans out to them.

`metrics.jsonl` and TensorBoard write into a local folder (the workdir, or its `storage.Mirror` for a `gs://`
workdir); Weights & Biases (`log.wandb_project`) writes where wandb writes (`$WANDB_DIR`, else the current
directory) and uploads by itself, or later with `wandb sync` under `WANDB_MODE=offline`.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import sys
from typing import Callable, Protocol

import ml_collections
from flax import traverse_util

from albert_jax import storage
from albert_jax.errors import EnvironmentUserError, InputError
from albert_jax.run import Run
from albert_jax.run.tracker_ids import wandb_run_id


class Tracker(Protocol):
  """What a tracker does; the classes below have these methods without deriving from it."""

  def hparams(self, config: ml_collections.ConfigDict) -> None:
    """Records the resolved config; called at every start of the run, resumes included."""

  def write(self, step: int, record: dict[str, float]) -> None:
    """One log step: metric name (`loss`, `eval/mlm_accuracy`, `dev/f1`) -> value."""

  def close(self) -> None:
    """Ends the run's output; inside an exception handler, the run failed."""


def tag(name: str) -> str:
  """A metric's name in TensorBoard and W&B: training metrics under `train/`, `eval/` and `dev/` ones as they are."""
  return name if "/" in name else f"train/{name}"


def hparam_values(config: ml_collections.ConfigDict) -> dict[str, bool | int | float | str]:
  """The config as `section.field` -> a value TensorBoard's hparams take: tuples and None as their `str`."""
  flat = traverse_util.flatten_dict(config.to_dict(), sep=".")
  return {key: value if isinstance(value, (bool, int, float, str)) else str(value) for key, value in flat.items()}


class JsonlTracker:
  """`metrics.jsonl`: one JSON object per log step, appended (a resume continues the file). The config is the
  workdir's config.json."""

  def __init__(self, files: Run):
    self._file = open(files.metrics, "a", buffering=1)

  def hparams(self, config: ml_collections.ConfigDict) -> None:
    del config

  def write(self, step: int, record: dict[str, float]) -> None:
    self._file.write(json.dumps({"step": step, **record}) + "\n")

  def close(self) -> None:
    self._file.close()


def _tensorboardx():
  """tensorboardX, imported where a run writes event files (not at start-up) and, unless something imported torch
  already, without it: tensorboardX imports an installed torch (4 s) only to accept torch tensors, and the trackers
  pass floats."""
  if "tensorboardX" not in sys.modules and "torch" not in sys.modules:
    sys.modules["torch"] = None  # `import torch` raises ImportError while this entry stands
    try:
      importlib.import_module("tensorboardX")
    finally:
      del sys.modules["torch"]
  return importlib.import_module("tensorboardX")


class TensorBoardTracker:
  """Event files in `tensorboard/`: finite values as scalars, the config as the hparams plugin's session start.
  Only the session start is written, no experiment summary: TensorBoard then takes the table's columns from every
  run's sessions and scalars, so runs of different tasks compare under one logdir (an experiment summary would let
  the first one found fix the columns)."""

  def __init__(self, files: Run):
    self._writer = _tensorboardx().SummaryWriter(files.tensorboard)

  def hparams(self, config: ml_collections.ConfigDict) -> None:
    _, session_start, _ = _tensorboardx().summary.hparams(hparam_values(config), {})
    self._writer.file_writer.add_summary(session_start)
    self._writer.flush()

  def write(self, step: int, record: dict[str, float]) -> None:
    for name, value in record.items():
      if math.isfinite(value):
        self._writer.add_scalar(tag(name), value, step)
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()



class WandbTracker:
  """A Weights & Biases run of `log.wandb_project`, resumed by its id (`wandb_run_id`), metrics logged at their
  step; a resume logs the config again (`allow_val_change`: `resume_with_changes` may have changed it)."""

  def __init__(self, run: Run, log: ml_collections.ConfigDict):
    import wandb
    try:
      self._run = wandb.init(
          project=log.wandb_project, entity=log.wandb_entity or None, id=wandb_run_id(run), resume="allow",
          name=log.wandb_run_name or os.path.basename(storage.absolute(run.workdir).rstrip("/")),
          tags=_tags(log))
    except wandb.Error as e:
      raise EnvironmentUserError(f"Weights & Biases could not start the run of log.wandb_project="
                                 f"{log.wandb_project}: {e} (WANDB_MODE=offline logs without an account; `wandb "
                                 "sync` uploads later).") from None

  def hparams(self, config: ml_collections.ConfigDict) -> None:
    self._run.config.update(json.loads(config.to_json_best_effort()), allow_val_change=True)

  def write(self, step: int, record: dict[str, float]) -> None:
    self._run.log({tag(name): value for name, value in record.items()}, step=step)

  def close(self) -> None:
    self._run.finish(exit_code=1 if sys.exc_info()[0] else 0)


def _tags(log: ml_collections.ConfigDict) -> list[str]:
  return [t.strip() for t in log.wandb_tags.split(",") if t.strip()]


def check_trackers(log: ml_collections.ConfigDict) -> None:
  """At start-up, before anything is written: a W&B project needs the wandb package, tags and a WANDB_MODE that
  wandb accepts, checked by wandb's own settings (on every process, so that all of them stop alike). A config
  read back from an older run's config.json may have no W&B fields."""
  if not log.get("wandb_project"):
    return
  try:
    wandb = importlib.import_module("wandb")
  except ImportError:
    raise EnvironmentUserError(f"log.wandb_project={log.wandb_project} logs to Weights & Biases, whose package is "
                               'not installed: pip install -e ".[wandb]" (or leave log.wandb_project empty).') from None
  _check_wandb_setting(lambda: wandb.Settings(run_tags=tuple(_tags(log))), lambda _: "log.wandb_tags", InputError)
  _check_wandb_setting(lambda: wandb.Settings().update_from_env_vars(dict(os.environ)),
                       lambda field: f"WANDB_{field.upper()}={os.environ.get(f'WANDB_{field.upper()}', '')}",
                       EnvironmentUserError)


def _check_wandb_setting(settings: Callable[[], object], name: Callable[[str], str], error: type[Exception]) -> None:
  """`settings()` (wandb's pydantic validation), its first complaint raised as `error` in one line naming
  `name(field)`."""
  try:
    settings()
  except ValueError as e:  # pydantic's ValidationError
    first = e.errors()[0] if hasattr(e, "errors") else {"loc": ("",), "msg": str(e)}
    problem = first["msg"].removeprefix("Value error, ")
    raise error(f"{name(str(first['loc'][0]))}: Weights & Biases refuses it: {problem}.") from None


def open_trackers(files: Run, run: Run, log: ml_collections.ConfigDict) -> list[Tracker]:
  """The trackers of `run`: `metrics.jsonl` and TensorBoard in `files` (the run's folder, or its local mirror;
  never through a symlink there), W&B where `log.wandb_project` says."""
  files.check_no_symlinks()
  wandb_run = [WandbTracker(run, log)] if log.get("wandb_project") else []  # first: refused, it leaves no file open
  return [JsonlTracker(files), TensorBoardTracker(files), *wandb_run]
