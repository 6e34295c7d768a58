#!/usr/bin/env bash
# An interpreter for bench.gpu_compile: a venv at DIR (default .venv-gpu-compile) holding jax's CUDA 13 plugin at
# the installed jax's version, which reads every other package from the current interpreter's site-packages
# (a .pth file). Kept apart because the plugin, beside the CPU tests, prints an error at every jax start on a host
# without a GPU. Compiling also needs CUDA 13's ptxas on PATH (or pip install nvidia-cuda-nvcc there).
#
#   bash bench/gpu_compile_env.sh [DIR]   # then DIR/bin/python -m bench.gpu_compile ...
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.venv-gpu-compile}
PY=${PY:-python}
jax_version=$("$PY" -c "import jax; print(jax.__version__)")
site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$PY" -m venv "$DIR"
"$DIR/bin/python" -m pip install -q --no-deps "jax-cuda13-plugin==$jax_version" "jax-cuda13-pjrt==$jax_version"
own_site=$("$DIR/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$site" > "$own_site/albert_jax_base_packages.pth"
command -v ptxas >/dev/null || echo "gpu_compile_env.sh: no ptxas on PATH; compiling for the GPU will fail" >&2
echo "$DIR/bin/python"
