"""A run's folder (its workdir): every file and folder a training run keeps there, named here and only here, and
the rule for which weights a run has.

    config.json, config.<step>[.<n>].json   the resolved config, and the ones a resume replaced
    provenance.json                         the fingerprints of what the run is made from (`provenance`)
    checkpoints/                            orbax steps of the train state (the latest is the run's weights)
    best/best.json, best/step_<N>/          fine-tuning: the best dev checkpoint and its record
    head.json                               fine-tuning: what the head was trained for (`Task.identity()`)
    run.lock                                held by the process that trains
    metrics.jsonl, tensorboard/             the trackers' files; wandb_run_id.txt: the W&B run's id
    compilation_cache/, profile/            XLA's persistent cache; the profiler's traces
    <split predictions>                     eval's dev predictions, predict's benchmark files (named by the task)
    seeds.json, seed_<k>/                   `albert_jax.seeds`: the report, and seed k's own run
    lr_<r>/                                 `albert_jax.seeds --learning_rates`: rate r's seeds folder (as above)
    tiny_data/                              data.kind=tiny: the bundled corpus built for the run

An output of a tool (predict, embed, seeds, glue_submission) that falls on one of these, in the run it names or in
any run it lands in, is refused before anything is written (`check_output`); convert refuses any --dst inside a
training workdir.
"""
from __future__ import annotations

import dataclasses
import os
import re

from albert_jax import storage
from albert_jax.errors import InputError
from data_pipeline.writers import LOCK_FILE  # the one-writer lock the tools share, held by the training process

CONFIG_FILE = "config.json"
CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"
BEST_FILE = "best.json"
HEAD_FILE = "head.json"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb_run_id.txt"
COMPILATION_CACHE_DIR = "compilation_cache"
PROFILE_DIR = "profile"
PROVENANCE_FILE = "provenance.json"
SEEDS_FILE = "seeds.json"
TINY_DATA_DIR = "tiny_data"

# What replacing each would break: the weights, or the rest of the run.
WEIGHT_FOLDERS = (CHECKPOINTS_DIR, BEST_DIR)
OWN_FOLDERS = (*WEIGHT_FOLDERS, TENSORBOARD_DIR, COMPILATION_CACHE_DIR, PROFILE_DIR, TINY_DATA_DIR)
OWN_FILES = (CONFIG_FILE, HEAD_FILE, LOCK_FILE, METRICS_FILE, WANDB_ID_FILE, PROVENANCE_FILE, SEEDS_FILE)
OWN_FOLDER_PATTERN = re.compile(r"seed_\d+|lr_[0-9.e+-]+")
OWN_FILE_PATTERN = re.compile(r"config\.\d+(\.\d+)?\.json")
# What the trackers write into by name: a symlink there would be written through, into whatever it points at.
WRITTEN_BY_NAME = (METRICS_FILE, TENSORBOARD_DIR)
# A folder holding one of these is a run (or a seeds folder), whichever tool made its path.
MARKS = (CONFIG_FILE, CHECKPOINTS_DIR, BEST_DIR, METRICS_FILE, SEEDS_FILE)


@dataclasses.dataclass(frozen=True)
class Run:
  """A training run, the value passed from the entry to the modes, the loop and the tools: the layout of its folder
  `workdir` (a local path or a gs:// URL). Nothing is read or made here; the run's records are the modules beside
  this one."""
  workdir: str

  def file(self, name: str) -> str:
    return os.path.join(self.workdir, name)

  @property
  def config(self) -> str:
    return self.file(CONFIG_FILE)

  def config_history(self, step: int, n: int) -> str:
    """Where the config a resume at `step` replaced is kept (the n-th at that step)."""
    return self.file(f"config.{step}.json" if n == 0 else f"config.{step}.{n}.json")

  @property
  def checkpoints(self) -> str:
    return self.file(CHECKPOINTS_DIR)

  @property
  def best(self) -> str:
    return self.file(BEST_DIR)

  @property
  def best_record(self) -> str:
    return os.path.join(self.best, BEST_FILE)

  def best_step(self, step: int) -> str:
    """Where the weights of the dev score at `step` are kept while they are the best."""
    return os.path.join(self.best, f"step_{step}")

  def best_weights(self, record: dict) -> str:
    """The best record's weights, best/step_N, by name: the recorded path is absolute only if the workdir was."""
    return os.path.join(self.best, os.path.basename(os.path.normpath(record["weights"])))

  @property
  def provenance(self) -> str:
    return self.file(PROVENANCE_FILE)

  @property
  def head(self) -> str:
    return self.file(HEAD_FILE)

  @property
  def lock(self) -> str:
    return self.file(LOCK_FILE)

  @property
  def metrics(self) -> str:
    return self.file(METRICS_FILE)

  @property
  def tensorboard(self) -> str:
    return self.file(TENSORBOARD_DIR)

  @property
  def wandb_id(self) -> str:
    return self.file(WANDB_ID_FILE)

  @property
  def compilation_cache(self) -> str:
    return self.file(COMPILATION_CACHE_DIR)

  @property
  def profile(self) -> str:
    return self.file(PROFILE_DIR)

  @property
  def tiny_data(self) -> str:
    return self.file(TINY_DATA_DIR)

  def predictions(self, name: str) -> str:
    """A split's predictions file, `name` as the task gives it (`Task.predictions_name`, `submission_name`)."""
    return self.file(name)

  @property
  def seeds_report(self) -> str:
    return self.file(SEEDS_FILE)

  def written_in(self, folder: str) -> Run:
    """This layout in `folder`: the local mirror (`storage.Mirror`) that a gs:// run's trackers write into."""
    return Run(folder)

  def seed(self, seed: int) -> Run:
    """Seed `seed`'s own run in a seeds folder."""
    return Run(self.file(f"seed_{seed}"))

  def learning_rate(self, rate: float) -> Run:
    """Learning rate `rate`'s own seeds folder in a learning-rate grid's folder."""
    return Run(self.file(f"lr_{rate:g}"))

  def check_no_symlinks(self) -> None:
    """Refuses a symlink where the run writes a file or folder by name (`WRITTEN_BY_NAME`): another run's
    metrics.jsonl or a shared tensorboard/ linked in would be appended to, not the run's own."""
    for name in WRITTEN_BY_NAME:
      path = self.file(name)
      if not storage.is_remote(path) and os.path.islink(path):
        raise InputError(f"{path} is a symlink (to {os.readlink(path)}); the run writes its own {name} there, "
                         "not through a link: remove the link and rerun.")

  def has_weights(self) -> bool:
    """Whether the run saved weights: a best dev checkpoint, or a checkpoints folder."""
    return storage.path(self.best_record).is_file() or storage.path(self.checkpoints).is_dir()

  def weights(self, init_checkpoint: str) -> tuple[str, str]:
    """(where the weights a mode uses are, the flag that named it): the run's own (its best dev checkpoint, else
    its latest: the loader of the workdir chooses), else `init_checkpoint` (a converted or pretraining run used as
    it is); refused in one line when neither has any."""
    if self.has_weights():
      return self.workdir, "--workdir"
    if init_checkpoint:
      return init_checkpoint, "init_checkpoint"
    raise InputError(f"No weights in {self.workdir}: it has no checkpoints and config.init_checkpoint is empty; "
                     "pass --workdir of a training run or --config.init_checkpoint=DIR (an albert_jax.convert output).")

  def own_entry(self, path: str) -> str | None:
    """The entry of this run (a name of the layout above) that `path` is or lies in, else None."""
    root = _resolved(self.workdir).rstrip("/")
    target = _resolved(path)
    if not target.startswith(root + "/"):
      return None
    entry = target[len(root) + 1:].split("/", 1)[0]
    return entry if _is_folder(entry) or entry in OWN_FILES or OWN_FILE_PATTERN.fullmatch(entry) else None


def _is_folder(entry: str) -> bool:
  return entry in OWN_FOLDERS or bool(OWN_FOLDER_PATTERN.fullmatch(entry))


def _resolved(path: str) -> str:
  """A path as the file system finds it (symlinks followed); a URL normalised."""
  return storage.absolute(path) if storage.is_remote(path) else os.path.realpath(path)


def is_run(directory: str) -> bool:
  """Whether `directory` holds a run's (or a seeds folder's) files."""
  return any(storage.path(os.path.join(directory, mark)).exists() for mark in MARKS)


def as_run(path: str) -> Run:
  """`path` read with a run's layout: weights readers (init_checkpoint, convert's --src) ask a folder that may be a
  training run, or a converted directory keeping head.json as a run does, for a run's files."""
  return Run(path)


def run_of_best(path: str) -> Run | None:
  """The run whose best dev checkpoint `path` is (WORKDIR of WORKDIR/best/step_N), by name; None for any other."""
  path = path.rstrip("/")
  return Run(os.path.dirname(os.path.dirname(path))) if os.path.basename(os.path.dirname(path)) == BEST_DIR else None


def run_of_weights(path: str, mark: str = CONFIG_FILE) -> Run | None:
  """The training run that the weights at `path` come from, known by its file `mark`: `path` itself, or WORKDIR of
  WORKDIR/best/step_N; None for other weights (a converted directory, a run that recorded no `mark`)."""
  for run in (Run(path.rstrip("/")), run_of_best(path)):
    if run is not None and storage.path(run.file(mark)).is_file():
      return run
  return None


def check_output(flag: str, output: str, run: Run | None = None) -> None:
  """Refuses an output path that is or lies in a file or folder of a run: of `run` (the run a mode reads, even
  before it exists) or of any folder above `output` that holds a run. Nothing is written before this check."""
  runs = [run] if run else []
  parent = os.path.dirname(_resolved(output).rstrip("/"))
  while parent and parent not in ("/", "gs:", "gs:/") and not parent.endswith("//"):
    if is_run(parent):
      runs.append(Run(parent))
    parent = os.path.dirname(parent)
  for run in runs:
    entry = run.own_entry(output)
    if entry is None:
      continue
    where = os.path.join(_resolved(run.workdir), entry)
    if not _is_folder(entry) and _resolved(output).rstrip("/") == where:
      raise InputError(f"{flag}={output} would replace the run's own {entry} ({where}); write it to another path.")
    what = "the weights" if entry in WEIGHT_FOLDERS else "the run's own files"
    relation = "is" if _resolved(output).rstrip("/") == where else "is inside"
    raise InputError(f"{flag}={output} {relation} the run's {entry}{'/' * _is_folder(entry)} ({where}); write it "
                     f"outside {what}.")
