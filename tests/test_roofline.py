"""bench.roofline: exact FLOPs, bytes and launches of a hand-written HLO module and of the H200 run's step, and the
trace's kernels matched to their instructions. No timing assertions: the trace's durations are data here."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench import roofline

PROFILE = Path(__file__).resolve().parents[1] / "bench" / "results" / "profile_base_s128_h200"
CARRY = "(s32[], f32[64,64], f32[64,128], bf16[3,64,64], f32[64,128])"
PARAMETERS = ("x0: f32[64,64], w0: f32[64,128], q: bf16[2,16,4,8], k: bf16[2,16,4,8], v: bf16[2,16,4,8], "
              "a: bf16[32,48], b: bf16[48,16]")
ASYNC = "((bf16[3,64,64]{2,1,0}, s32[]), bf16[1,64,64]{2,1,0}, u32[])"   # (operands, result, context)
ATTENTION = ('custom_call_target="__cudnn$fmhaScaleBiasSoftmax", backend_config={"cudnn_fmha_backend_config":'
             '{"intermediate_tensor_shape":{"dimensions":["2","4","16","16"]}}}')
GEMM = ('custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":'
        '{"lhs_batch_dimensions":[],"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":[],'
        '"rhs_contracting_dimensions":["0"]}}}')
# A loop of 3 trips (XLA knows the count) holding an elementwise fusion (its operand passed twice), a dot, an
# in-place dynamic-update-slice into a [3,64,64] stack and the counter; before it the stack's zeros, after it a
# fusion alike the loop's but for names, cuDNN attention (B 2, T 16, heads 4, d 8), a cuBLAS GEMM (32x48 by 48x16),
# a copy of the stack and an async dynamic slice of one row.
HLO = f"""HloModule tiny, is_scheduled=true

%fused_add (p0: f32[64,64], p1: f32[64,64]) -> f32[64,64] {{
  %p0 = f32[64,64]{{1,0}} parameter(0)
  %p1 = f32[64,64]{{1,0}} parameter(1)
  ROOT %add = f32[64,64]{{1,0}} add(%p0, %p1)
}}

%fused_add.1 (q0: f32[64,64], q1: f32[64,64]) -> f32[64,64] {{
  %q0 = f32[64,64]{{1,0}} parameter(0)
  %q1 = f32[64,64]{{1,0}} parameter(1)
  ROOT %add.1 = f32[64,64]{{1,0}} add(%q0, %q1)
}}

%fused_update (p2: bf16[3,64,64], p3: f32[64,64], p4: s32[]) -> bf16[3,64,64] {{
  %p2 = bf16[3,64,64]{{2,1,0}} parameter(0)
  %p3 = f32[64,64]{{1,0}} parameter(1)
  %convert = bf16[64,64]{{1,0}} convert(%p3)
  %bitcast = bf16[1,64,64]{{2,1,0}} bitcast(%convert)
  %p4 = s32[] parameter(2)
  %zero = s32[] constant(0)
  ROOT %dus = bf16[3,64,64]{{2,1,0}} dynamic-update-slice(%p2, %bitcast, %p4, %zero, %zero)
}}

%fused_increment (p5: s32[]) -> s32[] {{
  %p5 = s32[] parameter(0)
  %one = s32[] constant(1)
  ROOT %next = s32[] add(%p5, %one)
}}

%fused_zeros () -> bf16[3,64,64] {{
  %z = bf16[] constant(0)
  ROOT %zeros = bf16[3,64,64]{{2,1,0}} broadcast(%z), dimensions={{}}
}}

%fused_slice (p6: bf16[3,64,64], p7: s32[]) -> bf16[1,64,64] {{
  %p6 = bf16[3,64,64]{{2,1,0}} parameter(0)
  %p7 = s32[] parameter(1)
  %zero.2 = s32[] constant(0)
  ROOT %ds = bf16[1,64,64]{{2,1,0}} dynamic-slice(%p6, %p7, %zero.2, %zero.2), dynamic_slice_sizes={{1,64,64}}
}}

%body (arg: {CARRY}) -> {CARRY} {{
  %arg = {CARRY} parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = f32[64,64]{{1,0}} get-tuple-element(%arg), index=1
  %w = f32[64,128]{{1,0}} get-tuple-element(%arg), index=2
  %stack = bf16[3,64,64]{{2,1,0}} get-tuple-element(%arg), index=3
  %loop_add_fusion = f32[64,64]{{1,0}} fusion(%x, %x), kind=kLoop, calls=%fused_add
  %dot = f32[64,128]{{1,0}} dot(%loop_add_fusion, %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  %loop_dus_fusion = bf16[3,64,64]{{2,1,0}} fusion(%stack, %loop_add_fusion, %i), kind=kLoop, calls=%fused_update
  %loop_add_fusion.1 = s32[] fusion(%i), kind=kLoop, calls=%fused_increment
  ROOT %tuple = {CARRY} tuple(%loop_add_fusion.1, %loop_add_fusion, %w, %loop_dus_fusion, %dot)
}}

%cond (arg.1: {CARRY}) -> pred[] {{
  %arg.1 = {CARRY} parameter(0)
  %i.1 = s32[] get-tuple-element(%arg.1), index=0
  %three = s32[] constant(3)
  ROOT %lt = pred[] compare(%i.1, %three), direction=LT
}}

ENTRY %main ({PARAMETERS}) -> bf16[1,64,64] {{
  %x0 = f32[64,64]{{1,0}} parameter(0)
  %w0 = f32[64,128]{{1,0}} parameter(1)
  %q = bf16[2,16,4,8]{{3,2,1,0}} parameter(2)
  %k = bf16[2,16,4,8]{{3,2,1,0}} parameter(3)
  %v = bf16[2,16,4,8]{{3,2,1,0}} parameter(4)
  %a = bf16[32,48]{{1,0}} parameter(5)
  %b = bf16[48,16]{{1,0}} parameter(6)
  %zero.1 = s32[] constant(0)
  %loop_broadcast_fusion = bf16[3,64,64]{{2,1,0}} fusion(), kind=kLoop, calls=%fused_zeros
  %init = {CARRY} tuple(%zero.1, %x0, %w0, %loop_broadcast_fusion, %w0)
  %while = {CARRY} while(%init), condition=%cond, body=%body, backend_config={{"known_trip_count":{{"n":"3"}}}}
  %loop_add_fusion.2 = f32[64,64]{{1,0}} fusion(%x0, %x0), kind=kLoop, calls=%fused_add.1
  %attention = (bf16[2,4,16,8]{{3,1,2,0}}, f32[2,4,16]{{2,1,0}}, u8[256]{{0}}) custom-call(%q, %k, %v), {ATTENTION}
  %gemm = (bf16[32,16]{{1,0}}, s8[1024]{{0}}) custom-call(%a, %b), {GEMM}
  %stack.1 = bf16[3,64,64]{{2,1,0}} get-tuple-element(%while), index=3
  %copy = bf16[3,64,64]{{2,1,0}} copy(%stack.1)
  %fusion-start = {ASYNC} fusion-start(%copy, %zero.1), kind=kLoop, calls=%fused_slice
  ROOT %fusion-done = bf16[1,64,64]{{2,1,0}} fusion-done(%fusion-start)
}}
"""
BODY = ["loop_add_fusion", "dot", "loop_dus_fusion", "loop_add_fusion.1"]
ORDER = ["loop_broadcast_fusion", *BODY * 3, "loop_add_fusion.2", "attention", "gemm", "copy", "fusion-start"]
ROW, STACK = 64 * 64 * 2, 3 * 64 * 64 * 2   # bytes of one bf16 [64,64] row of the stack, and of the stack
# name -> (category, executions per step, FLOPs and bytes per execution)
EXPECTED = {
    "loop_broadcast_fusion": ("elementwise/loop fusion", 1, 0, STACK),                       # writes the zeros
    "loop_add_fusion": ("elementwise/loop fusion", 3, 0, 2 * 64 * 64 * 4),                   # x read once, sum
    "dot": ("matmul", 3, 2 * 64 * 128 * 64, (64 * 64 + 2 * 64 * 128) * 4),
    "loop_dus_fusion": ("dynamic slices/updates", 3, 0, 64 * 64 * 4 + 4 + ROW),   # in place
    "loop_add_fusion.1": ("elementwise/loop fusion", 3, 0, 8),
    "loop_add_fusion.2": ("elementwise/loop fusion", 1, 0, 2 * 64 * 64 * 4),
    "attention": ("attention", 1, 4 * (2 * 4 * 16 * 16) * 8, 3 * 2048 + 2048 + 2 * 4 * 16 * 4),   # no workspace
    "gemm": ("matmul", 1, 2 * 32 * 16 * 48, (32 * 48 + 48 * 16 + 32 * 16) * 2),
    "copy": ("copies", 1, 0, 2 * STACK),
    "fusion-start": ("dynamic slices/updates", 1, 0, ROW + 4 + ROW),                          # reads one row
}


def test_a_small_module_counts_each_launch_once_per_loop_trip_with_its_flops_and_bytes():
  program = roofline.read_program(HLO)
  assert list(program.order) == ORDER and program.unknown_trip_counts == ()
  assert {n: (l.category, l.executions, l.flops, l.bytes) for n, l in program.launches.items()} == EXPECTED
  # Without the known trip count the condition runs before each trip (read off `i < 3`: 3 trips) as a kernel.
  unknown = roofline.read_program(HLO.replace(', backend_config={"known_trip_count":{"n":"3"}}', ""))
  assert unknown.order[1:1 + 3 * (len(BODY) + 1)] == ("lt", *BODY) * 3 and unknown.launches["lt"].executions == 3


def test_the_estimate_is_the_larger_of_compute_and_memory_time_per_launch_plus_the_launch_cost():
  out = roofline.estimate(roofline.read_program(HLO), peak_tflops=1.0, hbm_tbps=1.0, launch_us=2.0)
  rows = {r["instruction"]: r for r in out["instructions"]}
  # At 1 TFLOP/s and 1 TB/s a FLOP and a byte each take a picosecond: the dot is compute-bound, the copy is not.
  assert rows["dot"]["estimated_ms"] == pytest.approx(3 * (2 * 64 * 128 * 64 + 2e6) * 1e-9)
  assert (rows["dot"]["bound"], rows["copy"]["bound"]) == ("compute", "memory")
  assert rows["copy"]["estimated_ms"] == pytest.approx((2 * STACK + 2e6) * 1e-9)
  matmul = out["categories"]["matmul"]
  assert (matmul["launches"], matmul["gflop"]) == (4, pytest.approx((3 * 2 * 64 * 128 * 64 + 2 * 32 * 16 * 48) / 1e9))
  assert out["total"]["launches"] == len(ORDER)
  assert out["total"]["gb"] == pytest.approx(sum(e * b for _, e, _, b in EXPECTED.values()) / 1e9)


def _trace(tmp_path: Path) -> Path:
  """Two steps as a CUDA graph runs them: fusions named after their instruction (the loop's sum also runs for
  `loop_add_fusion.2`, alike but for names), the dot and GEMM as `nvjet_*`, attention as cuDNN's kernel, a memset,
  and the copy and the async slice as two memcpy kernels; durations in µs."""
  process = lambda pid, name: {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}
  step = [("loop_broadcast_fusion", 5)]
  step += [("loop_add_fusion", 2), ("nvjet_tst_64x64", 3), ("loop_dus_fusion", 2),
           ("loop_add_fusion_1", 1)] * 3
  step += [("loop_add_fusion", 7), ("cudnn_generated_sdpa_fprop", 4), ("Memset 0", 1), ("nvjet_tss_32x16", 2),
           ("memcpy32_post", 6), ("memcpy128", 3)]
  events, ts = [process(1, "/device:GPU:0"), process(9, "/host:CPU")], 0
  for _ in range(2):
    events.append({"ph": "X", "pid": 9, "tid": 1, "name": "train", "ts": ts, "dur": 100})
    for name, dur in step:
      events.append({"ph": "X", "pid": 1, "tid": 7, "name": name, "ts": ts, "dur": dur,
                     "args": {"hlo_op": "command_buffer_3"}})
      ts += dur + 1
  path = tmp_path / "plugins" / "profile" / "run" / "host.trace.json.gz"
  path.parent.mkdir(parents=True)
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": events}, f)
  return path


def test_a_trace_is_matched_to_the_instructions_and_summed_by_category(tmp_path, capsys):
  _trace(tmp_path)
  hlo = tmp_path / "step.hlo.txt.gz"
  with gzip.open(hlo, "wt") as f:
    f.write(HLO)
  out = roofline.main([str(hlo), "--trace", str(tmp_path), "--output", str(tmp_path / "roofline.json")])
  measured = {c: (v["measured_kernels"], round(v["measured_ms"] * 1e3, 6)) for c, v in out["categories"].items()}
  assert measured == {"matmul": (4, 11), "attention": (1, 4), "elementwise/loop fusion": (8, 21),
                      "reduction/input fusion": (0, 0), "copies": (1, 6), "dynamic slices/updates": (4, 9),
                      "scatter": (0, 0), "other": (1, 1)}
  rows = {r["instruction"]: r for r in out["instructions"]}
  assert {n: (r["measured_kernels"], round(r["measured_ms"] * 1e3, 6)) for n, r in rows.items()
          if "measured_ms" in r} == {"loop_broadcast_fusion": (1, 5), "loop_add_fusion": (3, 6),
                                     "loop_dus_fusion": (3, 6), "loop_add_fusion.1": (3, 3),
                                     "loop_add_fusion.2": (1, 7), "copy": (1, 6), "fusion-start": (1, 3)}
  assert out["total"]["measured_ms"] == pytest.approx(0.052) and out["unmatched_kernels"] == {"Memset 0": 0.001}
  saved = json.loads((tmp_path / "roofline.json").read_text())["categories"]
  assert {c: v["measured_ms"] for c, v in saved.items()} == {c: ms / 1e3 for c, (_, ms) in measured.items()}
  assert "total                          18" in capsys.readouterr().out


def test_bad_input_is_one_line():
  with pytest.raises(SystemExit, match="nowhere.hlo: no such file; pass the optimized HLO text"):
    roofline.main(["nowhere.hlo"])
  with pytest.raises(SystemExit, match="--peak-tflops and --hbm-tbps must be positive"):
    roofline.main(["nowhere.hlo", "--hbm-tbps", "0"])


@pytest.fixture(scope="module")
def h200():
  """The H200 run's step (ALBERT-base seq 128 batch 128, one-layer scan loop) and its trace."""
  program = roofline.read_program(roofline.read_text(str(PROFILE / "train_step.hlo.txt.gz")))
  with gzip.open(PROFILE / "base_s128_h200.trace.json.gz", "rt") as f:
    return program, roofline.measure(json.load(f), program)


def test_the_h200_step_by_hand(h200):
  """Two loops of 12 trips (forward and backward layers) whose conditions do not run; the forward stacks each
  layer's FFN activations ([16384, 3072] bf16) in place; the step zeroes two such stacks of 12 first."""
  program, _ = h200
  launches = program.launches
  assert program.unknown_trip_counts == () and "loop_compare_fusion" not in launches
  assert (launches["gemm_fusion_dot.18"].executions, launches["loop_broadcast_fusion.10"].executions) == (12, 1)
  assert launches["fusion-start.17"].bytes == 2 * 16384 * 3072 * 2 + 4   # the update read, written, the index
  assert launches["loop_broadcast_fusion.10"].bytes == 2 * 12 * 128 * 128 * 3072 * 2
  assert launches["custom-call.13"].flops == 2 * 2304 * 16384 * 768      # Q, K and V projections at once
  forward = 4 * 128 * 12 * 128 * 128 * 64
  assert (launches["dot_product_attention_fwd.5"].flops, launches["dot_product_attention_bwd.8"].flops) == (
      forward, forward * 5 // 2)
  # 1,641 kernels a step = 1,483 launches + 133 memsets + cuDNN's 2 helper kernels per backward + 1 split-K reduce.
  assert len(program.order) == sum(l.executions for l in launches.values()) == 1483


def test_the_h200_trace_gives_every_fusion_and_memcpy_its_instruction(h200):
  """Fusions by name (or the kernel of one alike), memcpys by program order: each instruction gets as many kernels
  a step as it has launches, and the 304 memcpys are the loops' 300 async slices and updates and 4 scalar copies."""
  program, measured = h200
  counts = {n: m["kernels"] for n, m in measured["instructions"].items()}
  assert counts == {n: l.executions for n, l in program.launches.items() if l.category not in ("matmul", "attention")
                    or l.fingerprint}
  categories = measured["categories"]
  assert (categories["dynamic slices/updates"]["kernels"], categories["copies"]["kernels"]) == (348, 4)
  assert (categories["matmul"]["kernels"], categories["attention"]["kernels"]) == (186, 48)
  assert list(measured["unmatched"]) == ["Memset 0"] and measured["kernels"] == 1641
