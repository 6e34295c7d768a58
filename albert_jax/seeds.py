"""Several seeds of one fine-tuning recipe, as the paper reports GLUE (the median of 5 runs):
`python -m albert_jax.seeds --config FILE[:args] [--config.<field>=...] --workdir=DIR --seeds=5 [--first_seed=0]
[--rerun_collapsed=N] [--learning_rates=1e-5,2e-5,3e-5]`.

Seed k trains the ordinary workdir DIR/seed_<k> with `config.seed=k`, from which the head's initialisation, the
data order and dropout all derive; the runs go one after another in this process, sharing one compilation cache
(DIR/compilation_cache unless `compilation_cache_dir` is set), so the step compiled for the first seed serves the
others. Rerunning the command skips the seeds DIR/seeds.json records as finished and resumes an interrupted one
from its checkpoint. A run is collapsed when its best checkpoint's dev predictions are one class for every
example, or (regression) have a spread below `REGRESSION_SPREAD` of the gold scores' (fine-tuning small sets
collapses to one class on some seeds, google-research/albert#197); `--rerun_collapsed=N` trains such a seed
again as seed k + 1000, k + 2000, ... up to N times, the collapsed run kept in seeds.json as such.

With `--learning_rates`, rate r runs the seeds as above in DIR/lr_<r> (its own seeds.json) with
`train.learning_rate=r`, rate after rate; DIR/seeds.json then holds every rate's report, the rate whose counted
runs' median is best (`best_learning_rate`, the first listed of a tie), and at its top level that rate's report.
"""
from __future__ import annotations

import json
import math
import os
import signal
from typing import Any, Callable

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from albert_jax import cli, job_kinds, main, optim, runner, stop_signals, storage
from albert_jax.errors import InputError, one_line_user_errors
from albert_jax.head_identity import check_identity, task_for_weights
from albert_jax.run import Run, check_output, config as run_config
from albert_jax.run.best import read_best, recorded_identity
from albert_jax.run.layout import SEEDS_FILE as REPORT_FILE
from albert_jax.seeds_report import best_run, grid_report, grid_table, report, table
from albert_jax.tasks.classification import MultiLabelClassificationTask
from albert_jax.weights.resolve import resolve_init_checkpoint

FLAGS = flags.FLAGS
flags.DEFINE_integer("seeds", None, "How many seeds of the recipe to run (the paper's GLUE table: 5).")
flags.DEFINE_integer("first_seed", 0, "The first seed; the others follow it.")
flags.DEFINE_integer("rerun_collapsed", 0, "Train a collapsed seed k again as k + 1000, k + 2000, ... at most this "
                     "many times.")
flags.DEFINE_list("learning_rates", None, "Learning rates to run the seeds at, comma-separated (e.g. 1e-5,2e-5,3e-5), "
                  "rate r in WORKDIR/lr_<r>; the report chooses the one with the best median.")

RERUN_STRIDE = 1000        # a collapsed seed k is trained again as k + RERUN_STRIDE * attempt
REGRESSION_SPREAD = 1e-3   # a regression whose predictions' std is below this fraction of the gold scores' collapsed
MAX_SEED = 2**32 - 1       # engine.check_training_config's bound


def check_recipe(config, seeds: int, first_seed: int, rerun_collapsed: int) -> None:
  """Refuses, before anything is trained, a config that keeps no best dev checkpoint and counts out of range."""
  job_kinds.kind_for(config).check_seeds_recipe()
  if seeds < 1 or first_seed < 0 or rerun_collapsed < 0:
    raise InputError(f"--seeds={seeds}, --first_seed={first_seed}, --rerun_collapsed={rerun_collapsed}: pass "
                     "--seeds of at least 1 and the other two of at least 0.")
  if rerun_collapsed and seeds > RERUN_STRIDE:
    raise InputError(f"--seeds={seeds} with --rerun_collapsed: a rerun seed k + {RERUN_STRIDE} would be one of the "
                     f"seeds; run at most {RERUN_STRIDE} seeds at a time.")
  highest = first_seed + seeds - 1 + RERUN_STRIDE * rerun_collapsed
  if highest > MAX_SEED:
    raise InputError(f"Seeds up to {highest} are asked for; config.seed goes up to {MAX_SEED:,}: lower "
                     "--first_seed, --seeds or --rerun_collapsed.")


def parse_learning_rates(values: list[str] | None) -> list[float] | None:
  """--learning_rates as floats (None when unset); refuses an empty list, a rate that is not a positive number and
  a rate listed twice (two spellings of one rate would share its folder)."""
  if values is None:
    return None
  if not values:
    raise InputError("--learning_rates is empty: list the rates to try, e.g. --learning_rates=1e-5,2e-5,3e-5, or "
                     "drop the flag to train at the config's train.learning_rate.")
  rates = []
  for value in values:
    try:
      rate = float(value)
    except ValueError:
      rate = math.nan
    if not (math.isfinite(rate) and rate > 0):
      raise InputError(f"--learning_rates: {value!r} is not a positive number; list rates such as 1e-5,2e-5,3e-5.")
    if optim.learning_rate_problem(rate):
      raise InputError(f"--learning_rates: {optim.learning_rate_problem(rate)}; list rates such as 1e-5,2e-5,3e-5.")
    if f"{rate:g}" in {f"{listed:g}" for listed in rates}:
      raise InputError(f"--learning_rates lists the rate {rate:g} twice; list each rate once.")
    rates.append(rate)
  return rates


def check_grid(folder: Run, learning_rates: list[float] | None) -> None:
  """Refuses learning rates other than those DIR/seeds.json records (none: the config's one rate): the folder's
  runs and report are that grid's."""
  recorded = _recorded_report(folder)
  if recorded is None or recorded.get("learning_rates") == learning_rates:
    return
  raise InputError(f"{folder.seeds_report} records {_grid_flag(recorded.get('learning_rates'))}, this command "
                   f"asks for {_grid_flag(learning_rates)}; a folder's grid does not change: run this one with another "
                   "--workdir.")


def _grid_flag(learning_rates: list[float] | None) -> str:
  if not learning_rates:
    return "no --learning_rates"
  return "--learning_rates=" + ",".join(f"{rate:g}" for rate in learning_rates)


# --- collapse ------------------------------------------------------------------------------------------------
def predicted_outputs(predictions) -> list | np.ndarray:
  """One output per predicted unit, whatever the task's predictions are: class indices (GLUE), probabilities per
  class or option (own data, multiple choice: the top one), scores (regression), {id: answer} (RACE, SQuAD), tags
  per word (token classification)."""
  if hasattr(predictions, "tags"):
    return [tag for sentence in predictions.tags for tag in sentence]
  if hasattr(predictions, "answers"):
    predictions = predictions.answers
  if isinstance(predictions, dict):
    return list(predictions.values())
  predictions = np.asarray(predictions)
  return predictions.argmax(-1) if predictions.ndim == 2 else predictions


def collapse(task, gold, predictions) -> str | None:
  """Why `predictions` of the gold split `gold` are collapsed, or None: one class (or answer, tag, option, set of
  classes of a multi-label task) for every unit; for a regression, a spread of the scores below REGRESSION_SPREAD
  of the gold scores'."""
  if isinstance(task, MultiLabelClassificationTask):  # each row's classes, as its predictions file names them
    outputs = ["|".join(task.chosen(row)) for row in np.asarray(predictions)]
  else:
    outputs = predicted_outputs(predictions)
  if isinstance(outputs, np.ndarray) and np.issubdtype(outputs.dtype, np.floating):
    spread, gold_spread = float(np.std(outputs)), float(np.std([example.label for example in gold.examples]))
    if spread <= REGRESSION_SPREAD * gold_spread:
      return f"constant: the dev scores' std is {spread:.3g} (the gold scores' {gold_spread:.3g})"
    return None
  distinct = {output.item() if isinstance(output, np.generic) else output for output in outputs}
  if len(distinct) != 1:
    return None
  (only,) = distinct
  labels = getattr(task, "labels", None)
  name = labels[only] if labels and isinstance(only, int) else only
  return f"one class: every dev prediction is {name!r}"


def dev_collapse(task, weights_dir: str) -> str | None:
  """`collapse` of the dev predictions written beside the best checkpoint in `weights_dir` (and chosen with what
  was tuned with it: a multi-label task's thresholds)."""
  gold = task.gold_split(task.split_path("dev"))
  task.use_tuning(weights_dir)
  return collapse(task, gold, task.read_predictions(os.path.join(weights_dir, task.predictions_name("dev")), gold))


# --- a run's record ------------------------------------------------------------------------------------------
def run_record(config, folder: Run, seed: int) -> dict[str, Any]:
  """Seed `seed`'s finished run: its best dev checkpoint (step, metric, every metric) and whether it collapsed."""
  from albert_jax.tasks import get_task
  seed_run = folder.seed(seed)
  run_dir, best = seed_run.workdir, read_best(seed_run)
  if best is None:
    raise InputError(f"{run_dir} holds no best dev checkpoint (best/best.json) after training; rerun the command "
                     f"to train seed {seed} again, or remove {run_dir}.")
  recorded = recorded_identity(seed_run, best)
  task = task_for_weights(get_task(config), recorded)
  check_identity(task, recorded, run_dir)  # a DIR reused for another task's seeds
  reason = dev_collapse(task, seed_run.best_weights(best))
  return {"seed": seed, "workdir": run_dir, "best_step": best["step"], "value": best["value"],
          "metrics": best.get("metrics", {}), "collapsed": reason is not None, "collapse": reason}


# --- the runs ------------------------------------------------------------------------------------------------
def finished_seeds(config, folder: Run) -> set[int]:
  """The seeds a previous command recorded in DIR/seeds.json (each written once its run had ended, test predictions
  included) whose checkpoint is still at the recipe's last step (not when train.num_train_steps was raised since)."""
  recorded = _recorded_seeds(folder)
  return {seed for seed in recorded
          if (run_config.latest_step(folder.seed(seed)) or 0) >= config.train.num_train_steps}


def _recorded_seeds(folder: Run) -> set[int]:
  recorded = _recorded_report(folder)
  return set() if recorded is None else {run["seed"] for run in recorded["runs"]}


def _recorded_report(folder: Run) -> dict[str, Any] | None:
  """DIR/seeds.json, None when there is none; refused in one line when it is not a report."""
  path = storage.path(folder.seeds_report)
  if not path.exists():
    return None
  try:
    recorded = json.loads(path.read_text())
    if all(isinstance(run["seed"], int) for run in recorded["runs"]):
      return recorded
  except (ValueError, KeyError, TypeError):
    pass
  raise InputError(f"{path} is not a seeds report (a JSON object whose `runs` list the finished seeds); remove "
                   "it: every seed is then checked again, finished ones in seconds.")


def train_seed(config, folder: Run, seed: int) -> None:
  """Trains (or resumes, or finds finished) seed `seed` in its own run, as `main --mode=train` would."""
  seed_config = config.copy_and_resolve_references()
  seed_config.seed = seed
  runner.run(seed_config, folder.seed(seed), "train")


def stop_if_signalled(folder: Run) -> None:
  """Starts no run after a SIGTERM or Ctrl-C (held for the whole command, `stop_signals.hold_for_the_process`):
  exits as `main` does after a stop, with its exit code."""
  signum = stop_signals.held_signal()
  if signum is None:
    return
  reason = "Interrupted" if signum == signal.SIGINT else "Preemption"
  say(f"{reason}: no further run starts; {folder.seeds_report} records the finished ones (rerun the same "
      "command to continue).")
  raise SystemExit(stop_signals.exit_code(signum))


def run_seeds(config, folder: Run, seeds: int, first_seed: int = 0, rerun_collapsed: int = 0,
              on_report: Callable[[dict], None] | None = None) -> dict[str, Any]:
  """Trains seeds first_seed ... first_seed + seeds - 1 of `config`, each collapsed one again up to
  `rerun_collapsed` times, one after another; writes DIR/seeds.json after each run (then hands it to `on_report`)
  and returns it."""
  check_recipe(config, seeds, first_seed, rerun_collapsed)
  done = finished_seeds(config, folder)
  slots, runs = list(range(first_seed, first_seed + seeds)), []
  for slot in slots:
    for attempt in range(rerun_collapsed + 1):
      seed = slot + RERUN_STRIDE * attempt
      if seed in done:
        say(f"seed {seed}: finished (recorded in {folder.seeds_report}), skipped")
      else:
        stop_if_signalled(folder)
        say(f"seed {seed}: training in {folder.seed(seed).workdir}")
        train_seed(config, folder, seed)
      run = {**run_record(config, folder, seed), "rerun_of": slot if attempt else None, "rerun_as": None,
             "counted": True}
      if runs and runs[-1]["rerun_as"] == seed:
        runs[-1]["counted"] = False
      last_try = not run["collapsed"] or attempt == rerun_collapsed
      run["rerun_as"] = None if last_try else seed + RERUN_STRIDE
      runs.append(run)
      result = report(config, slots, runs)
      if is_process_0():
        storage.write_atomic(folder.seeds_report, json.dumps(result, indent=2))
        if on_report:
          on_report(result)
      if last_try:
        break
  say(table(result))
  return result


def run_grid(config, folder: Run, learning_rates: list[float], seeds: int, first_seed: int = 0,
             rerun_collapsed: int = 0) -> dict[str, Any]:
  """`run_seeds` at each learning rate in turn, rate r in DIR/lr_<r>; writes the grid's report (`grid_report`) to
  DIR/seeds.json after each run and returns it."""
  reports = {}
  for rate in learning_rates:
    rate_config = config.copy_and_resolve_references()
    rate_config.train.learning_rate = rate
    rate_folder = folder.learning_rate(rate)
    stop_if_signalled(folder)
    say(f"learning rate {rate:g}: seeds in {rate_folder.workdir}")

    def write_grid_report(result: dict[str, Any], rate: float = rate) -> None:
      grid = grid_report(learning_rates, {**reports, rate: result})
      storage.write_atomic(folder.seeds_report, json.dumps(grid, indent=2))

    reports[rate] = run_seeds(rate_config, rate_folder, seeds, first_seed, rerun_collapsed, on_report=write_grid_report)
  result = grid_report(learning_rates, reports)
  say(f"{best_run(result)} at the best rate, {result['best_learning_rate']:g}")
  say(grid_table(result))
  return result


def is_process_0() -> bool:
  import jax
  return jax.process_index() == 0


def say(line: str) -> None:
  if is_process_0():
    print(line, flush=True)


# --- the command line ----------------------------------------------------------------------------------------
def check_command_line(argv: list[str]) -> None:
  """What albert_jax.main's train mode refuses, and what only this command needs: --seeds, and no seed or mode of
  the command's own choosing."""
  if FLAGS["mode"].present:
    raise InputError("--mode does nothing here: albert_jax.seeds trains; drop it (eval and predict each seed with "
                     "albert_jax.main --workdir=DIR/seed_<k>).")
  if not FLAGS.workdir:
    raise InputError("--workdir is required: seed k's run goes to WORKDIR/seed_<k>, the report to "
                     f"WORKDIR/{REPORT_FILE}.")
  if FLAGS.seeds is None:
    raise InputError("--seeds is required: how many seeds to run, e.g. --seeds=5 (the paper's GLUE median).")
  if "config.seed" in FLAGS and FLAGS["config.seed"].present:
    raise InputError("--config.seed is set by this command (seed k for DIR/seed_<k>); drop it and choose the "
                     "seeds with --first_seed and --seeds.")
  cli.check_command_line(argv, "train")
  check_output("--workdir", FLAGS.workdir)  # seed k's run goes in it: not inside another run's own files


def cli_main(argv: list[str]) -> None:
  from albert_jax import compilation_cache, console
  console.install()
  with one_line_user_errors():
    check_command_line(argv)
    config, workdir = FLAGS.config, FLAGS.workdir
    folder = Run(workdir)
    check_recipe(config, FLAGS.seeds, FLAGS.first_seed, FLAGS.rerun_collapsed)
    learning_rates = parse_learning_rates(FLAGS.learning_rates)
    # as albert_jax.main's fine-tuning takes them, once for every seed's copy of the config
    if weights := resolve_init_checkpoint(config, tuple(config_flags.get_override_values(FLAGS["config"]))):
      config = weights.config
    cli.check_workdir(workdir, "train")
    check_grid(folder, learning_rates)
    main.initialize_distributed()  # once for every seed: jax.distributed.initialize may run once per process
    compilation_cache.use(config, folder)  # one cache for every seed's run
    with console.runs_say_no_done_line():  # the summary, naming the best run's folder, ends the output
      if learning_rates is None:
        run_seeds(config, folder, FLAGS.seeds, FLAGS.first_seed, FLAGS.rerun_collapsed)
      else:
        run_grid(config, folder, learning_rates, FLAGS.seeds, FLAGS.first_seed, FLAGS.rerun_collapsed)


def parse_flags(argv: list[str]) -> list[str]:
  """`cli.parse_flags`, with SIGTERM and Ctrl-C held from the command's start to its end: one that arrives before
  the first run, between runs or around one's training loop starts no further run."""
  stop_signals.hold_for_the_process()
  return cli.parse_flags(argv)


if __name__ == "__main__":
  app.run(cli_main, flags_parser=parse_flags)
