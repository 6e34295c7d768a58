#!/usr/bin/env bash
# Wheels of the dependencies a lent GPU machine lacks, fetched here (it has no network) into .whl/ for
# `WHEELS=.whl bash bench/gpu_suite.sh` there. That machine has Python 3.12 with jax + CUDA, numpy, scipy, torch,
# transformers, safetensors and sentencepiece (../.library/device/KINDS.md): pip resolves our other dependencies
# at constraints.txt's versions against its jax, then drops what it already has. About 37 MB, under the 64 MiB a
# call can carry.
#
#   bash bench/device_wheels.sh                                   # the defaults below
#   DEVICE_JAX=0.11.2 DEVICE_NUMPY=2.5.2 DEST=.whl bash bench/device_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DEST=${DEST:-.whl}
DEVICE_PYTHON=${DEVICE_PYTHON:-3.12}
DEVICE_JAX=${DEVICE_JAX:-0.11.2}
DEVICE_NUMPY=${DEVICE_NUMPY:-2.5.2}
ON_DEVICE='jax|jaxlib|libtpu|numpy|scipy|ml_dtypes|opt_einsum|torch|transformers|safetensors|sentencepiece|tokenizers'
ON_DEVICE+='|huggingface_hub'  # tokenizers' dependency: the device's transformers goes with its own
# Imported only for `tfds:` corpora, which no benchmark reads; its pyarrow alone would be ~40 MB.
NOT_NEEDED='tensorflow-datasets'

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
grep -v -i -E "^($ON_DEVICE)==" constraints.txt > "$constraints"
platforms=()
for tag in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
           manylinux_2_34; do
  platforms+=(--platform "${tag}_x86_64")
done
# setup.py's install_requires, less what the device has (its jax is newer than their cap) and what no benchmark needs.
wanted=$(SKIP="$ON_DEVICE|$NOT_NEEDED" "$PY" -c '
import ast, os, re
keyword = next(n for n in ast.walk(ast.parse(open("setup.py").read())) if getattr(n, "arg", "") == "install_requires")
skip = re.compile("(" + os.environ["SKIP"] + ")([^a-z0-9_-]|$)", re.I)
print("\n".join(r for r in ast.literal_eval(keyword.value) if not skip.match(r)))')
mapfile -t requirements <<< "$wanted"
rm -rf "$DEST"
"$PY" -m pip download -q -c "$constraints" --only-binary=:all: --implementation cp --python-version "$DEVICE_PYTHON" \
  "${platforms[@]}" -d "$DEST" "jax==$DEVICE_JAX" "jaxlib==$DEVICE_JAX" "numpy==$DEVICE_NUMPY" "${requirements[@]}"
for wheel in "$DEST"/*.whl; do
  if [[ $(basename "$wheel") =~ ^($ON_DEVICE)- ]]; then rm "$wheel"; fi
done
echo "$(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1), in $DEST/: carry it, then WHEELS=$DEST bash bench/gpu_suite.sh"
