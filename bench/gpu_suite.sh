#!/usr/bin/env bash
# The GPU measurements of issue #6 / ../shared/PERFORMANCE.md §4.1, §4.3, in parts that each end well inside a
# 10-minute call on a lent machine; JSON into bench/results/ (or RESULTS_DIR).
# NOT YET RUN ON A GPU. On CPU, tests/test_bench.py runs it with a stand-in interpreter and puts every command
# through its own parser and model configs, so a flag or size typo fails there, not in lent device time.
#
#   bash bench/gpu_suite.sh                  # every part, in order
#   bash bench/gpu_suite.sh peer profile     # the named parts: peer profile remat capacity tables
#   STEPS=20 bash bench/gpu_suite.sh peer    # fewer timed steps (a first look)
#   XLA_EXTRA="--xla_gpu_enable_latency_hiding_scheduler=true" TAG=lhs bash bench/gpu_suite.sh peer
#
# On a machine that has jax (CUDA), torch and transformers but not our other dependencies and no network (the
# lent GPU machines: Python 3.12, jax 0.11.2), fetch their wheels here first with `bash bench/device_wheels.sh`,
# carry .whl/ there and set WHEELS=.whl: the suite installs them into a private folder on PYTHONPATH.
#
# XLA flags worth trying (append via XLA_EXTRA, compare with TAG to keep both JSONs):
#   --xla_gpu_enable_latency_hiding_scheduler=true   overlap collectives/copies with compute (multi-GPU mostly)
#   --xla_gpu_enable_triton_gemm=false               cuBLAS for every matmul (sometimes faster for H=768/1024)
#   --xla_gpu_enable_cudnn_fmha=true                 older jaxlibs: cuDNN fused attention (jax.nn.dot_product_attention
#                                                    picks it itself when implementation allows)
#   --xla_gpu_autotune_level=4                       exhaustive GEMM autotuning (longer compile)
#   --xla_gpu_enable_command_buffer=                 disable CUDA graphs, to see whether launches are the bottleneck
# Also: XLA_PYTHON_CLIENT_MEM_FRACTION=.95 for the largest batches; nvidia-smi -q is recorded beside the JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
STEPS=${STEPS:-50}
TAG=${TAG:-gpu}
RESULTS_DIR=${RESULTS_DIR:-bench/results}
export XLA_FLAGS="${XLA_FLAGS:-} ${XLA_EXTRA:-}"
COMMON=(--dtype bfloat16 --steps "$STEPS" --warmup 10 --block 10 --matmul-size 8192 --results-dir "$RESULTS_DIR")
PARTS=(peer profile remat capacity tables)

run() { echo "+ $*" >&2; "$PY" -m "$@"; }

peer() {
  # ALBERT-base, seq 128 (§4.1 floor 35% MFU): ours LAMB + AdamW vs the peer, eager and torch.compile.
  run bench.train_step --size base --seq-len 128 --micro-batch 128 --peer --peer-compile both "${COMMON[@]}" \
    --name "train_step_base_s128_${TAG}"
  # ALBERT-large, seq 512 (§4.1 floor 40%; issue #15: >= 50% MFU and >= 1.5x the compiled peer).
  run bench.train_step --size large --seq-len 512 --micro-batch 32 --peer --peer-compile both "${COMMON[@]}" \
    --name "train_step_large_s512_${TAG}"
}

profile() {
  # Where that step's time goes, and the roof its own matmuls allow (each product alone, one at a time).
  run bench.step_parts --size large --seq-len 512 --micro-batch 32 "${COMMON[@]}" --name "step_parts_large_s512_${TAG}"
  # The unrolled scan (straight-line layers; ~10% faster on CPU): does it pay on the GPU too?
  run bench.train_step --size base --seq-len 128 --micro-batch 128 --scan-unroll 0 "${COMMON[@]}" \
    --name "train_step_base_s128_unrolled_${TAG}"
  # ALBERT-base seq 512 (fused attention matters here).
  run bench.train_step --size base --seq-len 512 --micro-batch 32 "${COMMON[@]}" --name "train_step_base_s512_${TAG}"
}

remat() {
  # Remat policies at a batch that needs them (ALBERT-large seq 512, micro batch 64).
  for policy in none dots_with_no_batch_dims_saveable dots_saveable full; do
    run bench.train_step --size large --seq-len 512 --micro-batch 64 --remat "$policy" "${COMMON[@]}" \
      --name "train_step_large_s512_b64_remat_${policy}_${TAG}" || echo "remat=$policy failed (OOM?)" >&2
  done
}

capacity() {
  # Paper speed table at seq 512, and the largest micro batch per size with and without remat (a compile per
  # candidate batch: the longest part).
  run bench.speed_table --seq-len 512 --micro-batch 8 --max-batch "${COMMON[@]}" --name "speed_table_${TAG}"
}

tables() {
  # Accumulation to the paper's 4096 is the same step scanned: check its overhead at 8 micro batches.
  run bench.train_step --size base --seq-len 128 --micro-batch 128 --accumulation 8 "${COMMON[@]}" \
    --name "train_step_base_s128_acc8_${TAG}"
  # Compile time vs depth (scan should be flat) and the input pipeline against the step.
  run bench.compile_depth --size base --depths 12,24 --dtype bfloat16 --results-dir "$RESULTS_DIR" \
    --name "compile_depth_${TAG}"
  run bench.input_pipeline --size base --seq-len 128 --micro-batch 128 "${COMMON[@]}" --name "input_pipeline_${TAG}"
  # Sanity anchor (PERFORMANCE.md §4.3 item 6): BERT-large seq 128 should land near NVIDIA's per-GPU numbers.
  run bench.speed_table --sizes bert_large --seq-len 128 --micro-batch 64 "${COMMON[@]}" \
    --name "anchor_bert_large_${TAG}"
}

selected=("$@")
[[ ${#selected[@]} -gt 0 ]] || selected=("${PARTS[@]}")
for part in "${selected[@]}"; do
  [[ " ${PARTS[*]} " == *" $part "* ]] || { echo "gpu_suite.sh: no part '$part'; the parts: ${PARTS[*]}" >&2; exit 2; }
done

if [[ -n "${WHEELS:-}" ]]; then
  site=${TMPDIR:-/tmp}/albert_jax_site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$WHEELS"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
mkdir -p "$RESULTS_DIR"
nvidia-smi -q > "$RESULTS_DIR/nvidia_smi_${TAG}.txt" || true
for part in "${selected[@]}"; do
  "$part"
done
