"""Experiment tracking (albert_jax/trackers.py): the resolved config as TensorBoard hparams, a Weights & Biases
run written offline and read back with wandb's own reader, continued on resume, and the refusals in one line."""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

import grain
import ml_collections
import pytest
from flax import traverse_util
from tensorboardX.proto import event_pb2, plugin_hparams_pb2

from albert_jax import errors, trackers
from albert_jax.run import Run, tracker_ids
from albert_jax.run.layout import WANDB_ID_FILE
from tests.helpers import REPO, SMALL_RUN, pretrain_cli as cli, require_module

PROJECT = "--config.log.wandb_project=albert-test"


def test_the_config_becomes_tensorboard_hparams_by_section_and_field():
  config = ml_collections.ConfigDict({"train": {"learning_rate": 0.5, "steps": 3, "shape": (("data", -1),)},
                                      "log": {"wandb_project": "", "on": True}, "seed": 0,
                                      "model": {"flat_matmuls": ml_collections.config_dict.placeholder(bool)}})
  assert trackers.hparam_values(config) == {
      "train.learning_rate": 0.5, "train.steps": 3, "train.shape": "(('data', -1),)", "log.wandb_project": "",
      "log.on": True, "seed": 0, "model.flat_matmuls": "None"}
  assert [trackers.tag(name) for name in ("loss", "eval/mlm_loss", "dev/f1")] == ["train/loss", "eval/mlm_loss",
                                                                                   "dev/f1"]


def test_a_new_run_in_a_path_used_before_gets_its_own_wandb_run(tmp_path):
  """The W&B run id is kept in the workdir: the same at every start, a new one where the workdir was deleted and
  started afresh; a workdir that logged before ids were kept continues under its path's hash, its id then."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  first = tracker_ids.wandb_run_id(Run(str(workdir)))
  assert tracker_ids.wandb_run_id(Run(str(workdir))) == first == (workdir / WANDB_ID_FILE).read_text()
  shutil.rmtree(workdir)
  workdir.mkdir()
  second = tracker_ids.wandb_run_id(Run(str(workdir)))
  assert second != first and len(second) == len(first) == 16
  shutil.rmtree(workdir)
  workdir.mkdir()
  (workdir / "metrics.jsonl").write_text('{"step": 1, "loss": 10.0}\n')
  assert tracker_ids.wandb_run_id(Run(str(workdir))) == hashlib.sha256(str(workdir).encode()).hexdigest()[:16]


def wandb_dirs(tmp_path) -> dict[str, str]:
  """Every folder W&B writes, under `tmp_path` (its runs in tmp_path/wandb)."""
  return {"WANDB_DIR": str(tmp_path), **{f"WANDB_{name}_DIR": str(tmp_path / name.lower())
                                         for name in ("CACHE", "CONFIG", "DATA")}}


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
  """A 2-step run logged to W&B offline, then resumed to step 3 with other tags: (workdir, W&B folder)."""
  require_module("wandb", "wandb")
  root = tmp_path_factory.mktemp("tracked")
  workdir, env = root / "run", {"WANDB_MODE": "offline", **wandb_dirs(root)}
  for steps, tags in ((2, "tiny, ci"), (3, "tiny,resumed")):
    result = cli(workdir, *SMALL_RUN, f"--config.train.num_train_steps={steps}", PROJECT,
                 f"--config.log.wandb_tags={tags}", extra_env=env, fast_compile=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"step {steps}/{steps} |" in result.stderr  # W&B's console capture leaves the progress line alone
  return workdir, root / "wandb"


def wandb_records(run_dir) -> list[dict]:
  """The records of an offline W&B run, as `wandb leet inspect --json` prints them."""
  [log] = glob.glob(os.path.join(run_dir, "run-*.wandb"))
  result = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", log], capture_output=True,
                          text=True, timeout=120, check=True)
  return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.slow
def test_an_offline_wandb_run_holds_our_metrics_and_config_and_a_resume_continues_it(tracked):
  workdir, wandb_dir = tracked
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  starts = sorted(glob.glob(str(wandb_dir / "offline-run-*")))
  assert len(starts) == 2
  for run_dir, steps, config, tags in ((starts[0], [1, 2], "config.2.json", ["tiny", "ci"]),
                                       (starts[1], [3], "config.json", ["tiny", "resumed"])):
    records = wandb_records(run_dir)
    [run] = [r["run"] for r in records if r["type"] == "run"]
    assert (run["run_id"], run["display_name"], run["project"], run["tags"], run["resume"]) == (
        tracker_ids.wandb_run_id(Run(str(workdir))), "run", "albert-test", tags, True)
    history = {r["history"]["step"]["num"]: {k: v for k, v in r["history"]["item"].items() if not k.startswith("_")}
               for r in records if r["type"] == "history"}
    assert history == {row["step"]: {trackers.tag(k): v for k, v in row.items() if k != "step"}
                       for row in rows if row["step"] in steps}
    [logged_config] = [r["config"]["update"] for r in records if r["type"] == "config"]
    assert logged_config == json.loads((workdir / config).read_text())
    assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [0]


def session_starts(events_file) -> list[dict]:
  """The hparams of each session start in a TensorBoard events file."""
  starts = []
  for record in grain.experimental.TFRecordIterDataset(str(events_file)):
    for value in event_pb2.Event.FromString(record).summary.value:
      if value.tag == "_hparams_/session_start_info":
        data = plugin_hparams_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
        starts.append({k: getattr(v, v.WhichOneof("kind")) for k, v in data.session_start_info.hparams.items()})
  return starts


@pytest.mark.slow
def test_each_start_of_a_run_records_its_config_as_tensorboard_hparams(tracked):
  workdir, _ = tracked
  events = sorted((workdir / "tensorboard").glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns)
  assert len(events) == 2
  for events_file, config in zip(events, ("config.2.json", "config.json")):
    [hparams] = session_starts(events_file)
    saved = traverse_util.flatten_dict(json.loads((workdir / config).read_text()), sep=".")
    assert hparams.keys() == saved.keys()
    assert {k: v for k, v in hparams.items() if k in ("mesh.shape", "model.flat_matmuls")} == {
        "mesh.shape": "(('data', -1), ('fsdp', 1), ('tensor', 1))", "model.flat_matmuls": "None"}
    assert {k: v for k, v in hparams.items() if not isinstance(saved[k], list) and saved[k] is not None} == {
        k: v for k, v in saved.items() if not isinstance(v, list) and v is not None}


def test_a_wandb_project_without_the_package_stops_before_anything_is_written(tmp_path):
  code = ("import sys, runpy; sys.modules['wandb'] = None; sys.argv = sys.argv[1:]; "
          "runpy.run_module('albert_jax.main', run_name='__main__')")
  workdir = tmp_path / "run"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", code, "main", "--config=experiments/pretrain_tiny.py:synthetic",
                           f"--workdir={workdir}", *SMALL_RUN, PROJECT], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      "error: log.wandb_project=albert-test logs to Weights & Biases, whose package is not installed: "
      'pip install -e ".[wandb]" (or leave log.wandb_project empty).')
  assert not workdir.exists()


def test_wandb_without_an_account_is_one_line_naming_offline_mode(tmp_path, monkeypatch):
  wandb = require_module("wandb", "wandb")
  for name in ("WANDB_API_KEY", "WANDB_MODE"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login
  for name, value in wandb_dirs(tmp_path).items():
    monkeypatch.setenv(name, value)
  log = ml_collections.ConfigDict({"wandb_project": "albert-test", "wandb_entity": "", "wandb_run_name": "",
                                   "wandb_tags": ""})
  try:
    with pytest.raises(errors.EnvironmentUserError) as refused:
      trackers.WandbTracker(Run(str(tmp_path / "run")), log)
  finally:
    wandb.teardown()
  message = str(refused.value)
  assert message.startswith("Weights & Biases could not start the run of log.wandb_project=albert-test: ")
  assert message.endswith("(WANDB_MODE=offline logs without an account; `wandb sync` uploads later).")
  assert "wandb login" in message and "\n" not in message


def test_a_bad_wandb_mode_or_tag_stops_before_anything_is_written(tmp_path):
  """Both were pydantic tracebacks from inside wandb.init, after the workdir was made."""
  require_module("wandb", "wandb")
  workdir = tmp_path / "run"
  bogus = cli(workdir, *SMALL_RUN, PROJECT, extra_env={"WANDB_MODE": "bogus", **wandb_dirs(tmp_path)})
  assert bogus.returncode == 1 and bogus.stderr.strip().splitlines() == [
      "error: WANDB_MODE=bogus: Weights & Biases refuses it: Input should be 'online', 'offline', 'shared', "
      "'disabled', 'dryrun' or 'run'."], bogus.stderr
  assert not workdir.exists()
  log = ml_collections.ConfigDict({"wandb_project": "albert-test", "wandb_tags": "tiny, " + "t" * 300})
  with pytest.raises(errors.InputError, match=r"^log\.wandb_tags: Weights & Biases refuses it: Tag 't{20}\.\.\.t{20}' "
                                              r"is 300 characters\. Tags must be between 1 and 64 characters\.$"):
    trackers.check_trackers(log)
  trackers.check_trackers(ml_collections.ConfigDict({"wandb_project": "albert-test", "wandb_tags": "t" * 64}))


@pytest.mark.parametrize("name", ["metrics.jsonl", "tensorboard"])
def test_a_tracker_file_that_is_a_symlink_is_refused_not_written_through(tmp_path, name):
  """Another run's metrics.jsonl linked in was appended to; a linked tensorboard/ got this run's event files."""
  elsewhere, run = tmp_path / "elsewhere", tmp_path / "run"
  elsewhere.mkdir()
  run.mkdir()
  target = elsewhere / name
  if name == "tensorboard":
    target.mkdir()
  else:
    target.write_text('{"step": 1}\n')
  (run / name).symlink_to(target)
  log = ml_collections.ConfigDict({"wandb_project": ""})
  with pytest.raises(errors.InputError) as refused:
    trackers.open_trackers(Run(str(run)), Run(str(run)), log)
  assert str(refused.value) == (f"{run / name} is a symlink (to {target}); the run writes its own {name} there, not "
                                "through a link: remove the link and rerun.")
  assert sorted(p.name for p in run.iterdir()) == [name]
  assert (sorted(p.name for p in target.iterdir()) == [] if name == "tensorboard"
          else target.read_text() == '{"step": 1}\n')
  (run / name).unlink()
  opened = trackers.open_trackers(Run(str(run)), Run(str(run)), log)
  for tracker in opened:
    tracker.close()
  assert (run / "metrics.jsonl").is_file() and (run / "tensorboard").is_dir()
