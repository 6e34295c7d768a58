"""Benchmarks: every script runs at tiny sizes, prints its table and writes JSON with the documented fields. No
timing assertions (the machine is shared); subprocesses get one CPU device and XLA's -O0 so compiles stay short."""
import argparse
import gzip
import importlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from albert_jax.model_config import model_config_from
from bench import common, gpu_trace, launches, machine, saved_activations, step_parts, train_step
from tests.helpers import require_module

REPO = Path(__file__).resolve().parents[1]
TINY = ["--size", "tiny", "--layers", "2", "--seq-len", "32", "--micro-batch", "2", "--steps", "3", "--warmup", "1",
        "--block", "2", "--matmul-size", "256"]
ENVIRONMENT_FIELDS = {"device_kind", "jax", "torch", "cpu_model", "cpu_threads", "command", "xla_flags", "machine"}
MACHINE_FIELDS = {"cores", "start", "end", "other_cpu_share_during_run", "run_s", "matmul_tflops_per_s", "noisy"}
ROW_FIELDS = {"name", "compile_s", "median_s", "p10_s", "p90_s", "examples_per_s", "tokens_per_s", "mfu",
              "flops_per_token", "compiled_memory_bytes"}


def bench_env() -> dict[str, str]:
  """A benchmark subprocess's environment: the CPU, and XLA's -O0 so that its compiles stay short."""
  return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_backend_optimization_level=0")


def bench(module: str, *args: str, results: Path) -> tuple[str, dict]:
  proc = subprocess.run([sys.executable, "-m", f"bench.{module}", *args, "--results-dir", str(results)], cwd=REPO,
                        env=bench_env(), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  record = json.loads((results / f"{module}.json").read_text())
  assert ENVIRONMENT_FIELDS <= set(record["environment"]), record["environment"]
  assert record["environment"]["command"].startswith(f"python -m bench.{module}")
  check_machine(record["environment"]["machine"])
  return proc.stdout, record


def check_machine(m: dict) -> None:
  """Load average and the other processes' CPU share at start and end, as bench/machine.py records them."""
  assert MACHINE_FIELDS <= set(m) and m["cores"] >= 1 and m["run_s"] > 0, m
  for when in ("start", "end"):
    assert len(m[when]["loadavg"]) == 3 and 0 <= m[when]["other_cpu_share"] <= 1, m
  assert 0 <= m["other_cpu_share_during_run"] <= 1


@pytest.fixture(scope="module")
def train_step_run(tmp_path_factory) -> tuple[str, dict, Path]:
  """One `bench.train_step` run with the peer, two variants and `--profile`: (its output, its JSON, the profile's
  folder). One process and one compile of our step serve the tests of both."""
  require_module("torch", extra="hf")
  require_module("transformers", extra="hf")
  results = tmp_path_factory.mktemp("train_step")
  out, record = bench("train_step", *TINY, "--peer", "--scan-unroll", "0", "--variant", "rolled:scan_unroll=1",
                      "--variant", "cudnn:attention_implementation=cudnn", "--profile", str(results / "prof"),
                      results=results)
  return out, record, results / "prof"


@pytest.mark.slow
@pytest.mark.hf
def test_train_step_with_peer(train_step_run):
  out, record, _ = train_step_run
  assert record["model"]["scan_unroll"] == 2   # 0 = every layer of the 2
  names = [r["name"] for r in record["rows"]]
  assert names == ["ours_lamb", "ours_lamb_rolled", "ours_adamw", "peer_adamw", "matmul_jax", "matmul_torch"]
  # A variant that cannot be built here (cuDNN attention in float32) is left out, named, and costs no other row.
  assert list(record["failed_variants"]) == ["cudnn:attention_implementation=cudnn"]
  assert "bfloat16 or float16 only" in record["failed_variants"]["cudnn:attention_implementation=cudnn"]
  assert "variant 'cudnn:attention_implementation=cudnn' left out: InputError" in out
  # Same seed, same batch, same function: the first step's loss agrees (it is computed before any update).
  losses = [r["first_step_loss"] for r in record["rows"][:3]]
  assert losses[0] > 0 and losses == pytest.approx([losses[0]] * 3, rel=1e-6)
  for row in record["rows"][:4]:
    assert ROW_FIELDS - {"compiled_memory_bytes"} <= set(row), row
    assert row["steps"] == 3 and row["mfu"] > 0
  assert set(record["ratios"]) == {"ours_lamb/peer_adamw", "ours_lamb_rolled/peer_adamw", "ours_adamw/peer_adamw",
                                   "ours_lamb_rolled/ours_lamb"}
  assert record["peak_source"].startswith("measured") and record["rows"][0]["fraction_of_matmul"] > 0
  assert record["environment"]["machine"]["matmul_tflops_per_s"] == record["rows"][4]["tflops_per_s"]
  assert "median ms" in out and "tokens/s ratio ours_adamw/peer_adamw" in out


def test_train_step_rejects_a_malformed_variant(tmp_path, monkeypatch):
  """The command line as the script reads it; our runner, built before the variants are read, is not compiled."""
  monkeypatch.setattr(common, "Ours", lambda config, name: name)
  with pytest.raises(SystemExit, match="--variant 'rolled': expected NAME:KEY=VALUE"):
    train_step.main([*TINY, "--variant", "rolled", "--results-dir", str(tmp_path)])


def test_input_pipeline(tmp_path):
  out, record = bench("input_pipeline", *TINY, "--loader-batches", "3", "--compare-blocks", "1", "--tiny-dir",
                      str(tmp_path / "tiny"), results=tmp_path)
  assert [r["name"] for r in record["rows"]] == ["synthetic_on_device", "real_loader"]
  assert record["loader_standalone"]["examples_per_s"] > 0 and "overhead_fraction" in record
  assert "input overhead" in out and "loader alone" in out
  compared = record["loader_vs_builder_seq512"]
  assert [(c["short_seq_scope"], c["documents_from"]) for c in compared] == [
      ("document", "memory"), ("document", "disk"), ("chunk", "memory"), ("chunk", "disk")]
  assert all(c["identical_batches"] and c["loader_fraction_per_core"] > 0 for c in compared)
  assert "short_seq_scope=document, documents from disk: loader" in out


@pytest.mark.slow
def test_compile_depth(tmp_path):
  out, record = bench("compile_depth", *TINY, "--depths", "1,2", "--repeats", "1", results=tmp_path)
  assert [(r["path"], r["layers"]) for r in record["rows"]] == [
      ("scan", 1), ("scan", 2), ("scan unrolled", 1), ("scan unrolled", 2), ("python loop", 1), ("python loop", 2)]
  assert all(r["compile_s"] > 0 and r["lower_s"] > 0 for r in record["rows"])
  assert "compile s" in out


@pytest.mark.slow
def test_step_parts(tmp_path):
  out, record = bench("step_parts", *TINY, results=tmp_path)
  names = [r["name"] for r in record["rows"]]
  assert names == ["train step", "step's matmuls", "model forward", "model fwd+bwd", "optimizer update",
                   "encoder forward", "encoder fwd+bwd", "layer forward", "layer fwd+bwd", "attention forward",
                   "attention fwd+bwd", "ffn forward", "ffn fwd+bwd", "matmul_jax"]
  rows = {r["name"]: r for r in record["rows"]}
  # The optimizer has no matmuls: timed, with no rate.
  assert rows.pop("optimizer update")["fraction_of_matmul"] is None
  names.remove("optimizer update")
  for name in names[:-1]:
    assert rows[name]["median_ms"] > 0 and rows[name]["fraction_of_matmul"] > 0, rows[name]
  # Credited matmul FLOPs: forward + backward is three forwards; a layer is its attention plus its feed-forward.
  flops = {n: rows[n]["tflops_per_s"] * rows[n]["median_s"] * 1e12 for n in names[:-1]}
  # tiny (H=64, I=256) at 2 x 32 tokens: 64 · (8H² + 4·S·H + 4·H·I) = 64 · (32,768 + 8,192 + 65,536)
  assert flops["layer forward"] == pytest.approx(6_815_744, rel=1e-9)
  for part in ("model", "encoder", "layer", "attention", "ffn"):
    assert flops[f"{part} fwd+bwd"] == pytest.approx(3 * flops[f"{part} forward"], rel=1e-6)
  assert flops["layer forward"] == pytest.approx(flops["attention forward"] + flops["ffn forward"], rel=1e-6)
  assert flops["train step"] == pytest.approx(flops["model fwd+bwd"], rel=1e-6)
  # The traced step's dot_generals are the FLOP formula's matmuls (both layers of the scan) plus what the formula
  # leaves out: the pooler [2, 64] x [64, 64] and the SOP classifier [2, 64] x [64, 2], forward and backward,
  # 3 x (8,192 + 256), and the token types' one-hot product [64 tokens, 2] x [2, E=32], forward and the table's
  # gradient, 2 x 8,192.
  assert flops["step's matmuls"] == pytest.approx(
      flops["train step"] + 3 * (2 * 2 * 64 * 64 + 2 * 2 * 64 * 2) + 2 * (2 * 64 * 2 * 32), rel=1e-9)
  forms = record["matmul_forms"]
  # The FFN input kernel [64, 256], in its forward and its dx, and (flat_matmuls, on for CPU) the output gradient
  # [64 tokens, 256] in its kernel gradient: 3 products, in each of the scan's 2 layers.
  assert sum(f["calls"] for f in forms if f["rhs"] == "(64, 256)") == 3 * 2
  assert [f["median_ms"] for f in forms] == sorted((f["median_ms"] for f in forms), reverse=True)
  derived = record["derived"]
  assert set(derived) >= {"layer backward/forward", "optimizer share of the step",
                          "step's matmuls alone, share of the step", "dispatch per product call, ms"}
  assert 0 < derived["step's matmuls net of dispatch, share of the step"] < derived[
      "step's matmuls alone, share of the step"]
  assert derived["step's matmuls net of dispatch, of jnp.dot"] > rows["step's matmuls"]["fraction_of_matmul"]
  assert 0 < derived["optimizer update alone, share of the step"] < 1
  assert "optimizer share of the step" in out and "the step's matmul forms, each alone" in out


def test_the_optimizer_part_applies_the_steps_optimizer_to_its_state():
  import types

  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax

  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
  tx = optax.chain(optax.trace(decay=0.5), optax.sgd(0.1))
  state = types.SimpleNamespace(params=params, opt_state=tx.init(params))
  part = step_parts.OptimizerUpdate(tx, state)
  grads = part._args[2]
  part.step()
  new_params, new_state, _ = part._args
  for name in params:   # the first step of momentum from zero: params - 0.1 * grads
    np.testing.assert_allclose(new_params[name], params[name] - 0.1 * grads[name], rtol=1e-6)
    np.testing.assert_allclose(new_state[0].trace[name], grads[name], rtol=1e-6)
  part.step()           # the second call carries the first's state: momentum 0.5 · g + g
  for name in params:
    np.testing.assert_allclose(part._args[0][name], params[name] - 0.1 * grads[name] - 0.15 * grads[name],
                               rtol=1e-5)
  assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))


def test_jaxpr_matmuls_counts_a_scanned_product_once_per_iteration():
  import jax
  import jax.numpy as jnp

  w = jnp.ones((4, 4))
  def f(x):
    y, _ = jax.lax.scan(lambda c, _: (c @ w, None), x, None, length=3)
    return jnp.sum(y @ jnp.ones((4, 2)))
  counts = step_parts.jaxpr_matmuls(jax.make_jaxpr(jax.grad(f))(jnp.ones((5, 4))).jaxpr)
  by_rhs = {(form.rhs_shape, form.dimension_numbers): n for form, n in counts.items()}
  # forward: 3 scanned [5,4]x[4,4] and one [5,4]x[4,2]; backward: dx of each (the scan's 3 times, transposed w)
  assert by_rhs == {((4, 4), (((1,), (0,)), ((), ()))): 3, ((4, 2), (((1,), (0,)), ((), ()))): 1,
                    ((4, 4), (((1,), (1,)), ((), ()))): 3, ((4, 2), (((1,), (1,)), ((), ()))): 1}
  assert sum(step_parts.dot_flops(form) * n for form, n in counts.items()) == 3 * 2 * (2 * 5 * 4 * 4) + 2 * (
      2 * 5 * 4 * 2)


def test_jaxpr_matmuls_refuses_a_matmul_in_a_loop_of_unknown_length():
  import jax
  import jax.numpy as jnp

  loop = lambda x: jax.lax.while_loop(lambda c: jnp.sum(c) < 100.0, lambda c: c @ jnp.full((3, 3), 2.0), x)
  with pytest.raises(ValueError, match="inside `while`"):
    step_parts.jaxpr_matmuls(jax.make_jaxpr(loop)(jnp.ones((2, 3))).jaxpr)


@pytest.mark.slow
def test_speed_table(tmp_path):
  out, record = bench("speed_table", *TINY, "--sizes", "tiny,tiny256", "--scale", "0.5", "--max-batch",
                      "--remat-policies", "full", "--memory-cap-gb", "1", "--max-batch-limit", "1",
                      results=tmp_path)
  rows = {r["name"]: r for r in record["rows"]}
  assert set(rows) == {"tiny", "tiny256"} and record["reduced_sizes"]
  assert rows["tiny256"]["layers"] == 1 and rows["tiny"]["relative"] == 1.0   # no bert_large: first size is 1.0
  assert rows["tiny"]["max_batch_full"] == 1
  assert "REDUCED SIZES" in out and "Why the gaps" in out


class FakeRunner:
  def __init__(self, name):
    self.name, self.calls = name, []
    self.examples_per_step, self.tokens_per_step, self.flops_per_token, self.compile_s = 2, 64, 1e6, 0.5

  def step(self):
    self.calls.append(len(self.calls))

  def memory(self):
    return {}


def test_interleave_alternates_blocks_and_summarizes():
  a, b = FakeRunner("a"), FakeRunner("b")
  timings = common.interleave([a, b], steps=5, block=2, warmup=1)
  assert [len(timings[n]["times"]) for n in "ab"] == [5, 5]
  # 1 first + 1 warm-up + 5 timed + one untimed re-warm per block (3 blocks).
  assert len(a.calls) == len(b.calls) == 1 + 1 + 5 + 3
  row = common.summarize(a, timings["a"], peak=1e12)
  assert row["tokens_per_s"] == pytest.approx(64 / row["median_s"])
  assert row["mfu"] == pytest.approx(row["tokens_per_s"] * 1e6 / 1e12)
  text = common.print_table(common.table_rows([row]), common.STEP_COLUMNS)
  assert text.splitlines()[0].startswith("runner") and "n/a" in text   # no memory figure for the fake


def test_noisy_flag_and_matmul_rate():
  quiet = {"cores": 2, "start": {"loadavg": [0.4, 0.3, 0.2]}, "other_cpu_share_during_run": 0.1}
  assert machine.noisy_note(quiet) is None
  assert machine.noisy_note({**quiet, "start": {"loadavg": [2.5, 1, 1]}}).startswith("noisy: load 2.50 on 2 cores")
  assert "1.20 cores" in machine.noisy_note({**quiet, "other_cpu_share_during_run": 0.6})
  assert common.matmul_rate({"rows": [{"name": "ours"}, {"name": "matmul_jax", "tflops_per_s": 0.5}]}) == 0.5
  assert common.matmul_rate({"rows": [], "peak_flops": 4e11, "peak_source": "measured float32 jnp.dot"}) == 0.4
  assert common.matmul_rate({"rows": [], "peak_flops": 1e15, "peak_source": "table[H100]"}) is None


def launch_record(ours: float, peer: float, other_share: float, command: str = "python -m bench.train_step --peer"):
  machine_fields = {"other_cpu_share_during_run": other_share, "start": {"loadavg": [0.5, 0.4, 0.3]},
                    "matmul_tflops_per_s": 0.2}
  return {"environment": {"command": f"{command} --name run", "machine": machine_fields},
          "rows": [{"name": "ours", "tokens_per_s": ours, "fraction_of_matmul": ours / 1000},
                   {"name": "peer", "tokens_per_s": peer}, {"name": "matmul_jax", "tokens_per_s": None}],
          "ratios": {"ours/peer": ours / peer}}


def test_launches_summary_gives_median_and_range(tmp_path, capsys):
  paths = []
  for i, (ours, peer, share) in enumerate([(300, 100, 0.0), (240, 120, 0.2), (330, 110, 0.1)]):
    paths.append(tmp_path / f"run{i}.json")
    paths[-1].write_text(json.dumps(launch_record(ours, peer, share)))
  out = launches.main([*map(str, paths), "--output", str(tmp_path / "summary.json")])
  assert out["launches"] == 3 and out["command"] == "python -m bench.train_step --peer"
  assert out["runners"]["ours"]["tokens_per_s"] == {"median": 300, "min": 240, "max": 330}
  assert out["runners"]["ours"]["fraction_of_matmul"]["median"] == pytest.approx(0.3)
  assert "fraction_of_matmul" not in out["runners"]["peer"] and "matmul_jax" not in out["runners"]
  assert out["ratios"]["ours/peer"] == {"median": 3.0, "min": 2.0, "max": 3.0}
  assert out["machine"]["other_cpu_share_during_run"] == {"median": 0.1, "min": 0.0, "max": 0.2}
  assert "ours/peer" in capsys.readouterr().out and json.loads((tmp_path / "summary.json").read_text()) == out
  paths[0].write_text(json.dumps(launch_record(300, 100, 0.0, command="python -m bench.train_step --size base")))
  with pytest.raises(SystemExit, match="different commands"):
    launches.main(list(map(str, paths)))


def test_launches_summary_of_compile_depth_launches(tmp_path, capsys):
  paths = []
  for i, (shallow, deep) in enumerate([(4.0, 4.4), (3.0, 3.6), (5.0, 5.0)]):
    rows = [{"path": "scan", "layers": layers, "lower_s": 0.5, "compile_s": s - 0.5, "total_s": s,
             "vs_shallowest": s / shallow} for layers, s in ((12, shallow), (24, deep))]
    machine_fields = {"other_cpu_share_during_run": 0.0, "start": {"loadavg": [0.5, 0.4, 0.3]},
                      "matmul_tflops_per_s": None}
    paths.append(tmp_path / f"run{i}.json")
    paths[-1].write_text(json.dumps({"benchmark": "compile_depth", "rows": rows, "environment": {
        "command": f"python -m bench.compile_depth --name run{i}", "machine": machine_fields}}))
  out = launches.main(list(map(str, paths)))
  assert out["runners"]["scan L=24"]["total_s"] == {"median": 4.4, "min": 3.6, "max": 5.0}
  assert out["runners"]["scan L=24"]["vs_shallowest"]["median"] == pytest.approx(1.1)
  assert out["ratios"] == {} and out["derived"] == {} and out["machine"]["matmul_tflops_per_s"] is None
  assert "scan L=24" in capsys.readouterr().out


def test_launches_summary_of_step_parts_launches(tmp_path, capsys):
  paths = []
  for i, (step, matmuls) in enumerate([(230.0, 187.0), (250.0, 190.0), (228.0, 185.0)]):
    rows = [{"name": "train step", "median_ms": step, "fraction_of_matmul": 100 / step},
            {"name": "step's matmuls", "median_ms": matmuls, "fraction_of_matmul": 100 / matmuls},
            {"name": "matmul_jax", "median_ms": 84.0, "fraction_of_matmul": None}]
    machine_fields = {"other_cpu_share_during_run": 0.0, "start": {"loadavg": [0.5, 0.4, 0.3]},
                      "matmul_tflops_per_s": 0.2}
    paths.append(tmp_path / f"run{i}.json")
    paths[-1].write_text(json.dumps({"benchmark": "step_parts", "rows": rows, "environment": {
        "command": f"python -m bench.step_parts --name run{i}", "machine": machine_fields},
        "derived": {"step's matmuls alone, share of the step": matmuls / step}}))
  out = launches.main(list(map(str, paths)))
  assert out["runners"]["train step"]["median_ms"] == {"median": 230.0, "min": 228.0, "max": 250.0}
  assert out["runners"]["matmul_jax"] == {"median_ms": {"median": 84.0, "min": 84.0, "max": 84.0}}
  assert out["derived"]["step's matmuls alone, share of the step"]["median"] == pytest.approx(185 / 228)   # of 0.813, 0.760, 0.811
  assert "step's matmuls alone, share of the step       0.811 (0.76-0.813)" in capsys.readouterr().out


class _Parsed(Exception):
  """Raised in place of running a benchmark, once its arguments are parsed."""


def run_gpu_suite(tmp_path: Path, *parts: str, **env: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
  """Runs bench/gpu_suite.sh with a stand-in interpreter that logs each call's arguments and PYTHONPATH."""
  suite = tmp_path / "bench" / "gpu_suite.sh"
  suite.parent.mkdir(exist_ok=True)
  suite.write_text((REPO / "bench" / "gpu_suite.sh").read_text())
  log, interpreter = tmp_path / "calls.jsonl", tmp_path / "python"
  log.unlink(missing_ok=True)
  # It logs its call, exits 3 when its arguments hold $FAIL_ON, and otherwise writes the JSON its --name names.
  interpreter.write_text(f"#!{sys.executable}\nimport json, os, sys\nopen({str(log)!r}, 'a').write(json.dumps("
                         "{'argv': sys.argv[1:], 'pythonpath': os.environ.get('PYTHONPATH', ''), "
                         "'xla_flags': os.environ.get('XLA_FLAGS')}) + '\\n')\n"
                         "if os.environ.get('FAIL_ON') and os.environ['FAIL_ON'] in ' '.join(sys.argv): sys.exit(3)\n"
                         "if '--name' in sys.argv:\n"
                         "  name = sys.argv[sys.argv.index('--name') + 1]\n"
                         "  open(os.path.join(os.environ['RESULTS_DIR'], name + '.json'), 'w').write('{}')\n")
  interpreter.chmod(0o755)
  proc = subprocess.run(["bash", str(suite), *parts], capture_output=True, text=True, timeout=60,
                        env={**os.environ, "PY": str(interpreter), "RESULTS_DIR": str(tmp_path / "results"), **env})
  calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
  return proc, calls


@pytest.mark.parametrize("parts, commands", [((), 16), (("lead",), 4), (("peer", "profile"), 7), (("remat",), 4),
                                             (("capacity", "tables"), 5)])
def test_every_gpu_suite_command_parses_and_builds_its_models(tmp_path, monkeypatch, parts, commands):
  """The suite has never run where it is meant to (a lent GPU, with minutes of device time): its commands are
  logged by a stand-in interpreter, then each one's flags go through its own parser and its model configs are
  built, so a misspelt flag or size fails here and not on the GPU. Every command writes a JSON of its own into
  RESULTS_DIR (on the lent machine, the folder whose files come back)."""
  proc, calls = run_gpu_suite(tmp_path, *parts, TAG="lhs")
  assert proc.returncode == 0, proc.stderr
  assert len(calls) == commands and all(c["argv"][0] == "-m" for c in calls)
  assert (tmp_path / "results" / "nvidia_smi_lhs.txt").exists()

  original = argparse.ArgumentParser.parse_args
  def parse_only(self, args=None, namespace=None):
    raise _Parsed(original(self, args, namespace))
  monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
  names = []
  for _, module, *argv in (c["argv"] for c in calls):
    with pytest.raises(_Parsed) as parsed:
      importlib.import_module(module).main(argv)
    args = parsed.value.args[0]
    if module == "bench.saved_activations":
      for spec in args.rows:
        saved_activations.row_config(spec)
    else:
      sizes = args.sizes.split(",") if module == "bench.speed_table" else [args.size]
      for size in sizes:
        model_config_from(common.bench_config(argparse.Namespace(**{**vars(args), "size": size})))
    assert args.results_dir == str(tmp_path / "results")
    names.append(args.name)
  assert len(set(names)) == len(names) and all(name.endswith("_lhs") for name in names), names


def test_gpu_suite_installs_the_carried_wheels_first_and_refuses_an_unknown_part(tmp_path):
  (tmp_path / "wheels").mkdir()
  for name in ("flax-0.12.8-py3-none-any.whl", "optax-0.2.8-py3-none-any.whl"):
    (tmp_path / "wheels" / name).touch()
  proc, calls = run_gpu_suite(tmp_path, "peer", WHEELS=str(tmp_path / "wheels"), TMPDIR=str(tmp_path),
                              PYTHONPATH="/elsewhere")
  assert proc.returncode == 0, proc.stderr
  site = str(tmp_path / "albert_jax_site")
  install, *benchmarks = calls
  assert install["argv"][:3] == ["-m", "pip", "install"] and "--no-index" in install["argv"]
  assert install["argv"][install["argv"].index("--target") + 1] == site
  assert sorted(Path(a).name for a in install["argv"] if a.endswith(".whl")) == [
      "flax-0.12.8-py3-none-any.whl", "optax-0.2.8-py3-none-any.whl"]
  assert len(benchmarks) == 3 and all(c["pythonpath"] == f"{site}:/elsewhere" for c in benchmarks)

  proc, calls = run_gpu_suite(tmp_path, "peer", "speed")
  assert proc.returncode == 2 and calls == []
  assert "no part 'speed'; the parts: lead peer profile remat capacity tables" in proc.stderr


def test_gpu_suite_goes_on_past_a_failed_command_and_archives_what_finished(tmp_path):
  """On a lent machine one command running out of memory must not cost the others, and only $OUT comes back: the
  failure is reported at the end (exit 1), and the archive holds every JSON written before and after it."""
  archive = tmp_path / "out" / "results.tgz"
  archive.parent.mkdir()
  proc, calls = run_gpu_suite(tmp_path, "peer", "profile", FAIL_ON="step_parts", ARCHIVE=str(archive))
  assert proc.returncode == 1 and len(calls) == 7
  assert "failed with exit 3: bench.step_parts" in proc.stderr
  assert "gpu_suite.sh: 1 command(s) did not finish:" in proc.stderr
  with tarfile.open(archive) as tar:
    names = sorted(Path(n).name for n in tar.getnames() if n.endswith(".json"))
  assert names == ["saved_activations_gpu.json", "train_step_base_s128_gpu.json",
                   "train_step_base_s128_variants_gpu.json", "train_step_base_s512_gpu.json",
                   "train_step_large_s512_b192_gpu.json", "train_step_large_s512_gpu.json"]


def test_gpu_suite_dry_run_gives_every_command_a_tiny_size_and_a_few_steps(tmp_path):
  """DRY_RUN=1 runs the lead part's code paths on a CPU before a GPU call: its flags come last, so they win."""
  proc, calls = run_gpu_suite(tmp_path, "lead", DRY_RUN="1")
  assert proc.returncode == 0, proc.stderr
  dry = ["--size", "tiny", "--seq-len", "32", "--predictions", "4", "--micro-batch", "2", "--steps", "2", "--warmup",
         "1", "--block", "1", "--matmul-size", "64"]
  assert len(calls) == 4 and all(c["argv"][-len(dry):] == dry for c in calls)
  assert "--variant" in calls[0]["argv"] and "separate:fused_qkv=False" in calls[0]["argv"]


def test_gpu_suite_skips_what_its_deadline_leaves_no_time_for(tmp_path):
  proc, calls = run_gpu_suite(tmp_path, "peer", DEADLINE="20")
  assert proc.returncode == 1 and calls == []
  assert proc.stderr.count("skipped, 20s left of DEADLINE=20: bench.train_step") == 3


@pytest.mark.parametrize("flags, extra, expected", [(None, None, None), ("", "", None), (None, "--xla_b=1", "--xla_b=1"),
                                                    ("--xla_a=1", "--xla_b=1", "--xla_a=1 --xla_b=1")])
def test_gpu_suite_passes_xla_flags_without_stray_blanks(tmp_path, flags, extra, expected):
  """XLA reads an XLA_FLAGS that does not start with "--" (a lone blank too) as a file of flags, and aborts."""
  env = {key: value for key, value in (("XLA_FLAGS", flags), ("XLA_EXTRA", extra)) if value is not None}
  with pytest.MonkeyPatch.context() as m:
    m.delenv("XLA_FLAGS", raising=False)
    m.delenv("XLA_EXTRA", raising=False)
    proc, calls = run_gpu_suite(tmp_path, "peer", **env)
  assert proc.returncode == 0, proc.stderr
  assert [c["xla_flags"] for c in calls] == [expected] * 3


def test_gpu_trace_sums_the_device_kernels_per_step_and_names_their_model_code(tmp_path, capsys):
  """A hand-made trace of 2 steps: two kernels on the device (a scatter fusion 30 µs a step, a library gemm 2 x 5 µs),
  host events that are not counted, and the device waiting 4 µs inside each step and 56 µs between the two. The
  HLO beside it names the fusion's model code; the library kernel keeps the trace's own HLO op."""
  process = lambda pid, name: {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}
  kernel = lambda name, ts, dur, op: {"ph": "X", "pid": 1, "tid": 7, "name": name, "ts": ts, "dur": dur,
                                      "args": {"hlo_op": op}}
  events = [process(1, "/device:GPU:0"), process(9, "/host:CPU")]
  for step, start in enumerate((0, 100)):
    events += [{"ph": "X", "pid": 9, "tid": 1, "name": "train", "ts": start, "dur": 60, "args": {"step_num": step}},
               kernel("nvjet_gemm", start, 5, "custom-call.3"),
               kernel("input_scatter_fusion_1", start + 5, 30, "command_buffer_2"),
               kernel("nvjet_gemm", start + 39, 5, "custom-call.3")]
  trace = tmp_path / "plugins" / "profile" / "run" / "host.trace.json.gz"
  trace.parent.mkdir(parents=True)
  with gzip.open(trace, "wt") as f:
    json.dump({"traceEvents": events}, f)
  op_name = "jit(train_step)/transpose(jvp(AlbertForPreTraining))/albert/embeddings/token_type_embeddings/scatter-add"
  (tmp_path / gpu_trace.HLO_FILE).write_text(
      "ENTRY %main.1 (p: f32[2,8]) -> f32[2,8] {\n"
      f'  %input_scatter_fusion.1 = bf16[2,128]{{1,0}} fusion(%a, %b), kind=kInput, calls=%fused_scatter.1, '
      f'metadata={{op_name="{op_name}" scheduling_name="input_scatter_fusion.1"}}\n'
      '  ROOT %custom-call.3 = bf16[64,64]{1,0} custom-call(%c, %d), custom_call_target="__cublas$gemm"\n}\n')
  out = gpu_trace.main([str(tmp_path), "--output", str(tmp_path / "summary.json")])
  assert out["steps"] == 2 and out["kernels_per_step"] == 3 and out["hlo"] == str(tmp_path / gpu_trace.HLO_FILE)
  assert out["busy_ms_per_step"] == pytest.approx(0.040) and out["idle_ms_per_step"] == pytest.approx(0.032)
  assert [(r["kernel"], r["op_name"], r["calls_per_step"]) for r in out["rows"]] == [
      ("input_scatter_fusion_1", op_name, 1), ("nvjet_gemm", None, 2)]
  assert [r["ms_per_step"] for r in out["rows"]] == pytest.approx([0.030, 0.010])
  assert [r["share"] for r in out["rows"]] == pytest.approx([0.75, 0.25])
  assert json.loads((tmp_path / "summary.json").read_text())["rows"] == out["rows"]
  printed = capsys.readouterr().out
  assert f"    0.030      1  75.0%  input_scatter_fusion_1: {op_name}" in printed
  assert "    0.010      2  25.0%  nvjet_gemm: custom-call.3" in printed

  with pytest.raises(SystemExit, match="--hlo nowhere.txt: no such file"):
    gpu_trace.main([str(trace), "--hlo", "nowhere.txt"])
  with gzip.open(trace, "wt") as f:
    json.dump({"traceEvents": [e for e in events if e["pid"] != 1]}, f)
  with pytest.raises(SystemExit, match="no device kernels"):
    gpu_trace.main([str(trace)])


@pytest.mark.slow
@pytest.mark.hf
def test_train_step_profile_writes_the_trace_and_the_compiled_step(train_step_run):
  """On the CPU the trace has no device kernels to sum (bench.gpu_trace says so); the HLO is the step's."""
  _, _, profile = train_step_run
  assert list(profile.glob("plugins/profile/*/*.trace.json.gz"))
  hlo = (profile / gpu_trace.HLO_FILE).read_text()
  assert hlo.startswith("HloModule jit_train_step") and "albert/embeddings" in hlo
  with pytest.raises(SystemExit, match="no device kernels"):
    gpu_trace.main([str(profile)])


def test_saved_activations_reports_the_hand_count_and_the_compiled_layers(tmp_path):
  payload = saved_activations.main(["--rows", "tiny:16:float32:none", "--no-tpu", "--results-dir", str(tmp_path)])
  (row,) = payload["rows"]
  H, I, N = 64, 256, 4  # tiny
  assert row["jax_kib"] * 1024 == 4 * (7 * H + 2 * I + N * 16) + 16
  assert row["cpu_kib"] > 0 and row["gpu_kib"] is None and row["tpu_kib"] is None
  record = json.loads((tmp_path / "saved_activations.json").read_text())
  assert record["rows"] == [row] and "loadavg" in record["environment"]["machine"]["start"]


@pytest.mark.slow
def test_finetune_buckets(shared_data, tmp_path):
  from tests.helpers import glue_data, spm
  root = glue_data(shared_data, "sst-2", tmp_path / "glue")
  out, record = bench("finetune_buckets", "--glue", str(root), "--spm", str(spm(shared_data)), "--tasks",
                      "sst-2:train", "--blocks", "2", "--block", "1", "--train-steps", "2", "--workdir",
                      str(tmp_path / "runs"), results=tmp_path)
  (speed,) = record["speeds"]
  assert speed["task"] == "sst-2" and speed["buckets"] == [64, 128, 256, 512] and speed["speedup"] > 0
  assert speed["steps_timed_per_length"]["512"] == 2 and sum(speed["batches_per_epoch_by_length"].values()) >= 1
  padded, bucketed = record["training_runs"]
  assert (padded["length_buckets"], bucketed["length_buckets"]) == ("none", "64,128,256,512")
  assert padded["train_step_compiles"] == 1 and bucketed["train_step_compiles"] >= 1
  assert record["predictions"]["labels_identical"] and record["predictions"]["max_abs_probability_difference"] < 1e-5
  assert "examples/s bucketed" in out and "labels identical True" in out
