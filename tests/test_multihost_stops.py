"""Two-process jobs: a preemption notice (SIGTERM) or a Ctrl-C that reaches one process, or each at another time,
stops every process at one agreed step, saved, with no process left hanging; a checkpoint resumes on another
process count, exactly where the loader's position allows it, else is refused in one line (neither called
unreadable nor moved aside)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from albert_jax import checkpointing, data_states
from data_pipeline.tiny import ensure_tiny_dataset
from tests.helpers import REPO, SMALL_RUN, assert_trees_equal, final_params, logged, pretrain_cli
from tests.processes import communicate_all, free_port

# A constant learning rate after warm-up (poly_power 0): the schedule does not depend on num_train_steps, so a run
# stopped on the way and resumed with another step count can be compared with one run straight to that count.
RUN = [*SMALL_RUN, "--config.train.poly_power=0", "--config.checkpoint.every=100000"]


def cli(*args, **kwargs):
  """`pretrain_cli`, compiling fast: this module's runs are compared only with one another."""
  return pretrain_cli(*args, fast_compile=True, **kwargs)


@pytest.fixture
def launched():
  """Every process the test launched; those still running at its end (a hung job) are killed."""
  procs = []
  yield procs
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.wait()


def launch(launched, workdir, *overrides, processes=2, devices=1, config="experiments/pretrain_tiny.py:synthetic"):
  port = free_port()
  procs = [cli(workdir, *overrides, f"--coordinator_address=localhost:{port}", f"--num_processes={processes}",
               f"--process_id={i}", devices=devices, config=config, wait=False) for i in range(processes)]
  launched.extend(procs)
  return procs


def last_logged_step(workdir) -> int:
  try:
    lines = open(workdir / "metrics.jsonl").read().splitlines()
  except FileNotFoundError:
    return 0
  steps = [json.loads(line)["step"] for line in lines if line.endswith("}")]
  return max(steps, default=0)


def wait_for_step(workdir, step, procs, timeout=300):
  deadline = time.time() + timeout
  while last_logged_step(workdir) < step:
    assert all(p.poll() is None for p in procs) and time.time() < deadline, communicate_all(procs, timeout=5)
    time.sleep(0.1)


def stopped_at(finished, workdir, step: int) -> None:
  """`workdir`: a copy of the finished run's as it was when that run stopped after saving `step` (its later
  checkpoints and log records removed)."""
  shutil.copytree(finished, workdir)
  for checkpoint in (workdir / "checkpoints").iterdir():
    if int(checkpoint.name) > step:
      shutil.rmtree(checkpoint)
  lines = (workdir / "metrics.jsonl").read_text().splitlines(keepends=True)
  (workdir / "metrics.jsonl").write_text("".join(line for line in lines if json.loads(line)["step"] <= step))


# How each launch is stopped once it has trained two steps: the signal, the process it goes to, and the process it
# goes to 0.5 s later (a pod's hosts get their notices at different steps).
STOPS = {"SIGTERM to process 1 only": (signal.SIGTERM, 1, None),
         "SIGTERM to process 0, then to process 1": (signal.SIGTERM, 0, 1),
         "Ctrl-C to process 0 only": (signal.SIGINT, 0, None)}


@pytest.mark.slow
def test_a_stop_reaching_the_processes_apart_saves_one_agreed_step_and_the_run_resumes_exactly(tmp_path, launched):
  run, saved = tmp_path / "run", 0
  cached = [*RUN, f"--config.compilation_cache_dir={tmp_path / 'compilation_cache'}"]  # serves the straight run too
  for name, (signum, first, then) in STOPS.items():
    procs = launch(launched, run, *cached, "--config.train.num_train_steps=100000")
    wait_for_step(run, saved + 2, procs)
    procs[first].send_signal(signum)
    if then is not None:
      time.sleep(0.5)
      procs[then].send_signal(signum)
    outputs = communicate_all(procs, timeout=180)
    codes = [130 if signum == signal.SIGINT and i == first else 0 for i in range(2)]
    assert [p.returncode for p in procs] == codes, (name, outputs)
    saved = checkpointing.Checkpointer(str(run / "checkpoints"), 1, 1).latest_step()
    for i, output in enumerate(outputs):
      said = "Interrupted" if codes[i] else "Preemption"
      assert f"{said}: saved step {saved} in" in output and "Traceback" not in output, (name, output)
  finish = [*cached, f"--config.train.num_train_steps={saved + 2}"]
  procs = launch(launched, run, *finish)
  outputs = communicate_all(procs, timeout=300)
  assert all(p.returncode == 0 for p in procs) and f"Resumed from step {saved}" in outputs[0], outputs
  procs = launch(launched, tmp_path / "straight", *finish)
  outputs = communicate_all(procs, timeout=300)
  assert all(p.returncode == 0 for p in procs), outputs
  assert final_params(tmp_path / "straight")[0] == final_params(run)[0] == saved + 2
  assert_trees_equal(final_params(tmp_path / "straight")[1], final_params(run)[1])
  assert logged(tmp_path / "straight")[saved + 2] == logged(run)[saved + 2]


@pytest.mark.slow
def test_a_checkpoint_resumes_exactly_on_another_process_count(tmp_path, launched):
  """Synthetic data's position is the step, the same on every process: 1 -> 2 -> 1 processes (2 devices in all)
  gives the losses of one process all along. The 1-process checkpoint at step 2 is the reference run's own, its
  later steps removed."""
  # One compilation cache: the last launch takes the reference's compiled step from it.
  settings = [*RUN, "--config.checkpoint.every=2", "--config.checkpoint.keep=3",
              f"--config.compilation_cache_dir={tmp_path / 'compilation_cache'}"]
  reference = cli(tmp_path / "one", *settings, "--config.train.num_train_steps=6", devices=2)
  assert reference.returncode == 0, reference.stderr
  run = tmp_path / "changing"
  stopped_at(tmp_path / "one", run, 2)
  procs = launch(launched, run, *settings, "--config.train.num_train_steps=4")
  outputs = communicate_all(procs, timeout=300)
  assert all(p.returncode == 0 for p in procs), outputs
  assert (f"Step 2 in {run / 'checkpoints'} was written by 1 process and this run has 2; the data position is the "
          "same on every process, so the run continues exactly.") in outputs[0]
  last = cli(run, *settings, "--config.train.num_train_steps=6", devices=2)
  assert last.returncode == 0, last.stderr
  assert "Step 4 in" in last.stdout and "was written by 2 processes and this run has 1" in last.stdout
  assert not list((run / "checkpoints").glob("*.unreadable*"))
  np.testing.assert_allclose([logged(run)[s] for s in range(1, 7)], [logged(tmp_path / "one")[s] for s in range(1, 7)],
                             rtol=1e-5)


@pytest.mark.slow
def test_a_per_process_data_position_is_refused_on_another_process_count_in_one_line(tmp_path, launched):
  """Prepared (and the tiny) pretraining data: each process reads its own share of the documents, so its position
  means nothing on another process count. Refused, not called damaged or moved aside; resume_with_changes goes on
  with the data read from its start."""
  tiny = ["--config.model.hidden_size=64", "--config.model.intermediate_size=256", "--config.model.embedding_size=16",
          "--config.train.global_batch_size=8", "--config.data.max_seq_length=32",
          "--config.model.max_position_embeddings=32", "--config.data.max_predictions_per_seq=5",
          "--config.train.eval_every=0", "--config.log.every=1", "--config.checkpoint.every=2",
          f"--config.data.path={tmp_path / 'tiny'}"]
  ensure_tiny_dataset(str(tmp_path / "tiny"))  # built once, not by both processes at once
  run = tmp_path / "run"
  procs = launch(launched, run, *tiny, "--config.train.num_train_steps=2", config="experiments/pretrain_tiny.py")
  outputs = communicate_all(procs, timeout=300)
  assert all(p.returncode == 0 for p in procs), outputs
  refused = cli(run, *tiny, "--config.train.num_train_steps=3", config="experiments/pretrain_tiny.py", devices=2)
  assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
  assert refused.stderr.strip().splitlines()[-1] == (
      f"error: Step 2 in {run / 'checkpoints'} was written by 2 processes and this run has 1: the data loader keeps "
      "a position per process, which means nothing on another process count. Resume with 2 processes, or pass "
      "--config.resume_with_changes=True to continue the model from there with the data read from its start.")
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2"]
  allowed = cli(run, *tiny, "--config.train.num_train_steps=3", "--config.resume_with_changes=True",
                config="experiments/pretrain_tiny.py", devices=2)
  assert allowed.returncode == 0, allowed.stderr
  assert "so the data is read from its start (resume_with_changes)" in allowed.stdout
  assert final_params(run)[0] == 3


def test_loader_states_of_another_process_count_are_read_and_a_missing_one_is_damage(tmp_path):
  for i in range(2):
    (tmp_path / f"process_{i}-of-2.json").write_text(json.dumps({"step": 4}))
  assert data_states.read_data_states(str(tmp_path)) == data_states.DataStates(2, {0: {"step": 4}, 1: {"step": 4}})
  (tmp_path / "process_1-of-2.json").unlink()
  with pytest.raises(ValueError, match="lacks the loader state of process 1 of the 2 that wrote it"):
    data_states.read_data_states(str(tmp_path))


# Two processes, each with its own half of every weight (fsdp over the processes), so each reads its own shards.
SHARDED = [*RUN, "--config.mesh.shape=(('data', 1), ('fsdp', -1), ('tensor', 1))", "--config.checkpoint.every=2",
           "--config.checkpoint.keep=10"]


def _truncate_largest_file(directory) -> None:
  largest = max(directory.iterdir(), key=lambda p: p.stat().st_size)
  largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])


@pytest.mark.slow
def test_a_checkpoint_a_process_cannot_read_is_skipped_by_every_process_in_one_line_each(tmp_path, launched):
  """A loader state that one process cannot read made that process alone restore an older step while the others
  waited for it in the newest one's restore: the job hung. Array data that fails to read printed thousands of lines
  of dropped reads. Now every process skips each such step, saying so in a line, resumes the same older step, and
  the run ends exactly as one never damaged. One launch meets both faults: the loader state in the newest step, the
  array data in the one before."""
  reference, run = tmp_path / "reference", tmp_path / "damaged"
  cached = [*SHARDED, "--config.train.num_train_steps=6",
            f"--config.compilation_cache_dir={tmp_path / 'compilation_cache'}"]  # the reference's step serves both
  procs = launch(launched, reference, *cached)
  outputs = communicate_all(procs, timeout=300)
  assert all(p.returncode == 0 for p in procs), outputs
  shutil.copytree(reference, run)
  (run / "checkpoints" / "6" / "data" / "process_1-of-2.json").write_text("{garbage")
  _truncate_largest_file(run / "checkpoints" / "4" / "state" / "ocdbt.process_1" / "d")
  procs = launch(launched, run, *cached)
  outputs = communicate_all(procs, timeout=300)
  assert all(p.returncode == 0 for p in procs), outputs
  for output in outputs:
    for step in (6, 4):
      assert f"Checkpoint step {step} in {run / 'checkpoints'} cannot be read (" in output, output
    assert f"Resumed from step 2 in {run / 'checkpoints'}" in output, output
    assert "Exception ignored" not in output and "Traceback" not in output and len(output.splitlines()) < 40, output
  for step in (6, 4):
    assert len(list((run / "checkpoints").glob(f"{step}.unreadable.*"))) == 1, step
  assert_trees_equal(final_params(reference)[1], final_params(run)[1])


ONE_PROCESS_FAILS = """
import json, sys
import jax, numpy as np
import orbax.checkpoint as ocp
jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
from albert_jax import checkpointing
mesh = jax.make_mesh((2,), ("fsdp",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
make = lambda step: jax.make_array_from_callback((4,), sharding, lambda index: np.arange(4.0)[index] + step)
saver = checkpointing.Checkpointer(sys.argv[3], every=1, keep=5, async_save=False)
for step in (1, 2):
  saver.save(step, {"w": make(step)}, {"step": step})
saver.close()
if jax.process_index() == 0:  # this process alone cannot read step 2's arrays
  restore = ocp.StandardCheckpointHandler.restore
  def failing(self, directory, *args, **kwargs):
    if directory.parent.name == "2":
      raise OSError("injected read failure")
    return restore(self, directory, *args, **kwargs)
  ocp.StandardCheckpointHandler.restore = failing
ckpt = checkpointing.Checkpointer(sys.argv[3], every=1, keep=5, async_save=False)
target = {"w": jax.ShapeDtypeStruct((4,), np.float64 if jax.config.jax_enable_x64 else np.float32, sharding=sharding)}
step, (state, data) = ckpt.restore_newest_intact(lambda s: ckpt.restore(s, target), move_aside=True)
local = [np.asarray(shard.data).tolist() for shard in state["w"].addressable_shards]
print("RESULT", json.dumps([step, data.states, local]), flush=True)
ckpt.close()
"""


def test_arrays_that_one_process_alone_cannot_read_are_skipped_by_every_process(tmp_path, launched):
  """The agreement at the level of the arrays: process 0 alone fails to read step 2's. Before, process 1 restored
  step 2 while process 0 restored step 1 (each holding half of the weights, of two different steps), or the job
  hung; now both restore step 1."""
  script = tmp_path / "one_process_fails.py"
  script.write_text(ONE_PROCESS_FAILS)
  port = free_port()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu",
             PYTHONPATH=str(REPO))
  procs = [subprocess.Popen([sys.executable, str(script), f"localhost:{port}", str(i), str(tmp_path / "ckpt")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
  launched.extend(procs)
  outputs = communicate_all(procs, timeout=120)
  assert all(p.returncode == 0 for p in procs), outputs
  results = [json.loads(next(line for line in o.splitlines() if line.startswith("RESULT "))[7:]) for o in outputs]
  assert results == [[1, {"0": {"step": 1}}, [[1.0, 2.0]]], [1, {"1": {"step": 1}}, [[3.0, 4.0]]]], outputs
  assert "cannot be read (OSError: injected read failure); skipping it." in outputs[0]
  assert "cannot be read (UnreadableElsewhere: process 0 of 2 cannot read it (its log says why))" in outputs[1]
