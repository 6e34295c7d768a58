#!/usr/bin/env bash
# The GPU measurements of issue #6 / ../shared/PERFORMANCE.md §4.1, §4.3 and issue #47 (`lead`), in parts that
# each end well inside a 10-minute call on a lent machine; JSON into bench/results/ (or RESULTS_DIR).
# Runs: an H100 on 2026-11-26 (bench/results/*_h100_before_fix.json) and an H200 on 2026-11-27 (*_h200.json,
# gpu_suite_h200.log; docs/profiling.md "GPU"), where `peer` took 4.7 minutes and `profile` about 4. On
# CPU, tests/test_bench.py runs it with a stand-in interpreter and puts every command through its own parser and
# model configs, so a flag or size typo fails there, not in lent device time.
#
#   bash bench/gpu_suite.sh lead             # the one-call comparison with the peer (below); ~6 minutes on an H200
#   bash bench/gpu_suite.sh                  # every other part, in order
#   bash bench/gpu_suite.sh peer profile     # the named parts: lead peer profile remat capacity tables
#   DRY_RUN=1 bash bench/gpu_suite.sh lead   # every command at a tiny size for a few steps (on CPU: a check)
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
#   (cuDNN fused attention needs no flag: model.attention_implementation=auto asks jax.nn.dot_product_attention
#    for it in bf16 on a GPU; --variant xla:attention_implementation=xla times XLA's instead)
#   --xla_gpu_autotune_level=4                       exhaustive GEMM autotuning (longer compile)
#   --xla_gpu_enable_command_buffer=                 disable CUDA graphs, to see whether launches are the bottleneck
# Also: XLA_PYTHON_CLIENT_MEM_FRACTION=.95 for the largest batches; nvidia-smi -q is recorded beside the JSON.
#
# A lent machine's minutes are few and its files come back only from $OUT, at most 8 of them: DEADLINE=S gives
# the whole suite S seconds (default 520, under a 10-minute call with its start; 0: none; each command gets what is
# left, and none starts with under 30 s), a failed or timed out command is reported and the next one runs, and
# ARCHIVE=F rewrites the tarball F with RESULTS_DIR after every command, so what finished comes back even when the
# call is cut off:
#   RESULTS_DIR=/tmp/results ARCHIVE=$OUT/results.tgz WHEELS=.whl bash bench/gpu_suite.sh lead
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
STEPS=${STEPS:-50}
TAG=${TAG:-gpu}
RESULTS_DIR=${RESULTS_DIR:-bench/results}
DEADLINE=${DEADLINE:-520}
ARCHIVE=${ARCHIVE:-}
DRY_RUN=${DRY_RUN:-}
# Joined without stray blanks: XLA reads a value that does not start with "--" as a file of flags.
XLA_FLAGS=$(echo ${XLA_FLAGS:-} ${XLA_EXTRA:-})
if [[ -n $XLA_FLAGS ]]; then export XLA_FLAGS; else unset XLA_FLAGS; fi
COMMON=(--dtype bfloat16 --steps "$STEPS" --warmup 10 --block 10 --matmul-size 8192 --results-dir "$RESULTS_DIR")
PARTS=(lead peer profile remat capacity tables)
DEFAULT_PARTS=(peer profile remat capacity tables)
# DRY_RUN: the same commands at a tiny size and a few steps (flags given last win), to run their code paths on CPU.
DRY=()
[[ -z $DRY_RUN ]] || DRY=(--size tiny --seq-len 32 --predictions 4 --micro-batch 2 --steps 2 --warmup 1 --block 1
                           --matmul-size 64)
failed=()

run() {
  local limit=()
  if (( DEADLINE > 0 )); then
    local left=$(( DEADLINE - SECONDS ))
    if (( left < 30 )); then
      echo "skipped, ${left}s left of DEADLINE=$DEADLINE: $*" >&2
      failed+=("skipped: $*")
      return 0
    fi
    limit=(timeout --kill-after=10 "$left")
  fi
  echo "+ [$(( SECONDS ))s] $*" >&2
  local rc=0
  "${limit[@]}" "$PY" -m "$@" "${DRY[@]}" || rc=$?
  if (( rc )); then
    echo "failed with exit $rc: $*" >&2
    failed+=("exit $rc: $*")
  fi
  if [[ -n $ARCHIVE ]]; then tar czf "$ARCHIVE.tmp" -C "$RESULTS_DIR" . && mv "$ARCHIVE.tmp" "$ARCHIVE"; fi
}

lead() {
  # Issue #47's comparison, in one call and interleaved: ours at its GPU default (every layer unrolled, one fused
  # query/key/value product, cuDNN attention) beside the three separate products, against the peer eager and
  # torch.compile'd, at ALBERT-base seq 128 and ALBERT-large seq 512; then the largest micro batch bench.gpu_compile
  # predicts for an 80 GB card (192), and where the large step's time goes (each matmul form timed alone).
  local XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
  export XLA_PYTHON_CLIENT_PREALLOCATE
  run bench.train_step --size base --seq-len 128 --micro-batch 128 --peer --peer-compile both "${COMMON[@]}" \
    --variant separate:fused_qkv=False --profile "$RESULTS_DIR/profile_base_s128_${TAG}" \
    --name "train_step_base_s128_${TAG}"
  run bench.train_step --size large --seq-len 512 --micro-batch 32 --peer --peer-compile both "${COMMON[@]}" \
    --variant separate:fused_qkv=False --name "train_step_large_s512_${TAG}"
  run bench.train_step --size large --seq-len 512 --micro-batch 192 "${COMMON[@]}" \
    --name "train_step_large_s512_b192_${TAG}"
  run bench.step_parts --size large --seq-len 512 --micro-batch 32 "${COMMON[@]}" --name "step_parts_large_s512_${TAG}"
}

peer() {
  # The peer shares the GPU with jax, which would otherwise take 75% of its memory at start (a fixed .45 share
  # left ALBERT-large seq 512 out of memory on an H100): each takes what it uses.
  local XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
  export XLA_PYTHON_CLIENT_PREALLOCATE
  # ALBERT-large, seq 512 (§4.1 floor 40%; issue #15: >= 50% MFU and >= 1.5x the compiled peer): ours LAMB and
  # AdamW (cuDNN attention, model.attention_implementation=auto), against the peer eager and torch.compile'd.
  run bench.train_step --size large --seq-len 512 --micro-batch 32 --peer --peer-compile both "${COMMON[@]}" \
    --name "train_step_large_s512_${TAG}"
  # The same at the largest micro batch that fits an 80 GB card without remat, ours alone (bench.gpu_compile: 72.6
  # GiB with every layer unrolled, the GPU default; docs/profiling.md "Compiled for an H100").
  run bench.train_step --size large --seq-len 512 --micro-batch 192 "${COMMON[@]}" \
    --name "train_step_large_s512_b192_${TAG}"
  # ALBERT-base, seq 128 (§4.1 floor 35% MFU), with XLA's attention beside cuDNN's, and a trace of our step for
  # `python -m bench.gpu_trace` (the one file a lent machine needs to send back to show where the time goes).
  run bench.train_step --size base --seq-len 128 --micro-batch 128 --peer --peer-compile both "${COMMON[@]}" \
    --variant xla:attention_implementation=xla --profile "$RESULTS_DIR/profile_base_s128_${TAG}" \
    --name "train_step_base_s128_${TAG}"
}

profile() {
  # Where that step's time goes, and the roof its own matmuls allow (each product alone, one at a time).
  run bench.step_parts --size large --seq-len 512 --micro-batch 32 "${COMMON[@]}" --name "step_parts_large_s512_${TAG}"
  # What the trace shows beyond the matmuls (docs/profiling.md "GPU"): the scan's loop (the default on a GPU is every
  # layer unrolled; `rolled` is the one-layer loop: H200 1.19x slower), a remat policy keeping only matmul outputs,
  # and the kernel-gradient layout.
  run bench.train_step --size base --seq-len 128 --micro-batch 128 "${COMMON[@]}" --variant rolled:scan_unroll=1 \
    --variant dots:remat_policy=dots_saveable --variant flat:flat_matmuls=True \
    --name "train_step_base_s128_variants_${TAG}"
  # What a layer keeps for its backward, per token, compiled for this GPU (albert_jax/ops.py; CPU and jax's account
  # beside it).
  run bench.saved_activations --no-tpu --results-dir "$RESULTS_DIR" --name "saved_activations_${TAG}"
  # ALBERT-base seq 512 (fused attention matters here).
  run bench.train_step --size base --seq-len 512 --micro-batch 32 "${COMMON[@]}" \
    --variant xla:attention_implementation=xla --name "train_step_base_s512_${TAG}"
}

remat() {
  # Remat policies at a batch that needs them (ALBERT-large seq 512, micro batch 64); one may run out of memory.
  for policy in none dots_with_no_batch_dims_saveable dots_saveable full; do
    run bench.train_step --size large --seq-len 512 --micro-batch 64 --remat "$policy" "${COMMON[@]}" \
      --name "train_step_large_s512_b64_remat_${policy}_${TAG}"
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
[[ ${#selected[@]} -gt 0 ]] || selected=("${DEFAULT_PARTS[@]}")
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
SECONDS=0
for part in "${selected[@]}"; do
  "$part"
done
if (( ${#failed[@]} )); then
  printf 'gpu_suite.sh: %d command(s) did not finish:\n' "${#failed[@]}" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
