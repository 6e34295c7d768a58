"""The memory check counts what the train step allocates (issue #57, class 8): after the shapes' lower bound, the
compiled step's own figure (XLA's memory analysis) on a CPU backend. A batch whose attention scores, kept for the
backward pass, are far beyond the layer inputs the lower bound counts passed it, then died allocating hundreds of
GB; it is refused in one line when the step is compiled, before the run writes anything. The memory both checks
compare with is what the process may use: `ulimit -v` or a cgroup limit below the physical memory counts."""
import os
import resource
import subprocess
import sys

import pytest

from albert_jax import compile_stats, engine, pretrain
from albert_jax import model_config as model_config_lib
from albert_jax.cli import experiment_config
from albert_jax.errors import InputError
from albert_jax.run import Run, refusal
from tests.helpers import REPO, cpu_env, pretrain_cli

GIB = 2**30
# 512-token rows of the tiny model: their layer inputs (4 x 512 x 64 float32, 512 KiB) are the lower bound's, their
# attention scores (4 layers x 4 heads x 512 x 512 float32, 16 MiB, and their softmax) what the step keeps too.
LONG_ROWS = ["--config=experiments/pretrain_tiny.py:synthetic", "--config.data.max_seq_length=512",
             "--config.model.max_position_embeddings=512", "--config.train.num_train_steps=1",
             "--config.train.eval_every=0"]


def config_with(rows: int):
  return experiment_config(["main", *LONG_ROWS, f"--config.train.global_batch_size={rows}"])


@pytest.fixture
def small_host(monkeypatch):
  """A host with 16 GiB, whatever this one has."""
  monkeypatch.setattr(model_config_lib, "host_memory", lambda: 16 * GIB)


@pytest.mark.slow  # three compiles of the step
def test_a_step_beyond_the_host_is_refused_by_its_compiled_figure_naming_about_the_largest_batch(small_host, tmp_path):
  """8,192 rows pass the shapes' count (about 4 GiB) and are refused by the compiled step's (its figure, exactly);
  the batch named passes both."""
  config = config_with(8192)
  s = engine.setup(config, pretrain.make_job(config))  # the shapes' lower bound passes
  compiled = s.lower_train_step().compile()
  step = compile_stats.memory_breakdown(compiled).total * 8
  state = compile_stats.per_device_bytes(s.abstract_state) * 8
  loader = 1024 * 8 * (512 * 3 * 4 + 20 * 3 * 4 + 4)  # ids, mask, types; masked positions, ids, weights; SOP label
  with pytest.raises(InputError) as refused:
    s.compile_train_step()
  message = str(refused.value)
  assert message.startswith(
      f"train.global_batch_size=8192 needs {(step + loader) / GIB:,.1f} GiB of this host's 16.0 GiB of memory (the "
      f"compiled train step's own count on 8 CPU device(s) {step / GIB:,.1f} GiB, of which the parameters and "
      f"optimizer state {state / GIB:,.1f} GiB; the loader's batch {loader / GIB:,.1f} GiB): about at most "), message
  assert message.endswith(" rows fit; lower --config.train.global_batch_size (a smaller train.micro_batch_size lowers "
                          "the step's temporaries).") and "\n" not in message
  fits = int(message.split("at most ")[1].split(" rows fit")[0].replace(",", ""))
  per_row = (step + loader - state) / 8192
  assert fits == (16 * GIB - state) // per_row // 8 * 8 and 0 < fits < 8192
  config = config_with(fits)
  engine.setup(config, pretrain.make_job(config)).compile_train_step()


@pytest.mark.slow
def test_a_run_whose_step_does_not_fit_is_refused_before_it_writes(small_host, tmp_path):
  """Refused once set-up opened the checkpoint folder, before config.json and provenance.json: the new workdir
  holds only what set-up writes, and is removed as `main` removes it."""
  with pytest.raises(InputError, match=r"^train.global_batch_size=8192 needs .*\(the compiled train step's own count"):
    with refusal.leaves_no_new_workdir(str(tmp_path / "run")):
      pretrain.train(config_with(8192), Run(str(tmp_path / "run")))
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_command_line_refuses_it_in_one_line_and_leaves_no_workdir(tmp_path):
  """On this host's own memory: a batch four times below what the shapes' lower bound allows."""
  lower_bound_row = 2 * (512 * 3 * 4 + 20 * 3 * 4 + 4) + 4 * 512 * 64 * 4
  rows = model_config_lib.host_memory() // lower_bound_row // 4 // 8 * 8
  result = pretrain_cli(tmp_path / "run", *LONG_ROWS[1:], f"--config.train.global_batch_size={rows}",
                        fast_compile=True)
  assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
  assert result.stderr.startswith(f"error: train.global_batch_size={rows} needs ") and \
      "the compiled train step's own count on 1 CPU device(s)" in result.stderr, result.stderr
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cgroup_v2, cgroup_v1, address_space, expected", [
    ("max", None, None, "physical"), (str(3 * GIB), None, None, 3 * GIB), (None, str(2**63 - 4096), None, "physical"),
    (None, str(5 * GIB), None, 5 * GIB), ("max", None, 2 * GIB, 2 * GIB), (str(3 * GIB), None, 4 * GIB, 3 * GIB)])
def test_the_memory_is_the_least_of_the_host_s_ulimit_v_and_a_container_s_cgroup_limit(
    tmp_path, monkeypatch, cgroup_v2, cgroup_v1, address_space, expected):
  """What the memory checks compare with: the physical memory, unless `ulimit -v` or the cgroup (v2 memory.max, v1
  memory.limit_in_bytes, whose "no limit" is a number beyond any host) allows less."""
  physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  files = []
  for name, limit in (("memory.max", cgroup_v2), ("memory.limit_in_bytes", cgroup_v1)):
    files.append(tmp_path / name)
    if limit is not None:
      files[-1].write_text(limit + "\n")
  monkeypatch.setattr(model_config_lib, "CGROUP_MEMORY_LIMITS", tuple(str(f) for f in files))
  real = resource.getrlimit
  monkeypatch.setattr(resource, "getrlimit", lambda which: (address_space or resource.RLIM_INFINITY, -1)
                      if which == resource.RLIMIT_AS else real(which))
  assert model_config_lib.host_memory() == min(physical, physical if expected == "physical" else expected)


def test_a_batch_beyond_ulimit_v_is_refused_naming_the_limit_and_leaves_no_workdir(tmp_path):
  """Under `ulimit -v 8000000` (7.6 GiB), 100,000 rows of the tiny model (the shapes' count alone about 12.5 GiB)
  are refused in one line naming the limit, where the host's physical memory (or a larger limit) let them pass."""
  limit = 8_000_000 * 1024
  cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
  result = subprocess.run([sys.executable, "-m", "albert_jax.main", "--config=experiments/pretrain_tiny.py:synthetic",
                           f"--workdir={tmp_path / 'run'}", "--config.train.global_batch_size=100000"],
                          cwd=REPO, env=cpu_env(1, True), capture_output=True, text=True, timeout=600, preexec_fn=cap)
  memory = min(limit, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
  assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
  assert result.stderr.startswith("error: train.global_batch_size=100000 needs ") and (
      f"of this host's {memory / GIB:,.1f} GiB of memory" in result.stderr), result.stderr
  assert not (tmp_path / "run").exists()
