"""Fault injection for fine-tuning, whose workdir holds more than pretraining's: the best dev checkpoint
(`best/step_N/` with its dev predictions, named by `best/best.json`, older steps pruned), the test predictions
written after training, head.json and config.json. One run killed with SIGKILL at moments the test detects (the
kills land where they land, never by a clock) and relaunched after each ends exactly like the same run left alone.
"""
import json
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from albert_jax.run import Run
from albert_jax.run.best import read_best
from albert_jax.weights import store
from tests.helpers import TINY_RUN, assert_trees_equal, finetune_cli as cli, glue_data, spm, write_tsv
from tests.processes import TMP_MARK, Launch, records, without_timing

STEPS = 24
# STS-B's Pearson score moves at every evaluation: best/ changes several times (steps 2, 6, 8, 14, 16 on a CPU).
RUN = [*(o for o in TINY_RUN if "num_train_steps" not in o and "every" not in o),
       f"--config.train.num_train_steps={STEPS}", "--config.train.eval_every=2", "--config.checkpoint.every=3",
       "--config.checkpoint.keep=2", "--config.checkpoint.async_save=true", "--config.log.every=1",
       "--config.train.learning_rate=1e-3"]


def best_step(workdir: Path) -> int | None:
  record = read_best(Run(str(workdir)))
  return record and record["step"]


def kill_points(workdir: Path):
  """(what, moment) in launch order; a moment is a test of the launch (and the workdir) polled every few ms."""
  best = workdir / "best"
  at_start = {}
  return [
      # Inside the save of a second best: best/step_N/ appears beside the one best.json names.
      ("inside a new best's save", lambda launch: len(list(best.glob("step_*"))) >= 2),
      # The pointer names a step after the checkpoint the next launch continues from (the older step maybe not
      # pruned yet): the next launch drops it and scores those steps again.
      ("best.json just moved", lambda launch: best_step(workdir) != at_start.setdefault("best", best_step(workdir))),
      ("inside the drop of that best, or just after the restore",
       lambda launch: launch.saw("Dropping") or launch.saw("Resumed from")),
      ("after the last evaluation: the final checkpoint and the test predictions to come",
       lambda launch: launch.saw(f"dev at step {STEPS}:")),
  ]


def kill_at(launch: Launch, moment, what: str) -> None:
  while not moment(launch):
    assert launch.proc.poll() is None, f"the launch ended before the kill point ({what}):\n{launch.output()}"
    assert launch.elapsed() < 300, f"the kill point ({what}) did not come in 300 s:\n{launch.output()}"
    time.sleep(0.002)
  launch.kill()


def sts_b(shared_data, root: Path) -> Path:
  """STS-B's sliced train/dev, and a test file: the dev rows without their score."""
  data = glue_data(shared_data, "sts-b", root)
  header, *rows = [line.split("\t")[:-1] for line in (data / "STS-B" / "dev.tsv").read_text().splitlines()]
  write_tsv(data / "STS-B" / "test.tsv", header, rows)
  return data


@pytest.mark.slow
def test_fine_tuning_killed_at_its_best_saves_and_predictions_ends_like_an_uninterrupted_run(
    shared_data, tmp_path, launches):
  data = sts_b(shared_data, tmp_path / "glue")
  config = f"experiments/glue.py:task=sts-b,size=tiny,data={data},spm={spm(shared_data)}"
  run = [*RUN, f"--config.compilation_cache_dir={tmp_path / 'cache'}"]  # the victim starts with the step compiled
  reference, victim = tmp_path / "reference", tmp_path / "victim"
  result = cli(config, reference, *run)
  assert result.returncode == 0, result.stdout + result.stderr
  improved = sorted({int(line.split("(best: step ")[1].split(",")[0]) for line in result.stdout.splitlines()
                     if "(best: step " in line})
  assert len(improved) >= 3, f"the kill points need a best that moves three times; the reference's: {improved}"

  done = []
  for what, moment in kill_points(victim):
    launches.append(Launch(cli(config, victim, *run, wait=False)))
    kill_at(launches[-1], moment, what)
    last = launches[-1].lines[-1][1][:70] if launches[-1].lines else "-"
    done.append(f"killed {what} | best/: {sorted(p.name for p in (victim / 'best').glob('*'))} | last line: {last}")
  context = "\n".join(done)
  print(context, flush=True)
  for _ in range(2):  # the run finishes; then a relaunch finds nothing to train and writes the test predictions again
    launches.append(Launch(cli(config, victim, *run, wait=False)))
    assert launches[-1].finish() == 0, f"{context}\n{launches[-1].output()}"
  assert launches[-1].saw("Nothing to train"), launches[-1].output()
  for launch in launches:
    assert not launch.saw("Traceback"), f"{context}\n{launch.output()}"

  # The same best: its record, its weights bit for bit, its dev predictions, the test predictions.
  best_a, best_b = read_best(Run(str(reference))), read_best(Run(str(victim)))
  weights_a, weights_b = Path(best_a.pop("weights")), Path(best_b.pop("weights"))
  assert best_a == best_b and weights_b == victim / "best" / weights_a.name, context
  assert sorted(p.name for p in (victim / "best").iterdir()) == ["best.json", weights_a.name], context  # pruned
  assert_trees_equal(*(jax.tree.map(np.asarray, store.load_pretrained(str(w))[1])
                       for w in (weights_a, weights_b)))
  for name in (f"best/{weights_a.name}/dev_predictions.tsv", f"best/{weights_a.name}/model_config.json", "STS-B.tsv",
               "head.json"):
    assert (victim / name).read_bytes() == (reference / name).read_bytes(), (context, name)
  assert json.loads((victim / "config.json").read_text().replace(str(victim), str(reference))) == json.loads(
      (reference / "config.json").read_text()), context
  # Every record logged, train or dev, in any launch, equals the reference's for its step; none is missing.
  key = lambda record: (record["step"], *sorted(record))  # a step's train record, or its dev record
  expected = {key(r): r for r in map(without_timing, records(reference))}
  got = list(map(without_timing, records(victim)))
  for record in got:
    assert record == expected.get(key(record)), (context, record)
  assert set(map(key, got)) == set(expected), context
  # Nothing left over: no lock, no temporary file or directory.
  assert not (victim / "run.lock").exists(), context
  assert not [p for p in victim.rglob("*") if TMP_MARK in p.name or p.name.endswith(".tmp")], context
