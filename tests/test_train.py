"""Training engine: optimizer vs the reference formula, accumulation, resume after kill -9, SIGTERM, 1 vs 8 devices,
2 processes vs 1, and clear errors for bad configs."""
import functools
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import types
import time
import traceback
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from albert_jax import checkpointing, compilation_cache, compile_stats, engine, optim, pretrain
from albert_jax.model import AlbertForPreTraining
from albert_jax.model_config import model_config_for, model_config_from
from experiments import common
from tests.helpers import (REPO, SMALL_RUN, assert_trees_equal, final_params, logged, prepared_run, pretrain_cli,
                           small_tmpfs)
from tests.processes import Launch, communicate_all, free_port, records

# XLA at -O0 (tests.helpers.cpu_env): the runs here are compared only with one another, or with values that do not
# depend on how a step is compiled.
cli = functools.partial(pretrain_cli, fast_compile=True)


# ------------------------------------------------------------------------------------------------ optimizer

def train_config(**overrides):
  c = common.pretraining_config("tiny").train
  c.update(dict(learning_rate=0.01, warmup_steps=0, num_train_steps=100, weight_decay=0.01, clip_grad_norm=1.0))
  c.update(overrides)
  return c


def toy_params():
  rng = np.random.default_rng(0)
  return {"dense": {"kernel": rng.normal(size=(3, 4)).astype(np.float32),
                    "bias": rng.normal(size=(4,)).astype(np.float32)},
          "LayerNorm": {"scale": rng.normal(size=(4,)).astype(np.float32)},
          "zero": {"kernel": np.zeros((2, 2), np.float32)}}


PATHS = [("dense", "kernel"), ("dense", "bias"), ("LayerNorm", "scale"), ("zero", "kernel")]


def reference_update(params, grads, m, v, step, c, lamb):
  """google-research/albert lamb_optimizer.py / optimization.py AdamWeightDecayOptimizer, in NumPy, over
  flat {path: array} dicts."""
  norm = np.sqrt(sum((g ** 2).sum() for g in grads.values()))
  scale = min(1.0, c.clip_grad_norm / norm)
  lr = c.learning_rate * (1 - step / c.num_train_steps)
  out_p, out_m, out_v = {}, {}, {}
  for path in PATHS:
    p, g = params[path], grads[path] * scale
    mm = c.b1 * m[path] + (1 - c.b1) * g
    vv = c.b2 * v[path] + (1 - c.b2) * g * g
    u = mm / (np.sqrt(vv) + c.eps)
    excluded = path[0] == "LayerNorm" or path[1] == "bias"
    if not excluded:
      u = u + c.weight_decay * p
    ratio = 1.0
    if lamb and not excluded:
      w_norm, u_norm = np.linalg.norm(p), np.linalg.norm(u)
      ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
    out_p[path], out_m[path], out_v[path] = p - lr * ratio * u, mm, vv
  return out_p, out_m, out_v


@pytest.mark.parametrize("name", ["lamb", "adamw"])
def test_two_updates_match_the_reference_formula(name):
  c = train_config(optimizer=name)
  tx, _ = optim.create_optimizer(c)
  params = toy_params()
  state = tx.init(params)
  rng = np.random.default_rng(1)
  m, v = {k: 0.0 for k in PATHS}, {k: 0.0 for k in PATHS}
  ref = {k: params[k[0]][k[1]] for k in PATHS}
  for step in range(2):
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32) * 3, params)  # norm > 1: clipped
    ref, m, v = reference_update(ref, {k: grads[k[0]][k[1]] for k in PATHS}, m, v, step, c, lamb=name == "lamb")
    updates, state = tx.update(grads, state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
    for (a, b), expected in ref.items():
      np.testing.assert_allclose(params[a][b], expected, rtol=2e-5, atol=1e-7)


def test_optax_lamb_option_differs_by_bias_correction():
  params = toy_params()
  grads = jax.tree.map(lambda x: np.full(x.shape, 0.1, np.float32), params)
  faithful, _ = optim.create_optimizer(train_config(optimizer="lamb"))
  modern, _ = optim.create_optimizer(train_config(optimizer="optax_lamb"))
  a, _ = faithful.update(grads, faithful.init(params), params)
  b, _ = modern.update(grads, modern.init(params), params)
  assert not np.allclose(a["dense"]["bias"], b["dense"]["bias"])


def test_schedule_warms_up_then_decays_from_step_zero():
  schedule = optim.learning_rate_schedule(0.00176, 3125, 125_000)
  assert float(schedule(0)) == 0.0
  assert float(schedule(1562)) == pytest.approx(0.00176 * 1562 / 3125, rel=1e-6)
  # At the end of warmup the rate drops to lr·(1 - W/T) = 0.975·lr, as the original.
  assert float(schedule(3125)) == pytest.approx(0.00176 * 0.975, rel=1e-6)
  assert float(schedule(125_000)) == 0.0
  assert float(schedule(200_000)) == 0.0


def test_decay_mask_on_the_real_parameter_tree():
  params = nn.unbox(jax.eval_shape(lambda r: AlbertForPreTraining(model_config_for("tiny")).init(
      r, jnp.ones((1, 4), jnp.int32))["params"], jax.random.key(0)))
  flat = {"/".join(k.key for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(optim.decay_mask(params))[0]}
  assert flat["albert/embeddings/word_embeddings/embedding"] is True      # embeddings ARE decayed
  assert flat["albert/encoder/group_0/inner_0/attention/query/kernel"] is True
  assert flat["albert/encoder/group_0/inner_0/attention/query/bias"] is False
  assert flat["albert/encoder/group_0/inner_0/ffn/LayerNorm/scale"] is False
  assert flat["albert/embeddings/LayerNorm/bias"] is False
  assert flat["predictions/bias"] is False
  assert flat["sop_classifier/kernel"] is True


# ------------------------------------------------------------------------------------------------ the step

def tiny_setup(devices, micro_batch, mesh_shape=(("data", -1), ("fsdp", 1), ("tensor", 1))):
  config = common.pretraining_config("tiny")
  config.model.update(vocab_size=300, max_position_embeddings=16, dtype="float32", remat_policy="none")
  config.data.update(max_seq_length=16, max_predictions_per_seq=4)
  config.train.update(global_batch_size=16, micro_batch_size=micro_batch, warmup_steps=0, learning_rate=0.01)
  config.mesh.shape = mesh_shape
  return config, engine.setup(config, pretrain.make_job(config), devices=devices)


@pytest.fixture(scope="module")
def one_device_step():
  """What the accumulating steps are compared with, taken once: the batch (unequal weights per micro step and
  per device: the normaliser must be global), the state before, and the params and metrics of a step over all 16
  rows at once on one device."""
  config, full = tiny_setup(jax.devices()[:1], 0)
  batch = pretrain.synthetic_batch(config.data, 16, 300, (3, 0))
  batch["masked_lm_weights"][:5, 2:] = 0  # rows 0, 2, 4 go to micro batch 0 of 2, rows 1, 3 to micro batch 1
  state = full.create_state(jax.random.key(0))
  state_before = jax.tree.map(np.array, state)  # copies: the step donates `state`
  with full.context():
    after, metrics = full.train_step(state, full.global_batch(batch), jax.random.key(5))
  return batch, state_before, jax.tree.map(np.asarray, after.params), jax.tree.map(np.asarray, metrics)


def assert_accumulates_like_one_step(one_device_step, accumulating: engine.Setup):
  """Takes the reference's state and batch through `accumulating`'s step, compiled once, and checks loss, gradient
  norm and params against the reference's; returns that executable."""
  batch, state_before, params, metrics = one_device_step
  compiled = accumulating.lower_train_step().compile()
  with accumulating.context():
    after, accumulated = compiled(jax.device_put(state_before, accumulating.state_shardings),
                                  accumulating.global_batch(batch), jax.random.key(5))
  np.testing.assert_allclose(metrics["loss"], accumulated["loss"], rtol=1e-6)
  np.testing.assert_allclose(metrics["grad_norm"], accumulated["grad_norm"], rtol=1e-5)
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(after.params), strict=True):
    np.testing.assert_allclose(x, y, atol=2e-6)
  return compiled


def test_accumulation_two_halves_equals_one_full_batch(one_device_step):
  _, halves = tiny_setup(jax.devices()[:1], 8)
  assert halves.split.accumulation_steps == 2
  assert_accumulates_like_one_step(one_device_step, halves)


@pytest.mark.parametrize("data, fsdp, tensor", [(8, 1, 1), (4, 2, 1), (4, 1, 2), (2, 2, 2)])
def test_accumulation_over_data_parallel_devices_reduces_the_gradients_once(one_device_step, data, fsdp, tensor):
  """Each device sums its own micro steps; the data axis all-reduces once per step, not at every micro step (what
  the partitioner did). fsdp and tensor keep their own collectives inside the step. With both split, the CPU
  partitioner aborts on the once-per-step form, so there the step keeps the partitioner's (same numbers)."""
  _, accumulating = tiny_setup(jax.devices(), 1, (("data", data), ("fsdp", fsdp), ("tensor", tensor)))
  assert accumulating.split.accumulation_steps == 16 // (data * fsdp) > 1
  compiled = assert_accumulates_like_one_step(one_device_step, accumulating)
  if (fsdp, tensor) == (2, 2):
    return  # the partitioner's form, checked for its numbers only (its groups of 2 are not told apart by size)
  over_data = [(c.bytes, c.executions) for c in compile_stats.collective_stats(compiled, jax.devices()).collectives
               if c.kind == "all-reduce" and c.group_size == data]
  gradient_bytes = compile_stats.per_device_bytes(accumulating.abstract_state.params)
  assert all(executions == 1 for _, executions in over_data), over_data  # the step's scalars and the gradients
  # About one gradient's bytes (with fsdp a few small leaves are reduced over data and fsdp together).
  assert 0.9 * gradient_bytes <= sum(size for size, _ in over_data) <= gradient_bytes + 64, (over_data, gradient_bytes)


# ------------------------------------------------------------------------------------------------ through the CLI

@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
  """One persistent compilation cache for the runs of this module whose claims are not about compiling: a run that
  compiles a step another one compiled (same settings, same devices) takes it from there."""
  return tmp_path_factory.mktemp("compilation_cache")


def reference_flags(shared_cache: Path) -> list[str]:
  """8 steps of SMALL_RUN with checkpoints at 2, 4, 6 and 8 and evaluations at 4 and 8, the step compiled once per
  mesh into `shared_cache`."""
  return [*SMALL_RUN, "--config.train.num_train_steps=8", "--config.checkpoint.every=2", "--config.checkpoint.keep=10",
          "--config.train.eval_every=4", "--config.train.eval_batches=2",
          f"--config.compilation_cache_dir={shared_cache}"]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, shared_cache):
  """(workdir, command-line flags, finished process) of `reference_flags` on one device, uninterrupted: what runs
  interrupted or damaged on the way, or on other meshes, must end as, and a finished run to run again (in a copy:
  `copy_of`)."""
  workdir = tmp_path_factory.mktemp("reference") / "run"
  flags = reference_flags(shared_cache)
  result = cli(workdir, *flags)
  assert result.returncode == 0, result.stdout + result.stderr
  return workdir, flags, result


def copy_of(reference_run, path: Path) -> Path:
  shutil.copytree(reference_run[0], path)
  return path


@pytest.mark.slow
def test_cli_run_writes_metrics_config_and_checkpoints(reference_run):
  workdir, _, result = reference_run
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  keys = {"step", "loss", "mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy", "learning_rate", "grad_norm",
          "examples_per_sec", "tokens_per_sec", "step_time"}
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 9)) and keys <= set(rows[0])
  assert [r["step"] for r in rows if "eval/mlm_loss" in r] == [4, 8]
  assert json.load(open(workdir / "config.json"))["model"]["vocab_size"] == 300
  assert sorted(checkpointing.Checkpointer(str(workdir / "checkpoints"), 1, 1).all_steps()) == [2, 4, 6, 8]
  assert "step 8/8" in result.stderr and "eta" in result.stderr


@pytest.mark.slow
def test_resume_after_kill_9_is_bit_identical(reference_run, tmp_path):
  reference, steps, _ = reference_run
  # Kill -9 as soon as step 4 is complete (mid-run, possibly mid-save of a later step), then resume.
  victim = cli(tmp_path / "killed", *steps, "--config.checkpoint.async_save=true", wait=False)
  ckpt_dir = tmp_path / "killed" / "checkpoints"
  deadline = time.time() + 300
  while not (ckpt_dir / "4" / "_CHECKPOINT_METADATA").exists() and victim.poll() is None:
    assert time.time() < deadline
    time.sleep(0.05)
  victim.send_signal(signal.SIGKILL)
  victim.wait()
  interrupted_at = checkpointing.Checkpointer(str(ckpt_dir), 1, 1).latest_step()
  assert interrupted_at is not None and interrupted_at < 8
  resumed = cli(tmp_path / "killed", *steps)
  assert resumed.returncode == 0, resumed.stderr
  assert f"Resumed from step {interrupted_at}" in resumed.stdout
  step_a, params_a = final_params(reference)
  step_b, params_b = final_params(tmp_path / "killed")
  assert step_a == step_b == 8
  assert_trees_equal(params_a, params_b)
  assert logged(reference)[8] == logged(tmp_path / "killed")[8]


@pytest.mark.slow
@pytest.mark.parametrize("signum, exit_code, said", [(signal.SIGTERM, 0, "Preemption"),
                                                     (signal.SIGINT, 130, "Interrupted")])
def test_sigterm_or_ctrl_c_saves_and_exits_cleanly(shared_cache, tmp_path, signum, exit_code, said):
  """A preemption notice or a first Ctrl-C saves at the next step boundary and exits, with no traceback (no
  KeyboardInterrupt traceback with nothing saved)."""
  proc = cli(tmp_path, *SMALL_RUN, "--config.train.num_train_steps=100000", "--config.checkpoint.every=100000",
             f"--config.compilation_cache_dir={shared_cache}", wait=False)
  deadline = time.time() + 300
  while not (tmp_path / "metrics.jsonl").exists() or len(open(tmp_path / "metrics.jsonl").readlines()) < 2:
    assert proc.poll() is None and time.time() < deadline
    time.sleep(0.1)
  proc.send_signal(signum)
  output, _ = proc.communicate(timeout=120)
  assert proc.returncode == exit_code, output
  saved = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), 1, 1).latest_step()
  assert saved is not None and saved >= 2
  assert f"{said}: saved step {saved}" in output and "Traceback" not in output


def test_rerunning_a_finished_run_says_so_without_compiling(reference_run, tmp_path):
  run, flags = copy_of(reference_run, tmp_path / "run"), reference_run[1]
  config_before = (run / "config.json").read_text()
  for steps in (8, 7):  # the same command, and a smaller step count
    again = cli(run, *flags, f"--config.train.num_train_steps={steps}")
    assert again.returncode == 0, again.stderr
    assert (f"Nothing to train: {run} holds step 8 and train.num_train_steps={steps}; raise "
            "--config.train.num_train_steps to train further.") in again.stdout
    assert "Compiling the train step" not in again.stdout + again.stderr
  assert (run / "config.json").read_text() == config_before


def prepare_book(shared_data, output_dir, characters: int, *flags: str) -> None:
  """The first `characters` of a public-domain book, prepared with ALBERT's tokenizer into `output_dir`."""
  text = output_dir.parent / f"{output_dir.name}.txt"
  text.write_text((shared_data / "corpus" / "gutenberg_01952_yellow_wallpaper.txt").read_text()[:characters])
  prepared = subprocess.run([sys.executable, "-m", "data_pipeline.prepare", f"--input={text}", "--format=paragraphs",
                             f"--spm_model={shared_data / 'albert_spm' / 'spiece.model'}",
                             f"--output_dir={output_dir}", *flags], capture_output=True, text=True, cwd=REPO)
  assert prepared.returncode == 0, prepared.stderr


@pytest.mark.shared_data
def test_prepared_data_without_held_out_documents_or_of_another_vocabulary_is_refused_at_start_up(
    shared_data, shared_cache, tmp_path):
  """Both refused at start-up, before the workdir is written: data with no held-out documents (whose first
  evaluation would fail at train.eval_every steps, before that step's checkpoint, on every rerun) and data of
  another vocabulary."""
  prepare_book(shared_data, tmp_path / "prepared", 100_000, "--eval_fraction=0")
  data = [*prepared_run(tmp_path / "prepared"), "--config.train.num_train_steps=3",
          f"--config.compilation_cache_dir={shared_cache}"]
  refused = cli(tmp_path / "run", *data, "--config.train.eval_every=1", config="experiments/pretrain_tiny.py")
  assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
  assert refused.stderr.strip().splitlines()[-1] == (
      f"error: The preparation at {tmp_path / 'prepared'} has no held-out ('eval') documents, and "
      "train.eval_every=1 evaluates on them. Prepare the data with a larger --eval_fraction (or more documents), "
      "or pass --config.train.eval_every=0 to train without held-out evaluation.")
  assert not (tmp_path / "run").exists()
  other_vocabulary = cli(tmp_path / "run", *data, "--config.train.eval_every=0", "--config.model.vocab_size=300",
                         config="experiments/pretrain_tiny.py")
  assert other_vocabulary.returncode == 1, other_vocabulary.stderr
  assert other_vocabulary.stderr.strip().splitlines()[-1] == (
      f"error: The data at {str(tmp_path / 'prepared')!r} was tokenized with a 30000-piece vocabulary but the model "
      "has vocab_size=300; set --config.model.vocab_size=30000 or prepare the data with the model's tokenizer.")
  assert not (tmp_path / "run").exists()
  trained = cli(tmp_path / "run", *data, "--config.train.eval_every=0", config="experiments/pretrain_tiny.py")
  assert trained.returncode == 0, trained.stderr


def test_the_bundled_corpus_with_another_vocabulary_is_refused_before_anything_is_built(tmp_path):
  """Refused before the run makes checkpoints/ or compilation_cache/ in its workdir or builds the corpus into it."""
  refused = cli(tmp_path / "run", "--config.model.vocab_size=300", config="experiments/pretrain_tiny.py")
  assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
  assert refused.stderr.strip().splitlines()[-1] == (
      "error: The bundled tiny corpus has a 4000-piece vocabulary but the model has vocab_size=300; set "
      "--config.model.vocab_size=4000, or train on data.kind=synthetic or prepared data of that vocabulary.")
  assert not (tmp_path / "run").exists()


@pytest.mark.shared_data
def test_resuming_on_data_prepared_again_in_the_same_folder_is_refused(shared_data, shared_cache, tmp_path):
  """The run recorded its preparation's manifest (`provenance`): a resume on whatever the folder holds now is
  refused before anything is compiled; with the flag the saved loader position, which belongs to one preparation,
  is not applied to it."""
  data = tmp_path / "prepared"
  run = [*prepared_run(data), "--config.train.eval_every=0", "--config.checkpoint.every=2",
         "--config.train.num_train_steps=3", f"--config.compilation_cache_dir={shared_cache}"]
  prepare_book(shared_data, data, 20_000)
  first = cli(tmp_path / "run", *run, config="experiments/pretrain_tiny.py")
  assert first.returncode == 0, first.stderr
  shutil.rmtree(tmp_path / "run" / "checkpoints" / "3")  # as if stopped after step 2 (its step compiled)
  shutil.rmtree(data)
  prepare_book(shared_data, data, 120_000)  # other inputs, same folder
  refused = cli(tmp_path / "run", *run, config="experiments/pretrain_tiny.py")
  assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
  assert re.fullmatch(rf"error: Workdir {tmp_path / 'run'} was made from other inputs: the prepared data "
                      rf"\({data}/manifest.json: sha256 \w{{12}} then, \w{{12}} now\) changed. Restore them, or pass "
                      r"--config.resume_with_changes=True to go on with these.",
                      refused.stderr.strip().splitlines()[-1])
  allowed = cli(tmp_path / "run", *run, "--config.resume_with_changes=True", config="experiments/pretrain_tiny.py")
  assert allowed.returncode == 0, allowed.stderr
  assert f"The data at {data} changed since the checkpoint; reading it from its start" in allowed.stdout
  assert [r["step"] for r in records(tmp_path / "run") if "loss" in r] == [1, 2, 3, 3]  # step 3 again, resumed


@pytest.fixture(scope="module")
def data_parallel_losses(tmp_path_factory, shared_cache):
  """{step: loss} of `reference_flags` on 8 devices along the data axis: what one device and other meshes must
  match."""
  workdir = tmp_path_factory.mktemp("data_parallel")
  result = cli(workdir, *reference_flags(shared_cache), devices=8)
  assert result.returncode == 0, result.stderr
  return logged(workdir)


@pytest.mark.slow
def test_eight_devices_give_the_same_losses_as_one(reference_run, data_parallel_losses):
  one = logged(reference_run[0])
  assert one.keys() == data_parallel_losses.keys() == set(range(1, 9))
  np.testing.assert_allclose([data_parallel_losses[s] for s in one], list(one.values()), rtol=1e-5)


@pytest.mark.slow
def test_fsdp_and_tensor_mesh_train_the_same_model(shared_cache, data_parallel_losses, tmp_path):
  mixed = cli(tmp_path, *reference_flags(shared_cache), "--config.mesh.shape=(('data', 2), ('fsdp', 2), ('tensor', 2))",
              devices=8)
  assert mixed.returncode == 0, mixed.stderr
  assert logged(tmp_path).keys() == data_parallel_losses.keys()
  np.testing.assert_allclose(list(logged(tmp_path).values()), list(data_parallel_losses.values()), rtol=1e-5)



@pytest.mark.slow
def test_two_processes_train_one_model_like_one_process(tmp_path):
  single = cli(tmp_path / "single", *SMALL_RUN, "--config.train.num_train_steps=3", devices=2)
  assert single.returncode == 0, single.stderr
  port = free_port()
  procs = [cli(tmp_path / "multi", *SMALL_RUN, "--config.train.num_train_steps=3",
               f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}",
               devices=1, wait=False) for i in range(2)]
  outputs = communicate_all(procs, timeout=600)
  assert all(p.returncode == 0 for p in procs), outputs
  multi, one = logged(tmp_path / "multi"), logged(tmp_path / "single")
  np.testing.assert_allclose([multi[s] for s in (1, 2, 3)], [one[s] for s in (1, 2, 3)], rtol=1e-5)
  assert_trees_equal(*[jax.tree.map(lambda x: np.round(x, 5), final_params(tmp_path / d)[1])
                       for d in ("single", "multi")])


@pytest.mark.slow
def test_two_processes_build_the_bundled_corpus_once_warm_start_and_evaluate(tmp_path):
  """Three things that failed with several processes: both built the bundled corpus into the same files at once
  (a rename of the other's temporary shard failed), and a warm start and `--mode=eval` put arrays restored on
  this host's device onto the other host's devices, a cross-host transfer that CPU backends refuse."""
  run = [*SMALL_RUN, "--config.model.vocab_size=4000", "--config.train.num_train_steps=2",
         "--config.train.eval_batches=1"]
  assert cli(tmp_path / "source", *run).returncode == 0

  def two_processes(*args):
    port = free_port()
    procs = [cli(tmp_path / "multi", *run, *args, f"--coordinator_address=localhost:{port}", "--num_processes=2",
                 f"--process_id={i}", config="experiments/pretrain_tiny.py", devices=1, wait=False)
             for i in range(2)]
    outputs = communicate_all(procs, timeout=600)
    assert all(p.returncode == 0 for p in procs), outputs
    return outputs

  trained = two_processes(f"--config.init_checkpoint={tmp_path / 'source'}")
  assert all(f"Warm start from {tmp_path / 'source'}; freshly initialised: none" in out for out in trained)
  assert (tmp_path / "multi" / "tiny_data" / "prepared" / "manifest.json").is_file()
  evaluated = [json.loads(out.strip().splitlines()[-1]) for out in two_processes("--mode=eval")]
  assert evaluated[0] == evaluated[1] and evaluated[0]["step"] == 2 and np.isfinite(evaluated[0]["mlm_loss"])


# ------------------------------------------------------------------------------------------------ bad input

def test_misspelt_config_key_is_named(tmp_path):
  result = cli(tmp_path, "--config.train.learnin_rate=0.1")
  assert result.returncode != 0 and "learnin_rate" in result.stderr


@pytest.mark.parametrize("cap, micro, accumulation", [(0, 16, 1), (4, 4, 4), (5, 4, 4), (3, 2, 8), (64, 16, 1)])
def test_the_micro_batch_cap_takes_the_largest_divisor_of_the_device_share(cap, micro, accumulation):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
  train = ml_collections.ConfigDict({"global_batch_size": 16, "micro_batch_size": 0, "max_micro_batch_size": cap})
  split = engine.batch_split(train, mesh, 1, 0)
  assert (split.micro_batch, split.accumulation_steps) == (micro, accumulation)
  train.micro_batch_size = 8  # an explicit micro batch wins
  assert engine.batch_split(train, mesh, 1, 0).micro_batch == 8


def test_fine_tuning_recipes_cap_the_micro_batch_by_size():
  from experiments import glue, race, squad_v1
  settings = lambda c: (c.train.max_micro_batch_size, c.model.remat_policy)
  assert [settings(glue.get_config(f"task=mnli,size={size}")) for size in ("tiny", "base", "large", "xxlarge")] == [
      (0, "none"), (16, "none"), (8, "none"), (2, "none")]
  assert settings(squad_v1.get_config("size=xxlarge")) == (2, "none")   # 2 x 384 tokens
  assert [settings(race.get_config(f"size={size}")) for size in ("base", "large", "xlarge", "xxlarge")] == [
      (4, "none"), (2, "none"), (1, "none"), (1, "dots_saveable")]      # 4 x 512 tokens an example


def test_the_micro_batch_cap_follows_the_runs_own_length():
  """The command line's data.max_seq_length sets the cap (and RACE's recomputation), not the recipe's 512; an
  explicit cap or remat policy stays as given."""
  from albert_jax.cli import experiment_config
  settings = lambda *args: (lambda c: (c.train.max_micro_batch_size, c.model.remat_policy))(
      experiment_config(["main", *args]))
  assert settings("--config=experiments/glue.py:task=rte,size=base", "--config.data.max_seq_length=128") == (
      64, "none")                                                       # 8192 tokens // 128
  assert settings("--config=experiments/glue.py:task=rte,size=xxlarge", "--config.data.max_seq_length=96") == (
      10, "none")                                                       # 1024 // 96
  assert settings("--config=experiments/race.py:size=xxlarge", "--config.data.max_seq_length=256") == (
      1, "none")                                                        # 4 x 256 = 1024 tokens: within the budget
  assert settings("--config=experiments/race.py:size=xxlarge", "--config.data.max_seq_length=384") == (
      1, "dots_saveable")                                               # 4 x 384 = 1536 > 1024
  assert settings("--config=experiments/glue.py:task=rte,size=base", "--config.data.max_seq_length=128",
                  "--config.train.max_micro_batch_size=0", "--config.model.remat_policy=full") == (0, "full")


def test_impossible_batch_split_fails_clearly(tmp_path):
  result = cli(tmp_path, *SMALL_RUN, "--config.train.global_batch_size=12", devices=8)
  assert result.returncode != 0
  assert "global_batch_size=12 is not divisible by the 8 data-parallel devices" in result.stderr
  result = cli(tmp_path, *SMALL_RUN, "--config.train.micro_batch_size=3")
  assert "must equal micro_batch_size=3" in result.stderr


def _truncate_largest_array_file(step_dir: Path) -> None:
  largest = max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])


CHECKPOINT_FAULTS = {
    "truncated array data": _truncate_largest_array_file,
    "deleted metadata": lambda step_dir: (step_dir / "state" / "_METADATA").unlink(),
    "garbled loader state": lambda step_dir: next((step_dir / "data").glob("process_0*.json")).write_text("{garbage"),
}


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_intact_one(reference_run, tmp_path):
  """Each fault damages one of the newest checkpoints: the resume skips all three (one it missed would be where it
  resumes, or what fails it), keeps each aside, and goes on from step 2 to the reference's step 8."""
  reference, steps, _ = reference_run
  run = copy_of(reference_run, tmp_path / "damaged")
  damaged_steps = dict(zip((8, 6, 4), CHECKPOINT_FAULTS))
  for step, name in damaged_steps.items():
    CHECKPOINT_FAULTS[name](run / "checkpoints" / str(step))
  resumed = cli(run, *steps)
  assert resumed.returncode == 0, resumed.stderr
  skipped = [line for line in resumed.stdout.splitlines() if line.endswith("; skipping it.")]
  assert [line.split()[2] for line in skipped] == ["8", "6", "4"], resumed.stdout
  assert "Resumed from step 2" in resumed.stdout
  for step, name in damaged_steps.items():
    assert len(list((run / "checkpoints").glob(f"{step}.unreadable.*"))) == 1, name  # kept for inspection
  assert_trees_equal(final_params(reference)[1], final_params(run)[1])
  unreadable = copy_of(reference_run, tmp_path / "unreadable")
  for step in (2, 4, 6, 8):  # nothing readable: one line naming each failure, and nothing moved aside
    CHECKPOINT_FAULTS["deleted metadata"](unreadable / "checkpoints" / str(step))
  refused = cli(unreadable, *steps)
  assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
  message = refused.stderr.strip().splitlines()[-1]
  assert message.startswith(f"error: No checkpoint in {unreadable / 'checkpoints'} can be read (step 8: ")
  assert all(f"step {step}: " in message for step in (6, 4, 2)), message
  assert sorted(p.name for p in (unreadable / "checkpoints").iterdir() if p.name[0].isdigit()) == ["2", "4", "6", "8"]


@pytest.mark.slow
def test_resuming_with_changed_settings_is_said_recorded_or_refused(reference_run, tmp_path):
  run, flags = copy_of(reference_run, tmp_path / "run"), reference_run[1]
  longer = cli(run, *flags, "--config.train.num_train_steps=9", "--config.log.every=3")
  assert longer.returncode == 0, longer.stderr
  assert ("Resuming at step 8 with changed settings: log.every: 1 -> 3, train.num_train_steps: 8 -> 9"
          in longer.stdout)
  assert json.loads((run / "config.8.json").read_text())["train"]["num_train_steps"] == 8
  reseeded = cli(run, *flags, "--config.train.num_train_steps=9", "--config.seed=7")
  assert reseeded.returncode != 0
  assert "with changed seed would not continue the same run" in reseeded.stderr
  assert "--config.resume_with_changes=True" in reseeded.stderr
  relu = cli(run, *flags, "--config.train.num_train_steps=9", "--config.model.hidden_act=relu")
  assert relu.returncode == 1 and "with changed model.hidden_act would not continue the same run" in relu.stderr
  forced = cli(run, *flags, "--config.train.num_train_steps=10", "--config.seed=7",
               "--config.resume_with_changes=True")
  assert forced.returncode == 0, forced.stderr
  assert "seed: 0 -> 7" in forced.stdout and (run / "config.9.json").exists()


@pytest.fixture
def small_disk(tmp_path):
  """A 3 MiB tmpfs: room for two checkpoints of the SMALL_RUN model, not three (needs root, as CI has)."""
  with small_tmpfs(tmp_path / "disk", "3m") as disk:
    yield disk


@pytest.mark.slow
def test_a_full_disk_stops_the_run_naming_the_last_good_checkpoint(small_disk):
  # Compiled as a user's run is: how far the step gets while a save fails is part of what this checks.
  result = pretrain_cli(small_disk / "run", *SMALL_RUN, "--config.train.num_train_steps=40", "--config.checkpoint.every=2",
               "--config.checkpoint.keep=20", "--config.checkpoint.async_save=true",
               "--config.compilation_cache_dir=none")
  assert result.returncode != 0
  last = checkpointing.Checkpointer(str(small_disk / "run" / "checkpoints"), 1, 1).latest_step()
  assert last is not None and last < 40
  message = result.stderr.strip().splitlines()[-1]
  assert message.startswith(("error: Saving a checkpoint failed", "error: Writing into")), result.stderr[-2000:]
  # Only that line: not orbax's ERROR records with their tracebacks, logged before the loop learns of the failure.
  assert [line for line in result.stderr.splitlines() if not line.startswith("step ")] == [message], result.stderr
  assert "RESOURCE_EXHAUSTED" in message or "No space left on device" in message
  assert f"The last good checkpoint is step {last} in" in message
  assert max(logged(small_disk / "run")) <= last + 2 * 2  # stopped within two save intervals, not at the end


@pytest.mark.slow
def test_a_second_run_in_a_busy_workdir_is_refused_and_a_killed_owner_does_not_block(shared_cache, tmp_path,
                                                                                    launches):
  steps = reference_flags(shared_cache)
  owner = Launch(cli(tmp_path, *SMALL_RUN, "--config.train.num_train_steps=1000000",
                     "--config.checkpoint.every=1000000", wait=False))  # killed mid-run with nothing saved
  launches.append(owner)
  deadline = time.time() + 300
  while not (tmp_path / "metrics.jsonl").exists() and owner.proc.poll() is None:
    assert time.time() < deadline
    time.sleep(0.05)
  owner.proc.send_signal(signal.SIGSTOP)  # paused mid-run, alive and holding the lock: the CPU is left to the others
  second = cli(tmp_path, *steps, "--config.train.learning_rate=0.5")
  assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
  assert f"is in use by a run on host {socket.gethostname()} (PID {owner.proc.pid}" in second.stderr
  port = free_port()  # a two-process run: process 1 must not wait in its first collective for a process 0 long gone
  procs = [cli(tmp_path, *steps, f"--coordinator_address=localhost:{port}", "--num_processes=2",
               f"--process_id={i}", wait=False) for i in range(2)]
  outputs = communicate_all(procs, timeout=120)
  assert [p.returncode for p in procs] == [1, 1], outputs
  assert outputs[0].strip().splitlines()[-1].startswith(f"error: Workdir {tmp_path} is in use by a run on host")
  assert outputs[1].strip().splitlines()[-1] == (
      f"error: Workdir {tmp_path} could not be locked by process 0 (its error says why); wait for the run using it, "
      "stop it, or use another --workdir.")
  owner.kill()
  assert json.loads((tmp_path / "config.json").read_text())["train"]["learning_rate"] != 0.5  # not overwritten
  next_run = cli(tmp_path, *steps)
  assert next_run.returncode == 0, next_run.stderr
  assert f"from a run that is no longer alive (host {socket.gethostname()}, PID {owner.proc.pid})" in next_run.stdout
  assert not (tmp_path / "run.lock").exists()


@pytest.mark.parametrize("field, value, message", [
    ("train.global_batch_size", 0, "train.global_batch_size=0 must be positive"),
    ("train.micro_batch_size", -2, "train.micro_batch_size=-2 must be positive"),
    ("train.num_train_steps", -1, "train.num_train_steps=-1 must be positive"),
    ("train.learning_rate", -0.1, "train.learning_rate=-0.1 is negative (that is gradient ascent)"),
    ("train.warmup_steps", -1, "train.warmup_steps=-1 must be 0 or positive"),
    ("checkpoint.every", 0, "checkpoint.every=0 must be positive"),
    ("checkpoint.keep", 0, "checkpoint.keep=0 would keep no checkpoint"),
    ("log.every", 0, "log.every=0 must be positive"),
])
def test_bad_training_values_are_refused_by_field(field, value, message):
  config = common.pretraining_config("tiny")
  config.train.num_train_steps, config.train.warmup_steps = 10, 2
  section, key = field.split(".")
  config[section][key] = value
  with pytest.raises(ValueError, match=re.escape(message)):
    engine.check_training_config(config)


def test_keep_zero_is_refused_before_anything_is_written(tmp_path):
  result = cli(tmp_path / "run", *SMALL_RUN, "--config.checkpoint.keep=0", "--config.train.num_train_steps=2")
  assert result.returncode != 0 and "checkpoint.keep=0 would keep no checkpoint" in result.stderr
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_restart_with_a_different_model_shape_is_refused(reference_run, tmp_path):
  again = cli(copy_of(reference_run, tmp_path / "run"), *reference_run[1], "--config.train.num_train_steps=10",
              "--config.model.hidden_size=32", "--config.model.intermediate_size=64")
  assert again.returncode != 0
  assert "model.hidden_size: saved 64 vs now 32" in again.stderr and "new --workdir" in again.stderr


def test_non_finite_loss_stops_and_names_the_last_checkpoint(tmp_path):
  result = cli(tmp_path, *SMALL_RUN, "--config.train.num_train_steps=6", "--config.checkpoint.every=2",
               "--config.train.learning_rate=1e30", "--config.train.clip_grad_norm=0", "--config.train.optimizer=adamw")
  assert result.returncode != 0
  assert "is not finite" in result.stderr and "last good checkpoint" in result.stderr


def saved_small_run_weights(path) -> dict:
  """Weights of SMALL_RUN's model, saved at `path` as a pretrained-weights directory; returns them."""
  from albert_jax.weights import store
  config = model_config_from(ml_collections.ConfigDict(
      {"model": {**common.model_config("tiny").to_dict(), "vocab_size": 300, "max_position_embeddings": 32}}))
  params = nn.unbox(AlbertForPreTraining(config).init(jax.random.key(7), jnp.ones((1, 4), jnp.int32))["params"])
  store.save_pretrained(str(path), config, params)
  return params


def test_warm_start_from_a_pretrained_directory(tmp_path):
  params = saved_small_run_weights(tmp_path / "init")
  result = cli(tmp_path / "run", *SMALL_RUN, "--config.train.num_train_steps=1",
               f"--config.init_checkpoint={tmp_path / 'init'}", "--config.train.learning_rate=0")
  assert result.returncode == 0, result.stderr
  assert_trees_equal(jax.tree.map(np.asarray, params), final_params(tmp_path / "run")[1])


def test_a_warm_start_of_another_shape_is_refused_before_anything_is_written(tmp_path):
  """Refused before the run makes checkpoints/ or compilation_cache/ in its new workdir."""
  saved_small_run_weights(tmp_path / "init")
  result = cli(tmp_path / "run", *SMALL_RUN, "--config.train.num_train_steps=1", "--config.model.embedding_size=16",
               f"--config.init_checkpoint={tmp_path / 'init'}")
  assert result.returncode == 1 and (f"init_checkpoint={tmp_path / 'init'} was saved with model.embedding_size=32 but "
                                    "this run has 16; ") in result.stderr, result.stderr
  assert not (tmp_path / "run").exists()


def test_a_restarted_run_takes_the_step_from_the_compilation_cache(tmp_path):
  run = [*SMALL_RUN, "--config.train.num_train_steps=4", "--config.checkpoint.every=2"]
  first = cli(tmp_path, *run)
  assert first.returncode == 0, first.stderr
  assert "Compiled the train step in" in first.stdout and "from the compilation cache" not in first.stdout
  assert os.listdir(tmp_path / "compilation_cache")
  shutil.rmtree(tmp_path / "checkpoints" / "4")  # as if stopped after step 2: the restart has steps to take
  second = cli(tmp_path, *run)
  assert second.returncode == 0, second.stderr
  assert "(from the compilation cache)" in second.stdout


def test_a_compilation_cache_entry_cut_short_is_removed_once_checked(tmp_path):
  """jax writes cache entries in place: one cut short by a kill -9 is removed, so the next compile rewrites it."""
  from jax._src import compilation_cache as jax_cache
  whole = jax_cache.compress_executable(b"an executable" * 1000)
  (tmp_path / "jit_a-1-cache").write_bytes(whole)
  (tmp_path / "jit_b-2-cache").write_bytes(whole[:len(whole) // 2])
  (tmp_path / "jit_c-3-cache").write_bytes(b"")
  assert compilation_cache.remove_unreadable_entries(str(tmp_path)) == ["jit_b-2-cache", "jit_c-3-cache"]
  assert sorted(os.listdir(tmp_path)) == [compilation_cache.CHECKED_ENTRIES, "jit_a-1-cache"]
  assert compilation_cache.remove_unreadable_entries(str(tmp_path)) == []
  stat = os.stat(tmp_path / "jit_a-1-cache")  # an entry checked before is not read again ...
  (tmp_path / "jit_a-1-cache").write_bytes(b"x" * stat.st_size)
  os.utime(tmp_path / "jit_a-1-cache", ns=(stat.st_atime_ns, stat.st_mtime_ns))
  assert compilation_cache.remove_unreadable_entries(str(tmp_path)) == []
  (tmp_path / "jit_a-1-cache").write_bytes(b"x")  # ... unless it changed
  assert compilation_cache.remove_unreadable_entries(str(tmp_path)) == ["jit_a-1-cache"]


def test_sentence_metrics_are_named_after_the_sentence_task(tmp_path):
  result = cli(tmp_path, *SMALL_RUN, "--config.train.num_train_steps=2", "--config.data.sentence_task=nsp",
               "--config.train.eval_every=2", "--config.train.eval_batches=3", "--config.data.kind=synthetic")
  assert result.returncode == 0, result.stderr
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  keys = set().union(*rows)
  assert {"nsp_accuracy", "nsp_loss", "eval/nsp_accuracy", "eval/nsp_loss", "eval/nsp_majority_accuracy"} <= keys
  # Chance on the held-out batches, by hand: the share of the commoner label in the 3 x 8 labels evaluated.
  data = ml_collections.ConfigDict(json.load(open(tmp_path / "config.json"))["data"])
  seed = json.load(open(tmp_path / "config.json"))["seed"] + 1  # the held-out batches' seed
  labels = np.concatenate([pretrain.synthetic_batch(data, 8, 300, (seed, i))["sentence_order_label"] for i in range(3)])
  evaluation = next(row for row in rows if "eval/nsp_majority_accuracy" in row)
  assert evaluation["eval/nsp_majority_accuracy"] == pytest.approx(max(labels.mean(), 1 - labels.mean()))
  assert labels.mean() != 0.5  # (the seed's labels are unbalanced: the max picks a side)
  assert not [k for k in keys if "sop" in k]
  assert "nsp_accuracy" in result.stderr  # the console line


@pytest.mark.slow
def test_the_default_run_says_what_it_does_before_the_first_step(tmp_path):
  """The README's first command, shortened: every long phase prints a line before the first step line."""
  cmd = [sys.executable, "-m", "albert_jax.main", "--config=experiments/pretrain_tiny.py", f"--workdir={tmp_path}",
         "--config.train.num_train_steps=2", "--config.log.every=1", "--config.train.eval_every=2",
         "--config.train.eval_batches=1"]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
  result = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=900)
  assert result.returncode == 0, result.stdout
  lines = result.stdout.splitlines()
  first_step = next(i for i, line in enumerate(lines) if line.startswith("step 1/2"))
  for phase in ("Building the bundled tiny dataset", "data_pipeline.train_spm (vocab 4,000): ",
                "data_pipeline.prepare: ", "documents read in", "Compiling the train step for 1 device (micro batch 64",
                "Compiled the train step in"):
    assert any(phase in line for line in lines[:first_step]), (phase, lines[:first_step])
  assert any(line.startswith("held-out eval at step 2: mlm_loss") for line in lines[first_step:])


def test_asyncio_reports_of_abandoned_orbax_writes_are_held_like_orbax_records():
  """The writes of a failed save are reported by asyncio ("Future exception was never retrieved") when they are
  collected, which can be after the SaveError line: asyncio's ERROR records are held with orbax's, dropped once a
  save failed and let through when none did; other records pass."""
  import asyncio.base_events
  def record(name, pathname, level=logging.ERROR):
    return logging.LogRecord(name, level, pathname, 1771, "Future exception was never retrieved", None, None)
  orbax_file = os.path.join("site-packages", "orbax", "checkpoint", "_src", "serialization", "serialization.py")
  released = []
  logging.getLogger("asyncio").addHandler(handler := logging.Handler())
  handler.emit = released.append
  try:
    errors = checkpointing._OrbaxErrors()
    assert errors.filter(record("absl", "/home/user/my_module.py"))
    assert errors.filter(record("asyncio", asyncio.base_events.__file__, logging.WARNING))
    assert not errors.filter(record("asyncio", asyncio.base_events.__file__))
    assert not errors.filter(record("absl", orbax_file))
    errors.release()   # no save failed: both are printed, late
    assert [r.name for r in released] == ["asyncio"] and not errors.held
    assert not errors.filter(record("asyncio", asyncio.base_events.__file__)) and len(errors.held) == 1
    errors.drop()
    assert not errors.filter(record("asyncio", asyncio.base_events.__file__)) and not errors.held
    errors.release()
    assert len(released) == 1
  finally:
    logging.getLogger("asyncio").removeHandler(handler)


def test_closed_event_loop_reports_of_a_failed_save_are_not_printed():
  """After a failed save, tensorstore reports each still-pending write as an unraisable "Event loop is closed"
  from asyncio; the filter installed on sys.unraisablehook drops those and passes on the same error from
  anywhere else."""
  import asyncio
  loop = asyncio.new_event_loop()
  loop.close()
  passed_on = []
  hook = checkpointing.without_reports_said_in_one_line(passed_on.append)
  for raise_it in (lambda: loop.call_soon_threadsafe(print), lambda: exec("raise RuntimeError('Event loop is closed')"),
                   lambda: loop.run_until_complete(None)):
    try:
      raise_it()
    except (RuntimeError, TypeError) as e:
      hook(types.SimpleNamespace(exc_type=type(e), exc_value=e, exc_traceback=e.__traceback__, err_msg=None,
                                 object=None))
  assert [str(u.exc_value) for u in passed_on] == ["Event loop is closed", "Event loop is closed"]
  assert [traceback.extract_tb(u.exc_traceback)[-2].name for u in passed_on] == [
      "<lambda>", "run_until_complete"]   # a plain raise, and a closed loop's own check outside a callback


def test_a_first_save_that_fails_says_the_run_starts_again(tmp_path, monkeypatch):
  """With no checkpoint completed there is nothing to resume from: the line says so instead of "resumes from it"."""
  for name in ("dropping", "held"):  # the failed save sets this process's filter of orbax's records: restored after
    monkeypatch.setattr(checkpointing.ORBAX_ERRORS, name, getattr(checkpointing.ORBAX_ERRORS, name))
  with small_tmpfs(tmp_path / "disk", "40k") as disk:
    ckpt = checkpointing.Checkpointer(str(disk / "checkpoints"), every=1, keep=1, async_save=False)
    with pytest.raises(checkpointing.SaveError) as failed:
      ckpt.save(1, {"w": np.zeros(100_000, np.float32)}, {"position": 0}, force=True)
    ckpt.close()
  assert "No space left on device" in str(failed.value)
  assert str(failed.value).endswith("The last good checkpoint is none (no checkpoint was completed); free space (or "
                                    "fix the storage) and rerun: the run resumes from its first step.")
