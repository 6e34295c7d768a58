"""bench.gpu_compile: the real train step compiled for an H100 on this CPU host (jax's CUDA plugin in an
interpreter of its own, made by bench/gpu_compile_env.sh; .ci/run makes one and names it in
ALBERT_GPU_COMPILE_PYTHON)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = os.environ.get("ALBERT_GPU_COMPILE_PYTHON")


@pytest.fixture(scope="module")
def interpreter():
  if not PYTHON:
    if os.environ.get("CI"):
      pytest.fail("ALBERT_GPU_COMPILE_PYTHON is unset: .ci/run makes it with bench/gpu_compile_env.sh")
    pytest.skip("no GPU-compile interpreter here: bash bench/gpu_compile_env.sh DIR, then "
                "ALBERT_GPU_COMPILE_PYTHON=DIR/bin/python")
  return PYTHON


def test_the_step_compiles_for_an_h100_with_cudnn_attention_and_without(interpreter, tmp_path):
  measured = tmp_path / "train_step.json"   # a bench.train_step result of the xla row's setting
  measured.write_text(json.dumps({"rows": [{"name": "ours_lamb", "median_s": 0.5}]}))
  out = subprocess.run([interpreter, "-m", "bench.gpu_compile", "--size", "tiny", "--seq-len", "32",
                        "--micro-batch", "4", "--variant", "xla:attention_implementation=xla,fused_qkv=False",
                        "--measured", str(measured), "--measured-row", "xla", "--hlo-dir", str(tmp_path),
                        "--results-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  record = json.loads((tmp_path / "gpu_compile.json").read_text())
  assert record["device"] == "NVIDIA H100 80GB HBM3"
  cudnn, xla = record["rows"]
  assert (cudnn["name"], cudnn["attention"], xla["name"], xla["attention"]) == ("ours", "cudnn", "xla", "xla")
  assert (cudnn["fused_qkv"], xla["fused_qkv"]) == (True, False)   # the GPU's default, and the variant's
  # The one query/key/value product (tiny: H=64, 4 x 32 tokens) gives [128 tokens, 3H] in the first row only (XLA
  # splits its contraction into 4 parts summed in float32); the separate row's XLA merges the three products into a
  # transposed [3H, 128 tokens] one.
  fused = lambda row: [f["form"] for f in row["bound"]["matmul_forms"]
                       if re.search(r"-> \w+\[(\d+,)*128,192\]", f["form"])]
  assert fused(cudnn) == ["bf16[128,4,16] x bf16[4,16,192] -> f32[4,128,192]"] and fused(xla) == []
  for row in (cudnn, xla):   # the roofline bound: the larger of compute and bytes alone at most, their sum at least
    bound = row["bound"]
    assert max(bound["compute_s"], bound["memory_s"]) <= bound["step_s"] <= bound["compute_s"] + bound["memory_s"]
    assert (tmp_path / f"gpu_compile_{row['name']}.hlo.txt.gz").is_file()
  assert xla["measured_over_bound"] == pytest.approx(0.5 / xla["bound"]["step_s"]) and "measured_step_s" not in cudnn
  assert cudnn["fits"] and xla["fits"] and 0 < cudnn["required_gib"] < 1
  # cuDNN's fused attention, forward and backward, in the cudnn row only; the word table's gradient is a scatter
  # in both (the position and token-type tables' are not: tests/test_model.py).
  assert {k for k in cudnn["kernels"] if "cudnn" in k} == {"__cudnn$fmhaScaleBiasSoftmax",
                                                          "__cudnn$fmhaScaleBiasSoftmaxBackward"}
  assert not any("cudnn" in k for k in xla["kernels"])
  assert cudnn["kernels"]["scatter"] >= 1 and xla["kernels"]["scatter"] >= 1
  assert "Compiled for an NVIDIA H100 80GB HBM3 without one" in out.stdout


def test_a_measured_row_that_is_not_there_is_named_with_the_rows_that_are(tmp_path):
  from bench import gpu_compile
  from albert_jax.errors import InputError
  measured = tmp_path / "train_step.json"
  measured.write_text(json.dumps({"rows": [{"name": "ours_lamb", "median_s": 0.5}, {"name": "peer", "median_s": 1}]}))
  assert gpu_compile.measured_step(str(measured)) == (f"{measured}:ours_lamb", 0.5)
  with pytest.raises(InputError, match="no row 'ours_adamw' there; its rows: ours_lamb, peer"):
    gpu_compile.measured_step(f"{measured}:ours_adamw")
  with pytest.raises(InputError, match="no such file"):
    gpu_compile.measured_step(str(tmp_path / "missing.json"))


def test_without_the_cuda_plugin_it_says_how_to_get_it(tmp_path):
  out = subprocess.run([sys.executable, "-m", "bench.gpu_compile", "--size", "tiny", "--seq-len", "32",
                        "--results-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode != 0
  assert "bash bench/gpu_compile_env.sh DIR" in out.stderr


def test_kernel_counts_name_library_calls_scatters_and_fusions_by_kind():
  from bench import gpu_compile
  hlo = """
  %a = f32[4]{0} fusion(f32[4]{0} %p), kind=kLoop, calls=%fused_add
  %b = f32[] fusion(f32[4]{0} %a), kind=kInput, calls=%fused_reduce
  %c = f32[] fusion(f32[4]{0} %p), kind=kInput, calls=%fused_reduce.1
  %d = bf16[4,4]{1,0} fusion(bf16[4,4]{1,0} %x, bf16[4,4]{1,0} %y), kind=kCustom, calls=%gemm_fusion
  %e = (bf16[2,4]{1,0}, u8[0]{0}) custom-call(bf16[2,4]{1,0} %q), custom_call_target="__cudnn$fmhaScaleBiasSoftmax"
  %f = f32[8,4]{1,0} scatter(f32[8,4]{1,0} %t, s32[3,1]{1,0} %i, f32[3,4]{1,0} %u), update_window_dims={1}
  """
  assert gpu_compile.kernel_counts(hlo) == {"__cudnn$fmhaScaleBiasSoftmax": 1, "fusion kCustom": 1,
                                            "fusion kInput": 2, "fusion kLoop": 1, "scatter": 1}
