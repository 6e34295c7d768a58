"""`--mode=compile`: the real train step compiled for TPU slices on this CPU host, through the CLI, as a user runs
it before booking a pod."""
from __future__ import annotations

import re

import pytest

from tests.helpers import compile_cli, require_module

GIB = 1 << 30
pytestmark = pytest.mark.tpu


@pytest.fixture(scope="module", autouse=True)
def libtpu():
  """The `tpu` extra (the TPU compiler): required in CI (CI set), a skip on a machine without it."""
  require_module("libtpu", extra="tpu")


@pytest.mark.parametrize("field", ["flat_matmuls", "fused_qkv"])
@pytest.mark.parametrize("setting, compiled_with", [(None, False), (True, True), (False, False)])
def test_the_slice_gets_flat_matmuls_and_fused_qkv_only_when_asked(monkeypatch, field, setting, compiled_with):
  """flat_matmuls=None means "on for CPU" and fused_qkv=None "on but for a TPU", read from the backend at trace
  time: on this CPU host compiling for a TPU, the job must be built with both off (they cost TPU memory), and an
  explicit setting must pass through."""
  from albert_jax import job_kinds, pretrain, tpu_compile
  from experiments import pretrain_tiny
  seen = []
  monkeypatch.setattr(pretrain, "make_job", lambda config, run=None: seen.append(config.model[field]))
  config = pretrain_tiny.get_config("synthetic")
  config.model[field] = setting
  tpu_compile.job_for(config, job_kinds.kind_for(config))
  assert seen == [compiled_with] and config.model[field] is setting


@pytest.fixture(scope="module")
def tiny_on_v3_8():
  """The CPU default recipe compiled for a v3-8 as it is: (result, report)."""
  return compile_cli("--topology=v3-8")


def test_tiny_pretraining_fits_a_v3_8_and_reports_every_field(tiny_on_v3_8):
  result, report = tiny_on_v3_8
  assert result.returncode == 0, result.stderr
  assert report["topology"] == "v3:2x2" and report["devices"] == 8 and report["num_slices"] == 1
  assert report["fits"] is True
  assert report["micro_batch"] == 8 and report["accumulation_steps"] == 1  # 64 examples over 8 cores
  assert report["hbm_bytes_per_device"] == 16 * GIB
  assert report["remat_policy"] == "none" and report["dtype"] == "float32" and report["scan_unroll"] == 4
  assert 0 < report["peak_bytes_per_device"] < GIB and report["compile_seconds"] > 0
  state = report["memory"]["argument_groups"]["state"]
  assert state == 3 * 4 * 359_682 + 2 * 4  # describe's params_total, fp32, two LAMB moments; step and schedule count
  grads = report["collective_bytes"]["all-reduce"]
  assert grads["within_slice"] >= state // 3 and grads["across_slices"] == 0  # the gradient, once per step
  assert "parameters + optimizer state" in result.stdout and "headroom" in result.stdout
  # The compiled program's matmuls, loop trips included, against describe's per-token formula (8 sequences of 64
  # tokens a core); the two differ by 0.03% (the pooler and the small products the formula leaves out).
  assert report["matmul_flops_per_step"] == pytest.approx(5_260_224 * 8 * 64, rel=1e-3)
  # The step-time bound: every layer is in the program (scan_unroll 4), so no second compile; the compiler's ideal
  # is never faster than the chip's peak on the model's FLOPs (64 sequences of 64 tokens over 8 cores of 61.5 TFLOP/s).
  bound, model_flops, peak = report["time_bound"], 5_260_224 * 64 * 64, 8 * 61.5e12
  assert bound["compute_seconds"] >= model_flops / peak and bound["dcn_seconds"] == 0 < bound["ici_seconds"]
  assert 0 < bound["mfu"] <= 1 and bound["mfu"] == pytest.approx(model_flops / (bound["step_seconds"] * peak), rel=1e-3)
  assert bound["tokens_per_second"] == pytest.approx(64 * 64 / bound["step_seconds"])
  assert bound["train_steps"] == 500 and bound["hours"] == pytest.approx(500 * bound["step_seconds"] / 3600)
  assert "lower bound per step" in result.stdout and "steps take at least" in result.stdout


def test_the_bound_of_scanned_layers_counts_every_layer(tiny_on_v3_8):
  """The compiler's cost counts a loop's body once: with the layers scanned one an iteration, the bound comes from
  the same setting compiled with every layer unrolled, which is the default recipe's own program (scan_unroll 4)."""
  result, report = compile_cli("--topology=v3-8", "--config.model.scan_unroll=1")
  assert result.returncode == 0, result.stderr
  assert report["scan_unroll"] == 1
  assert report["time_bound"]["compute_seconds"] == tiny_on_v3_8[1]["time_bound"]["compute_seconds"]


def test_two_slices_put_gradient_traffic_on_the_data_centre_network_once_per_step():
  reports = {}
  for micro_batch in (2, 1):
    result, reports[micro_batch] = compile_cli("--topology=v5litepod-8", "--num_slices=2",
                                               f"--config.train.micro_batch_size={micro_batch}")
    assert result.returncode == 0, result.stderr
  report = reports[2]
  assert report["topology"] == "v5e:2x4" and report["devices"] == 16 and report["num_slices"] == 2
  assert report["micro_batch"] == 2 and report["accumulation_steps"] == 2  # 64 = 2 x 16 devices x 2
  assert reports[1]["accumulation_steps"] == 4
  across = sum(kind["across_slices"] for kind in report["collective_bytes"].values())
  assert across > 0
  # Twice the micro steps, the same traffic: the gradients are reduced after the last one, not after each
  # (the partitioner's own accumulation moved 1.51 MB across slices at 2 micro steps).
  assert reports[1]["collective_bytes"] == report["collective_bytes"]


def test_an_oversized_micro_batch_exits_3_with_overrides_to_try():
  result, report = compile_cli("--topology=v3-8", "--config.train.global_batch_size=262144")
  assert result.returncode == 3, result.stderr
  assert report["fits"] is False and report["peak_bytes_per_device"] > 16 * GIB
  assert "--config.train.micro_batch_size=16384" in result.stderr and "--fit" in result.stderr


@pytest.mark.slow
def test_fit_finds_the_largest_micro_batch_that_leaves_headroom():
  """68 sequences of 2048 tokens a core: the compiler refuses 68, 34 fits in HBM but not in the headroom, 17 leaves
  it. At that length a few dozen examples fill a core, so every compile stays small."""
  result, report = compile_cli("--topology=v3-8", "--fit", "--config.train.global_batch_size=544",
                               "--config.data.max_seq_length=2048", "--config.model.max_position_embeddings=2048",
                               "--config.model.scan_unroll=1")
  assert result.returncode == 0, result.stderr
  assert report["fits"] is True and report["remat_policy"] == "none"
  assert report["peak_bytes_per_device"] <= 0.9 * 16 * GIB
  assert report["micro_batch"] < 68 and report["candidates"] >= 2  # the whole per-core share did not fit
  assert report["micro_batch"] * report["accumulation_steps"] == 68
  assert f"--config.train.micro_batch_size={report['micro_batch']}" in report["overrides"]
  passed_over = re.search(r"micro batch +34: fits \(([\d.]+) GiB of 16.00", result.stdout)
  assert passed_over and 0.9 * 16 < float(passed_over.group(1)) <= 16, result.stdout  # without the headroom


def test_fine_tuning_configs_compile_too():
  result, report = compile_cli("--topology=v3-8", "--config.data.max_seq_length=128",
                               "--config.train.global_batch_size=32",
                               config="experiments/glue.py:task=rte,size=tiny")
  assert result.returncode == 0, result.stderr
  assert report["fits"] is True and report["micro_batch"] == 4
  # One step per length bucket (64, 128); the shorter one needs less memory than the longest, reported above.
  assert report["compiles"] == 2 and [b["length"] for b in report["shorter_buckets"]] == [64]
  assert report["shorter_buckets"][0]["peak_bytes_per_device"] < report["peak_bytes_per_device"]
  assert "length bucket 64: " in result.stdout
  # A fine-tuning step's time bound: its 4 layers run in a loop, so from one more compile with every layer unrolled.
  assert report["scan_unroll"] == 1 and report["time_bound"]["compute_seconds"] > 0
  assert report["time_bound"]["train_steps"] == 800 and "lower bound per step" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("experiment, micro_batch, accumulation, remat", [
    ("glue.py:task=mnli,size=xxlarge", 2, 8, "none"),      # batch 128 x 512 tokens: 19.5 GiB at micro batch 4
    ("race.py:size=xxlarge", 1, 4, "dots_saveable")])     # 4 x 512 tokens an example: 19.5 GiB without remat
def test_fine_tuning_recipes_fit_the_originals_eight_v3_cores(experiment, micro_batch, accumulation, remat):
  """The shipped recipes as they are, at the largest size, fit the slice the original fine-tuned on (16 GiB per
  v3 core). No step-time bound (`test_fine_tuning_configs_compile_too` checks a fine-tuning step's): its compile
  of every layer unrolled takes twice as long as the step's own."""
  result, report = compile_cli("--topology=v3-8", "--config.data.length_buckets=none",  # the longest step only
                               config=f"experiments/{experiment}", time_bound=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (report["fits"], report["micro_batch"], report["accumulation_steps"], report["remat_policy"]) == (
      True, micro_batch, accumulation, remat)
  assert report["peak_bytes_per_device"] < 0.9 * report["hbm_bytes_per_device"]
  # The gradients cross the interconnect once per step: about a third of the state (parameters and LAMB's two
  # moments). Reduced at every micro step, MNLI moved 8 times that (6.5 GB a step for 0.89 GB of gradients).
  state = report["memory"]["argument_groups"]["state"]
  assert 0.99 * state / 3 < report["collective_bytes"]["all-reduce"]["within_slice"] < 1.01 * state / 3


def shipped_recipe(experiment: str):
  import importlib
  module, _, arg = experiment.partition(":")
  recipe = importlib.import_module(f"experiments.{module}").get_config(arg or None)
  assert recipe.train.micro_batch_size == recipe.train.max_micro_batch_size == 0  # the whole per-device share
  return module, arg, recipe


@pytest.mark.slow
@pytest.mark.parametrize("experiment, slice_name", [("pretrain_base", "v3-128"), ("pretrain_xxlarge", "v3-1024")])
def test_each_pretraining_recipe_is_what_fit_chooses_for_its_slice(experiment, slice_name):
  """A recipe that recomputes what fits, or a micro batch smaller than fits, wastes its slice: `--fit` (least
  recompute first, micro batches from the largest down) must stop at the recipe's own setting."""
  module, arg, recipe = shipped_recipe(experiment)
  result, report = compile_cli(f"--topology={slice_name}", "--fit",
                               config=f"experiments/{module}.py" + (f":{arg}" if arg else ""))
  assert result.returncode == 0, result.stderr[-3000:]
  share = recipe.train.global_batch_size // report["devices"]
  assert (report["remat_policy"], report["micro_batch"], report["accumulation_steps"]) == (
      recipe.model.remat_policy, share, 1)
  assert report["peak_bytes_per_device"] < 0.9 * report["hbm_bytes_per_device"]


@pytest.mark.parametrize("row", ["large_v3-256", "xlarge_v3-512", "electra_base_v3-8", "electra_large_v3-256"])
def test_the_other_pretraining_recipes_are_fits_first_choice_as_bench_tpu_recipes_compiled_them(row):
  """The recipes whose compile takes minutes are `bench.tpu_recipes` rows: the compile it recorded must be of the
  shipped settings (a recipe changed since fails here until the row is compiled again) and be `--fit`'s first
  candidate, no recomputation and the whole per-device share in one micro step, within its 10% headroom."""
  import json
  from bench import tpu_recipes
  from tests.helpers import REPO
  experiment, slice_name, slices, overrides = tpu_recipes.ROWS[row]
  _, _, recipe = shipped_recipe(experiment)
  with open(REPO / "bench" / "results" / f"tpu_compile_{row}.json") as f:
    report = json.load(f)
  assert (report["row"], report["name"], report["num_slices"], overrides) == (row, slice_name, slices, {})
  assert recipe.model.remat_policy == "none" and (report["remat_policy"], report["micro_batch"],
                                                  report["accumulation_steps"]) == (
      "none", recipe.train.global_batch_size // report["devices"], 1)
  assert report["dtype"] == recipe.model.dtype
  assert report["fits"] and report["peak_bytes_per_device"] < 0.9 * report["hbm_bytes_per_device"]


def test_unknown_topology_names_the_valid_forms():
  result, _ = compile_cli("--topology=v9-64")
  assert result.returncode != 0
  assert "Unknown TPU generation 'v9'" in result.stderr and "v5litepod-64" in result.stderr
