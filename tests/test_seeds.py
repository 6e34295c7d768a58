"""`python -m albert_jax.seeds`: several seeds of one fine-tuning recipe, each in DIR/seed_<k>, with DIR/seeds.json
(every run's best dev score and metrics, their median, mean, std, min, max, collapsed runs), resumable.

The end-to-end run is a tiny classifier whose dev split is one sentence under both labels: every run predicts one
class for it, so every run is collapsed whatever its seed, and is trained again (--rerun_collapsed=1)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from albert_jax import seeds, seeds_report
from albert_jax.errors import InputError
from albert_jax.run import Run
from albert_jax.tasks import get_task
from albert_jax.tasks.classification import THRESHOLDS_FILE
from albert_jax.tasks.squad import SquadPredictions
from albert_jax.tasks.token_classification import TagPredictions
from experiments import classification, glue
from tests.helpers import REPO, config_for, cpu_env, glue_data, spm, task_of, write_split
from tests.processes import Launch

RUN = ["--config.data.max_seq_length=16", "--config.allow_random_init=True", "--config.train.num_train_steps=4",
       "--config.train.global_batch_size=8", "--config.train.warmup_steps=1", "--config.train.eval_every=2",
       "--config.train.micro_batch_size=0", "--config.checkpoint.every=2", "--config.log.every=2",
       "--config.checkpoint.async_save=false"]


def seeds_cli(*args, wait=True):
  """`python -m albert_jax.seeds` on one CPU device, XLA at -O0: the finished process, or (wait=False) the running
  one with stdout and stderr merged."""
  cmd = [sys.executable, "-m", "albert_jax.seeds", *map(str, args)]
  env = cpu_env(1, fast_compile=True)
  if not wait:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


# --- the statistics and the collapse detector ----------------------------------------------------------------
def test_summary_statistics_by_hand():
  # 0.5 0.6 0.7 0.9: median (0.6 + 0.7) / 2; mean 2.7 / 4; deviations -0.175 -0.075 0.025 0.225, squares
  # 0.030625 + 0.005625 + 0.000625 + 0.050625 = 0.0875, over n - 1 = 3: std sqrt(0.0291666...) = 0.170782...
  summary = seeds_report.summarize([0.6, 0.9, 0.5, 0.7])
  assert summary == pytest.approx({"median": 0.65, "mean": 0.675, "std": 0.17078251276599330, "min": 0.5, "max": 0.9},
                                  abs=1e-12)
  assert seeds_report.summarize([0.8, 0.2, 0.5]) == pytest.approx({"median": 0.5, "mean": 0.5, "std": 0.3,
                                                                   "min": 0.2, "max": 0.8}, abs=1e-12)
  assert seeds_report.summarize([0.7]) == {"median": 0.7, "mean": 0.7, "std": None, "min": 0.7, "max": 0.7}


def glue_task(shared_data, root, name):
  return task_of(glue, f"task={name},size=tiny,data={glue_data(shared_data, name, root)},spm={spm(shared_data)}")


def dev_collapse_of(task, predictions, folder):
  """`seeds.dev_collapse` of `predictions` of the task's dev split, written as training writes them."""
  gold = task.gold_split(task.split_path("dev"))
  folder.mkdir(exist_ok=True)
  task.write_predictions(gold, predictions, str(folder / task.predictions_name("dev")))
  return seeds.dev_collapse(task, str(folder))


def test_one_class_for_every_dev_example_is_a_collapse(shared_data, tmp_path):
  rte = glue_task(shared_data, tmp_path / "glue", "rte")  # 23 dev pairs; labels (entailment, not_entailment)
  assert dev_collapse_of(rte, np.ones(23, int), tmp_path / "rte") == \
      "one class: every dev prediction is 'not_entailment'"
  assert dev_collapse_of(rte, np.arange(23) % 2, tmp_path / "rte") is None
  assert dev_collapse_of(rte, np.eye(23, dtype=int)[0], tmp_path / "rte") is None  # one example differs
  (tmp_path / "own").mkdir()
  write_split(tmp_path / "own" / "train.tsv", 8)
  write_split(tmp_path / "own" / "dev.tsv", 6)
  own = get_task(config_for(tmp_path / "own", spm(shared_data)))  # probabilities per class, in JSON lines
  leaning = np.array([[0.4, 0.6], [0.1, 0.9], [0.45, 0.55]] * 2)
  assert dev_collapse_of(own, leaning, tmp_path / "own_run") == "one class: every dev prediction is 'pos'"
  mixed = np.array([[0.4, 0.6], [0.9, 0.1], [0.45, 0.55]] * 2)  # pos, neg, pos, ...
  assert dev_collapse_of(own, mixed, tmp_path / "own_run") is None


def test_a_regression_collapses_when_its_scores_spread_below_a_thousandth_of_the_gold_scores(shared_data, tmp_path):
  stsb = glue_task(shared_data, tmp_path / "glue", "sts-b")
  gold = np.array([example.label for example in stsb.gold_split(stsb.split_path("dev")).examples])
  noise = np.where(np.arange(len(gold)) % 2, 1.0, -1.0) * gold.std()  # std exactly gold.std()
  assert dev_collapse_of(stsb, np.full(len(gold), 2.5), tmp_path / "run") == \
      f"constant: the dev scores' std is 0 (the gold scores' {gold.std():.3g})"
  assert dev_collapse_of(stsb, 2.5 + 0.0009 * noise, tmp_path / "run").startswith("constant: the dev scores' std is")
  assert dev_collapse_of(stsb, 2.5 + 0.0011 * noise, tmp_path / "run") is None
  assert dev_collapse_of(stsb, gold, tmp_path / "run") is None


def test_a_multi_label_run_collapses_when_every_row_gets_the_same_classes(tmp_path):
  """Read as label sets, chosen with the thresholds saved beside the weights (0.5 without them), not by argmax."""
  task = task_of(classification, "multi_label=true,labels=a|b|c")
  (tmp_path / "dev.tsv").write_text("text\tlabel\nrow 0\ta\nrow 1\tb|c\n")
  task.split_path = lambda name: str(tmp_path / f"{name}.tsv")
  same_sets = np.array([[0.9, 0.1, 0.6], [0.7, 0.4, 0.8]])  # argmax 0 and 2, yet both rows are a|c
  assert dev_collapse_of(task, same_sets, tmp_path / "run") == "one class: every dev prediction is 'a|c'"
  (tmp_path / "run" / THRESHOLDS_FILE).write_text(json.dumps({"labels": ["a", "b", "c"],
                                                               "thresholds": [0.5, 0.5, 0.7]}))
  assert dev_collapse_of(task, same_sets, tmp_path / "run") is None  # a, then a|c


@pytest.mark.parametrize("predictions, collapsed", [
    ({"q1": "B", "q2": "B", "q3": "B"}, "'B'"),                                          # RACE
    ({"q1": "B", "q2": "A", "q3": "B"}, None),
    (SquadPredictions({"q1": "", "q2": ""}, {}), "''"),                                  # SQuAD v2: no answer at all
    (SquadPredictions({"q1": "Paris", "q2": "1905"}, {}), None),
    (TagPredictions([["O", "O"], ["O"]], []), "'O'"),                                   # tagging: the majority tag
    (TagPredictions([["O", "B-PER"], ["O"]], []), None),
    (np.array([[0.1, 0.2, 0.6, 0.1], [0.3, 0.1, 0.5, 0.1]]), "2"),                    # multiple choice: option 2
])
def test_every_task_s_predictions_are_read_as_one_output_per_unit(predictions, collapsed):
  expected = collapsed and f"one class: every dev prediction is {collapsed}"
  assert seeds.collapse(types.SimpleNamespace(), None, predictions) == expected


def test_bad_counts_and_recipes_without_a_best_checkpoint_are_refused(shared_data, tmp_path):
  config = config_for(tmp_path, spm(shared_data))
  for counts, message in [((0, 0, 0), "--seeds=0, --first_seed=0, --rerun_collapsed=0: pass --seeds of at least 1"),
                          ((2, -1, 0), "--seeds=2, --first_seed=-1"),
                          ((1001, 0, 1), "--seeds=1001 with --rerun_collapsed: a rerun seed k \\+ 1000 would be"),
                          ((5, 2**32 - 5, 1), "Seeds up to 4294968295 are asked for; config.seed goes up to")]:
    with pytest.raises(InputError, match=f"^{message}"):
      seeds.check_recipe(config, *counts)
  seeds.check_recipe(config, 5, 2**32 - 5, 0)  # the last seed is 2**32 - 1, the highest jax.random.key takes
  config.train.eval_every = 0
  with pytest.raises(InputError, match="eval_every=0: this run keeps no best dev checkpoint"):
    seeds.check_recipe(config, 3, 0, 0)


def test_a_command_line_without_seeds_workdir_or_a_fine_tuning_config_is_refused_in_one_line(tmp_path):
  recipe = "--config=experiments/classification.py:size=tiny"
  for args, message in [
      ([recipe, f"--workdir={tmp_path}"], "--seeds is required: how many seeds to run, e.g. --seeds=5"),
      ([recipe, "--seeds=3"], "--workdir is required: seed k's run goes to WORKDIR/seed_<k>"),
      ([recipe, f"--workdir={tmp_path}", "--seeds=3", "--config.seed=4"], "--config.seed is set by this command"),
      (["--config=experiments/pretrain_tiny.py", f"--workdir={tmp_path}", "--seeds=3"],
       "--config is a pretraining config; albert_jax.seeds repeats a fine-tuning recipe")]:
    result = seeds_cli(*args)
    assert result.returncode == 1 and result.stderr.startswith(f"error: {message}"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and not result.stdout, result.stderr
  assert list(tmp_path.iterdir()) == []


# --- end to end: 2 seeds, each collapsed and trained again, stopped inside seed 1 and rerun ----------------------
@pytest.fixture(scope="module")
def runs(shared_data, tmp_path_factory):
  """`--seeds=2 --rerun_collapsed=1` (seeds 0, 1000, 1, 1001), stopped by SIGTERM (a preemption) once seed 1 has
  saved its step-2 checkpoint, then the same command again to the end. About 60 s: the tests using it are slow."""
  root = tmp_path_factory.mktemp("seeds")
  data = root / "data"
  data.mkdir()
  write_split(data / "train.tsv", 16)
  (data / "dev.tsv").write_text("sentence\tlabel\n" + "a fine film\tpos\na fine film\tneg\n" * 2)
  workdir = root / "runs"
  command = [f"--config=experiments/classification.py:size=tiny,data={data},spm={spm(shared_data)},text=sentence",
             *RUN, f"--workdir={workdir}", "--seeds=2", "--rerun_collapsed=1"]
  first = Launch(seeds_cli(*command, wait=False))
  try:
    while not (workdir / "seed_1" / "checkpoints" / "2").is_dir():
      assert first.proc.poll() is None and first.elapsed() < 300, first.output()
      time.sleep(0.002)
    first.proc.send_signal(signal.SIGTERM)
    assert first.finish() == 0, first.output()
  finally:
    if first.proc.poll() is None:
      first.kill()
  report_after_stop = json.loads((workdir / "seeds.json").read_text())
  finished_at = {seed: os.stat(workdir / f"seed_{seed}" / "best" / "best.json").st_mtime_ns for seed in (0, 1000)}
  second = Launch(seeds_cli(*command, wait=False))
  assert second.finish() == 0, second.output()
  return types.SimpleNamespace(workdir=workdir, first=first, second=second, report_after_stop=report_after_stop,
                               finished_at=finished_at, report=json.loads((workdir / "seeds.json").read_text()))


def predicted_labels(workdir, seed):
  best = json.loads((workdir / f"seed_{seed}" / "best" / "best.json").read_text())
  rows = (workdir / f"seed_{seed}" / "best" / f"step_{best['step']}" / "dev_predictions.jsonl").read_text()
  return best, {json.loads(line)["label"] for line in rows.splitlines()}


@pytest.mark.slow
def test_seeds_json_holds_every_run_its_best_and_collapse_and_the_median_of_the_counted_runs(runs):
  report = runs.report
  assert [run["seed"] for run in report["runs"]] == [0, 1000, 1, 1001] and report["seeds"] == [0, 1]
  assert (report["metric"], report["higher_is_better"]) == ("accuracy", True)
  for run in report["runs"]:
    best, labels = predicted_labels(runs.workdir, run["seed"])
    (label,) = labels  # one class for the one dev sentence
    assert run == {"seed": run["seed"], "workdir": str(runs.workdir / f"seed_{run['seed']}"), "best_step": best["step"],
                   "value": best["value"], "metrics": best["metrics"], "collapsed": True,
                   "collapse": f"one class: every dev prediction is {label!r}",
                   "rerun_of": {1000: 0, 1001: 1}.get(run["seed"]), "rerun_as": {0: 1000, 1: 1001}.get(run["seed"]),
                   "counted": run["seed"] >= 1000}
    assert best["value"] == 0.5 and set(best["metrics"]) == {"accuracy", "macro_f1"}  # pos and neg, half each
  assert report["summary"] == {"seeds": [1000, 1001], "collapsed": 2, "median": 0.5, "mean": 0.5, "std": 0.0,
                               "min": 0.5, "max": 0.5}
  lines = [line for _, line in runs.second.lines]
  table = lines[lines.index("      seed     step    accuracy  collapsed"):][:6]
  assert table[1:] == [
      *(f"{run['seed']:>10}  {run['best_step']:>7}      0.5000  {run['collapse']}" +
        ("" if run["counted"] else f" (trained again as seed {run['rerun_as']}), not counted")
        for run in report["runs"]),
      "2 runs: median 0.5000, mean 0.5000, std 0.0000, min 0.5000, max 0.5000; 2 collapsed"]


@pytest.mark.slow
def test_a_rerun_skips_the_finished_seeds_and_resumes_the_stopped_one(runs):
  assert runs.first.saw("Preemption: saved step") and not runs.first.saw("seed 1001"), runs.first.output()
  assert [run["seed"] for run in runs.report_after_stop["runs"]] == [0, 1000]
  for seed in (0, 1000):
    assert runs.second.saw(f"seed {seed}: finished (recorded in {runs.workdir / 'seeds.json'}), skipped")
    assert os.stat(runs.workdir / f"seed_{seed}" / "best" / "best.json").st_mtime_ns == runs.finished_at[seed]
  lines = [line for _, line in runs.second.lines]
  resumed = lines[lines.index(f"seed 1: training in {runs.workdir / 'seed_1'}"):]
  assert any(line.startswith("Resumed from step ") for line in resumed[:resumed.index(
      f"seed 1001: training in {runs.workdir / 'seed_1001'}")]), runs.second.output()
  # One compilation cache for every seed: only the first seed of the first command compiles the step. Seed 1 is
  # compiled again on its resume unless the stop landed on its last step (a loaded machine answers SIGTERM late).
  (saved,) = re.findall(r"Preemption: saved step (\d+) ", runs.first.output())
  compiled = [line for launch in (runs.first, runs.second) for _, line in launch.lines
              if line.startswith("Compiled the train step")]
  assert len(compiled) == (5 if int(saved) < 4 else 4), compiled
  assert all(line.endswith("(from the compilation cache).") for line in compiled[1:]), compiled


@pytest.mark.slow
def test_each_run_trains_with_its_own_seed(runs):
  """config.seed sets the head's initialisation, the data order and dropout: the first losses all differ."""
  first_loss = {}
  for seed in (0, 1000, 1, 1001):
    assert json.loads((runs.workdir / f"seed_{seed}" / "config.json").read_text())["seed"] == seed
    records = [json.loads(line) for line in (runs.workdir / f"seed_{seed}" / "metrics.jsonl").read_text().splitlines()]
    first_loss[seed] = next(r["loss"] for r in records if r.get("step") == 2 and "loss" in r)
  assert len(set(first_loss.values())) == 4, first_loss


@pytest.mark.slow
def test_a_recipe_from_converted_weights_takes_their_model_and_tokenizer_as_main_does(shared_data, tmp_path):
  """Only --config.init_checkpoint names the weights (a `convert --from=hf` folder, spiece.model beside): the seed
  trains with their model and tokenizer, said once, as `albert_jax.main` takes them."""
  import flax.linen as nn
  import jax
  import shutil
  from albert_jax import model as model_lib
  from albert_jax.model_config import model_config_from
  from albert_jax.tasks.heads import PooledClassifier
  from albert_jax.weights import store
  data, weights = tmp_path / "data", tmp_path / "weights"
  data.mkdir()
  write_split(data / "train.tsv", 8)
  write_split(data / "dev.tsv", 4)
  config = config_for(data, spm(shared_data))
  model = dict(vocab_size=30000, embedding_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=16)
  config.model.update(model)
  model_config = model_config_from(config)
  params = jax.tree.map(lambda x: np.zeros(x.shape, np.float32),
                        nn.unbox(model_lib.abstract_params(PooledClassifier(model_config, 2))))
  store.save_pretrained(str(weights), model_config, params)
  shutil.copy(spm(shared_data), weights / "spiece.model")
  result = seeds_cli(f"--config=experiments/classification.py:size=tiny,data={data},text=sentence", *RUN,
                     "--config.train.num_train_steps=2", f"--config.init_checkpoint={weights}",
                     f"--workdir={tmp_path / 'runs'}", "--seeds=1")
  assert result.returncode == 0, result.stdout + result.stderr
  said = f"model and tokenizer from {weights} (model_config.json): "
  assert result.stdout.count(said) == 1, result.stdout
  assert f"spm_model={weights}/spiece.model" in result.stdout
  run = json.loads((tmp_path / "runs" / "seed_0" / "config.json").read_text())
  assert ({k: run["model"][k] for k in model}, run["data"]["spm_model"]) == (model, f"{weights}/spiece.model")


# --- a learning-rate grid ------------------------------------------------------------------------------------------
def rate_report(values, higher_is_better=True):
  """A hand-built report of one rate (as `seeds_report.report` writes it), one counted run per value."""
  runs = [{"seed": seed, "value": value, "collapsed": False, "counted": True} for seed, value in enumerate(values)]
  return {"metric": "accuracy", "higher_is_better": higher_is_better, "seeds": list(range(len(values))), "runs": runs,
          "summary": {"seeds": list(range(len(values))), "collapsed": 0, **seeds_report.summarize(values)}}


def test_the_summary_names_the_best_counted_run_s_folder():
  """Collapsed runs trained again do not count; the first of a tie; lower is better for a loss-like metric."""
  run = lambda seed, value, counted=True: {"seed": seed, "workdir": f"/runs/seed_{seed}", "best_step": 20 + seed,
                                           "value": value, "collapsed": False, "collapse": None, "rerun_as": None,
                                           "counted": counted}
  result = {"metric": "accuracy", "higher_is_better": True, "seeds": [0, 1, 2],
            "runs": [run(0, 0.9, counted=False), run(1, 0.7), run(2, 0.8), run(3, 0.8)],
            "summary": {"seeds": [1, 2, 3], "collapsed": 0, **seeds_report.summarize([0.7, 0.8, 0.8])}}
  assert seeds_report.best_run(result) == "best run: /runs/seed_2 (seed 2, accuracy 0.8000 at step 22)"
  assert seeds_report.table(result).splitlines()[-1] == seeds_report.best_run(result)
  assert seeds_report.best_run({**result, "higher_is_better": False}).startswith("best run: /runs/seed_1 (seed 1, ")
  assert seeds_report.best_run({**result, "runs": [run(0, 0.9, counted=False)]}) is None


def test_the_best_learning_rate_is_the_best_median_and_the_first_listed_of_a_tie():
  grid = [{"learning_rate": rate, "summary": {"median": median}} for rate, median in [(1e-5, 0.7), (2e-5, 0.8),
                                                                                         (3e-5, 0.8), (4e-5, 0.6)]]
  assert seeds_report.best_learning_rate(grid, higher_is_better=True) == 2e-5
  assert seeds_report.best_learning_rate(grid, higher_is_better=False) == 4e-5
  assert seeds_report.best_learning_rate(grid[2:], higher_is_better=True) == 3e-5
  tie = [{"learning_rate": rate, "summary": {"median": 0.5}} for rate in (3e-5, 1e-5)]
  assert seeds_report.best_learning_rate(tie, higher_is_better=True) == 3e-5


def test_a_grid_s_report_holds_every_rate_and_at_its_top_the_rate_with_the_best_median():
  # medians: 1e-5 (0.6, 0.9, 0.7) -> 0.7; 2e-5 (0.8, 0.75, 0.5) -> 0.75; 3e-5 (0.75, 0.75, 0.1) -> 0.75, a tie
  reports = {1e-5: rate_report([0.6, 0.9, 0.7]), 2e-5: rate_report([0.8, 0.75, 0.5]),
             3e-5: rate_report([0.75, 0.75, 0.1])}
  result = seeds_report.grid_report([1e-5, 2e-5, 3e-5], reports)
  assert result == {**reports[2e-5], "learning_rates": [1e-5, 2e-5, 3e-5], "best_learning_rate": 2e-5,
                    "grid": [{"learning_rate": rate, **report} for rate, report in reports.items()]}
  assert result["summary"]["median"] == 0.75
  assert seeds_report.grid_table(result).splitlines() == [
      "    rate  runs    median      mean       std  collapsed  (accuracy)",
      "   1e-05     3    0.7000    0.7333    0.1528          0",
      "   2e-05     3    0.7500    0.6833    0.1607          0  <- best median",
      "   3e-05     3    0.7500    0.5333    0.3753          0"]
  # a grid still running: the rates with a run so far, the grid's rates all listed
  partial = seeds_report.grid_report([1e-5, 2e-5, 3e-5], {1e-5: reports[1e-5]})
  assert (partial["best_learning_rate"], len(partial["grid"])) == (1e-5, 1)
  assert partial["learning_rates"] == [1e-5, 2e-5, 3e-5]


@pytest.mark.parametrize("values, message", [
    ([], "--learning_rates is empty: list the rates to try, e.g. --learning_rates=1e-5,2e-5,3e-5, or drop the flag"),
    (["1e-5", "fast"], "--learning_rates: 'fast' is not a positive number; list rates such as 1e-5,2e-5,3e-5."),
    (["0"], "--learning_rates: '0' is not a positive number"),
    (["-1e-5"], "--learning_rates: '-1e-5' is not a positive number"),
    (["nan"], "--learning_rates: 'nan' is not a positive number"),
    (["inf"], "--learning_rates: 'inf' is not a positive number"),
    (["2e-5", "1e-5", "0.00002"], "--learning_rates lists the rate 2e-05 twice; list each rate once."),
])
def test_an_empty_grid_a_rate_that_is_not_a_positive_number_and_a_rate_listed_twice_are_refused(values, message):
  with pytest.raises(InputError, match=f"^{re.escape(message)}"):
    seeds.parse_learning_rates(values)


def test_the_learning_rates_are_read_in_their_order():
  assert seeds.parse_learning_rates(["3e-5", " 1e-5", "2E-5"]) == [3e-5, 1e-5, 2e-5]
  assert seeds.parse_learning_rates(None) is None


def test_a_folder_s_grid_does_not_change(tmp_path):
  grid, single = tmp_path / "grid", tmp_path / "single"
  for folder, recorded in [(grid, {"learning_rates": [1e-5, 2e-5]}), (single, {})]:
    folder.mkdir()
    (folder / "seeds.json").write_text(json.dumps({**recorded, "runs": [{"seed": 0}]}))
  seeds.check_grid(Run(str(grid)), [1e-5, 2e-5])
  seeds.check_grid(Run(str(single)), None)
  seeds.check_grid(Run(str(tmp_path / "new")), [3e-5])
  for folder, rates, message in [
      (grid, [1e-5, 2e-5, 3e-5], "records --learning_rates=1e-05,2e-05, this command asks for "
                                 "--learning_rates=1e-05,2e-05,3e-05"),
      (grid, [2e-5, 1e-5], "records --learning_rates=1e-05,2e-05, this command asks for --learning_rates=2e-05,1e-05"),
      (grid, None, "records --learning_rates=1e-05,2e-05, this command asks for no --learning_rates"),
      (single, [1e-5], "records no --learning_rates, this command asks for --learning_rates=1e-05")]:
    with pytest.raises(InputError, match=f"^{re.escape(f'{folder}/seeds.json {message}')}; a folder's grid does not "
                                         "change: run this one with another --workdir.$"):
      seeds.check_grid(Run(str(folder)), rates)


@pytest.fixture(scope="module")
def grid(shared_data, tmp_path_factory):
  """`--learning_rates=1e-3,3e-4 --seeds=1` at 2 steps, then the same command again (every run finished), then with
  another grid (refused). About 30 s: the tests using it are slow."""
  root = tmp_path_factory.mktemp("grid")
  data = root / "data"
  data.mkdir()
  write_split(data / "train.tsv", 16)
  write_split(data / "dev.tsv", 6)
  workdir = root / "runs"
  command = [f"--config=experiments/classification.py:size=tiny,data={data},spm={spm(shared_data)},text=sentence",
             *RUN, "--config.train.num_train_steps=2", f"--workdir={workdir}", "--seeds=1"]
  first = seeds_cli(*command, "--learning_rates=1e-3,3e-4")
  assert first.returncode == 0, first.stdout + first.stderr
  finished_at = {rate: os.stat(workdir / f"lr_{rate}" / "seed_0" / "best" / "best.json").st_mtime_ns
                 for rate in ("0.001", "0.0003")}
  report = json.loads((workdir / "seeds.json").read_text())
  again = seeds_cli(*command, "--learning_rates=1e-3,3e-4")
  changed = seeds_cli(*command, "--learning_rates=1e-3")
  return types.SimpleNamespace(workdir=workdir, first=first, again=again, changed=changed, finished_at=finished_at,
                               report=report)


@pytest.mark.slow
def test_each_rate_runs_its_seeds_in_its_folder_and_seeds_json_chooses_the_best_median(grid):
  report, workdir = grid.report, grid.workdir
  assert (report["learning_rates"], [entry["learning_rate"] for entry in report["grid"]]) == ([1e-3, 3e-4],) * 2
  medians = []
  for entry, name in zip(report["grid"], ("0.001", "0.0003")):
    run_dir = workdir / f"lr_{name}" / "seed_0"
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["train"]["learning_rate"], config["seed"]) == (entry["learning_rate"], 0)
    best = json.loads((run_dir / "best" / "best.json").read_text())
    (run,) = entry["runs"]
    assert (run["workdir"], run["best_step"], run["value"]) == (str(run_dir), best["step"], best["value"])
    assert entry["summary"] == {"seeds": [0], "collapsed": int(run["collapsed"]), "median": best["value"],
                                "mean": best["value"], "std": None, "min": best["value"], "max": best["value"]}
    rate_report = json.loads((workdir / f"lr_{name}" / "seeds.json").read_text())  # the rate's own seeds folder
    assert {"learning_rate": entry["learning_rate"], **rate_report} == entry
    medians.append(best["value"])
  chosen = [1e-3, 3e-4][medians.index(max(medians))]  # accuracy: higher is better; the first of a tie
  assert report["best_learning_rate"] == chosen
  assert {key: report[key] for key in ("metric", "higher_is_better", "seeds", "runs", "summary")} == \
      {key: value for key, value in report["grid"][[1e-3, 3e-4].index(chosen)].items() if key != "learning_rate"}
  lines = grid.first.stdout.splitlines()
  assert lines[-3:] == seeds_report.grid_table(report).splitlines()
  assert lines[-2].endswith("  <- best median") == (chosen == 1e-3) and lines[-1].endswith("  <- best median") == \
      (chosen == 3e-4)


@pytest.mark.slow
def test_the_output_ends_with_one_summary_naming_the_best_run_s_folder_and_no_run_s_done_line(grid, runs):
  """Each seed's run finishes without the `done: ... next:` line a lone run ends with; the command's summary names
  the best run's folder: a grid's at the best rate, before the rates' table; a seeds folder's after its table."""
  grid_lines, seeds_lines = grid.first.stdout.splitlines(), [line for _, line in runs.second.lines]
  assert not [line for line in grid_lines + seeds_lines if line.startswith("done: ")]
  best_rate = grid.report["best_learning_rate"]
  assert grid_lines[-4] == f"{seeds_report.best_run(grid.report)} at the best rate, {best_rate:g}"
  assert grid_lines[-4].startswith(f"best run: {grid.workdir / 'lr_'}")
  assert seeds_lines[-1] == seeds_report.best_run(runs.report)
  assert seeds_lines[-1].startswith(f"best run: {runs.workdir / 'seed_100'}")  # the counted runs: 1000 and 1001


@pytest.mark.slow
def test_a_grid_rerun_skips_its_finished_runs_and_another_grid_is_refused(grid):
  assert grid.again.returncode == 0, grid.again.stdout + grid.again.stderr
  assert "training in" not in grid.again.stdout
  for name in ("0.001", "0.0003"):
    assert f"seed 0: finished (recorded in {grid.workdir / f'lr_{name}' / 'seeds.json'}), skipped" in grid.again.stdout
    assert os.stat(grid.workdir / f"lr_{name}" / "seed_0" / "best" / "best.json").st_mtime_ns == \
        grid.finished_at[name]
  assert json.loads((grid.workdir / "seeds.json").read_text()) == grid.report
  assert grid.changed.returncode == 1 and not grid.changed.stdout, grid.changed.stdout + grid.changed.stderr
  assert grid.changed.stderr == (f"error: {grid.workdir / 'seeds.json'} records --learning_rates=0.001,0.0003, this "
                                 "command asks for --learning_rates=0.001; a folder's grid does not change: run this "
                                 "one with another --workdir.\n")


# --- SIGTERM and Ctrl-C, held for the whole command ----------------------------------------------------------------
def grid_command(shared_data, root):
  """`--learning_rates=1e-3,3e-4 --seeds=1` at 4 steps with asynchronous saves, in root/runs."""
  data = root / "data"
  data.mkdir(parents=True)
  write_split(data / "train.tsv", 16)
  write_split(data / "dev.tsv", 6)
  return [f"--config=experiments/classification.py:size=tiny,data={data},spm={spm(shared_data)},text=sentence",
          *RUN, "--config.checkpoint.async_save=true", f"--workdir={root / 'runs'}", "--seeds=1",
          "--learning_rates=1e-3,3e-4"]


def stopped(command, signum, when) -> Launch:
  """The command, sent `signum` once `when(launch)` holds; finished."""
  launch = Launch(seeds_cli(*command, wait=False))
  try:
    while not when(launch):
      assert launch.proc.poll() is None and launch.elapsed() < 300, launch.output()
      time.sleep(0.002)
    launch.proc.send_signal(signum)
    launch.finish()
  finally:
    if launch.proc.poll() is None:
      launch.kill()
  return launch


def catches_sigterm(launch) -> bool:
  """Whether the process has a handler for SIGTERM (the command holds it from reading its flags on: before, it is
  importing, as `main` does, and ends at once)."""
  status = (Path("/proc") / str(launch.proc.pid) / "status").read_text()
  caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
  return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.slow
@pytest.mark.parametrize("signum, moment", [
    (signal.SIGTERM, "step-2 checkpoint"),     # during the run's last save, after its loop's last stop check
    (signal.SIGINT, "step-2 checkpoint"),
    (signal.SIGTERM, "a seed's start-up"),     # before any training loop holds the signal
    (signal.SIGINT, "the command's start-up"),
])
def test_a_stop_at_any_moment_of_a_grid_starts_no_further_run_and_the_rerun_resumes(shared_data, tmp_path, signum,
                                                                                       moment):
  command = grid_command(shared_data, tmp_path)
  first_run = tmp_path / "runs" / "lr_0.001" / "seed_0"
  when = {"step-2 checkpoint": lambda launch: (first_run / "checkpoints" / "2").is_dir(),
          "a seed's start-up": lambda launch: launch.saw(f"seed 0: training in {first_run}"),
          "the command's start-up": catches_sigterm}[moment]
  first = stopped(command, signum, when)
  reason, code = ("Interrupted", 130) if signum == signal.SIGINT else ("Preemption", 0)
  assert first.proc.returncode == code, first.output()
  last = first.lines[-1][1]
  saved = re.fullmatch(rf"{reason}: saved step (\d) in {first_run / 'checkpoints'}; exiting cleanly \(rerun the "
                       r"same command to resume\)\.", last)
  assert saved or re.fullmatch(rf"{reason}: no further run starts; {tmp_path / 'runs'}/(lr_0\.001/)?seeds\.json "
                               r"records the finished ones \(rerun the same command to continue\)\.", last), \
      first.output()
  assert not first.saw("learning rate 0.0003") and not (tmp_path / "runs" / "lr_0.0003").exists(), first.output()
  assert "Traceback" not in first.output()
  second = Launch(seeds_cli(*command, wait=False))
  assert second.finish() == 0, second.output()
  if saved:
    assert second.saw(f"Resumed from step {saved.group(1)}") or saved.group(1) == "4", second.output()
  report = json.loads((tmp_path / "runs" / "seeds.json").read_text())
  assert [[run["best_step"] > 0 for run in entry["runs"]] for entry in report["grid"]] == [[True], [True]]
