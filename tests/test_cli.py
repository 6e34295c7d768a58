"""The command line's handling of bad input: our own errors in one line and exit 1, a library's with its
traceback; workdirs that cannot serve a mode refused before anything is written, a read-only one served by a mode
that writes nothing there; experiment arguments typed."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from albert_jax import errors
from experiments import common
from tests.helpers import REPO, SMALL_RUN, pretrain_cli as cli, require_module


def test_a_config_mistake_is_one_line_naming_the_fix(tmp_path):
  result = cli(tmp_path, *SMALL_RUN, "--config.train.micro_batch_size=3")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      "error: train.global_batch_size=8 must equal micro_batch_size=3 × 1 data-parallel devices × an integer number "
      "of accumulation steps; pick a micro batch that divides 8.")


def test_an_error_raised_by_a_library_keeps_its_traceback():
  ours = lambda: common.parse_arg("typo=1", size="base")
  for raise_it, expected in ((ours, True), (lambda: np.reshape(np.arange(3), (2, 2)), False)):
    with pytest.raises(ValueError) as error:
      raise_it()
    assert errors.is_user_error(error.value) is expected
  with pytest.raises(SystemExit, match="^error: Unknown config argument 'typo'"):
    with errors.one_line_user_errors():
      ours()
  with pytest.raises(ValueError, match="cannot reshape"):
    with errors.one_line_user_errors():
      np.reshape(np.arange(3), (2, 2))
  with pytest.raises(SystemExit, match=r"^error: \[Errno 20\] Not a directory"):  # the OS refusing: one line too
    with errors.one_line_user_errors():
      open(os.devnull + "/missing")


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_workdir_that_is_a_file_is_refused(tmp_path, mode):
  workdir = tmp_path / "a_file"
  workdir.write_text("notes")
  result = cli(workdir, *SMALL_RUN, f"--mode={mode}")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: --workdir={workdir} is a file; pass a directory (it is created if missing).")
  assert workdir.read_text() == "notes"


def test_a_workdir_that_cannot_be_created_is_refused(tmp_path):
  (tmp_path / "a_file").write_text("")
  workdir = tmp_path / "a_file" / "run"
  result = cli(workdir, *SMALL_RUN)
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: --workdir={workdir} cannot be created: {tmp_path / 'a_file'} is a file; pass a directory path.")


def test_eval_of_a_missing_workdir_names_it_and_creates_nothing(tmp_path):
  workdir = tmp_path / "typo"
  result = cli(workdir, *SMALL_RUN, "--mode=eval")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: --workdir={workdir} does not exist; --mode=eval reads the weights of a training run: pass that run's "
      "--workdir.")
  assert not workdir.exists()


def test_eval_of_a_workdir_without_checkpoints_writes_nothing_there(tmp_path):
  """The refusal came after the checkpoints were opened, which made checkpoints/ (and compilation_cache/) there."""
  result = cli(tmp_path, *SMALL_RUN, "--mode=eval")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: No checkpoint in {tmp_path / 'checkpoints'}; train first (--mode=train).")
  assert os.listdir(tmp_path) == []


# `python -m albert_jax.main` in a process that sees the workdir (its first argument) as not writable, as a user
# without write permission does: tests may run as root, whom `chmod a-w` does not stop.
READ_ONLY = ("import os, runpy, sys; workdir = sys.argv.pop(1); access = os.access; os.access = lambda path, mode: "
             "access(path, mode) and not (mode & os.W_OK and str(path).startswith(workdir)); "
             "runpy.run_module('albert_jax.main', run_name='__main__')")


def files(directory):
  """Every path under `directory` with its size and modification time."""
  return sorted((str(p), p.lstat().st_size, p.lstat().st_mtime_ns) for p in directory.rglob("*"))


def test_pretraining_eval_reads_a_read_only_workdir(tmp_path):
  """Unlike fine-tuning's eval (which writes dev predictions there), it is not refused: it writes nothing there, its
  compilation cache off, and prints the metrics that a writable workdir gives; without --config, from the settings
  of the run's config.json, those of the full command line."""
  workdir = tmp_path / "run"
  assert cli(workdir, *SMALL_RUN, "--config.train.num_train_steps=2").returncode == 0
  writable = cli(workdir, *SMALL_RUN, "--mode=eval")
  assert writable.returncode == 0, writable.stderr
  subprocess.run(["chmod", "-R", "a-w", workdir], check=True)
  before = files(workdir)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
  try:
    result = subprocess.run([sys.executable, "-c", READ_ONLY, str(workdir), f"--workdir={workdir}", "--mode=eval"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  finally:
    subprocess.run(["chmod", "-R", "u+w", workdir], check=True)
  assert result.returncode == 0, result.stderr
  assert f"Compilation cache off: {workdir}/compilation_cache cannot be written" in result.stdout
  assert f"config: {workdir}/config.json (the run's resolved config); no overrides" in result.stdout
  assert json.loads(result.stdout.splitlines()[-1]) == json.loads(writable.stdout.splitlines()[-1])
  assert files(workdir) == before


@pytest.mark.parametrize("experiment, argument, message", [
    ("classification.py:data=x", "regression=on",
     "Config argument regression='on' is not a yes/no value; give regression=true or regression=false."),
    ("multiple_choice.py:data=x", "choices=four", "Config argument choices='four' is not an int; e.g. choices=4.")])
def test_an_experiment_argument_of_the_wrong_type_is_refused(experiment, argument, message):
  """A value that is not of the argument's type (`regression=on`) is refused, not read as false or a default."""
  result = subprocess.run([sys.executable, "-m", "albert_jax.main", f"--config=experiments/{experiment},{argument}",
                           "--mode=describe"], capture_output=True, text=True, cwd=REPO)
  assert result.returncode == 1 and message in result.stderr, result.stderr


def test_yes_no_experiment_arguments():
  parsed = common.parse_arg("a,b=no,c=TRUE,d=0", a=False, b=True, c=False, d=True)
  assert (parsed.a, parsed.b, parsed.c, parsed.d) == (True, False, True, False)


@pytest.mark.tpu
def test_a_cpu_run_with_the_tpu_compiler_installed_prints_no_libtpu_host_errors(tmp_path):
  """With the `tpu` extra on a host without TPU chips, jax loads libtpu, which asked the cloud metadata server what
  this host is and printed "could not determine TPU accelerator type" and an "unexpected worker hostname" error
  before the run fell back to the CPU."""
  require_module("libtpu", extra="tpu")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS" and not k.startswith("TPU_")}
  result = subprocess.run([sys.executable, "-m", "albert_jax.main", "--config=experiments/pretrain_tiny.py:synthetic",
                           f"--workdir={tmp_path}", *SMALL_RUN, "--config.train.num_train_steps=1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr
  assert "step 1/1" in result.stderr
  assert "TPU" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_a_collapsed_bucket_url_is_refused_before_anything_is_written(tmp_path):
  """`gs:/bucket/run` (one slash) is refused before the workdir lock could make a local `gs:` folder."""
  workdir = f"{tmp_path}/gs:/bucket/run"
  result = cli(workdir, *SMALL_RUN)
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: {workdir!r} is a gs:// URL whose '//' was collapsed (os.path.abspath or normpath do that): pass the "
      "URL as gs://BUCKET/PATH.")
  assert os.listdir(tmp_path) == []
