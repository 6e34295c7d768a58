"""The basic install: what `convert` needs is a base dependency, so it works without the `hf` extra."""
import ast
import subprocess
import sys
from pathlib import Path


def _install_requires() -> list[str]:
  tree = ast.parse((Path(__file__).resolve().parents[1] / "setup.py").read_text())
  call = next(n for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg == "install_requires")
  return ast.literal_eval(call.value)


def test_convert_needs_only_the_base_dependencies():
  assert {"safetensors>=0.4", "google-crc32c>=1.5", "tokenizers>=0.20"} <= set(_install_requires())
  # Without the `hf` extra (no torch, no transformers) or TensorFlow the converter and its safetensors I/O import.
  code = ("import sys; sys.modules.update(torch=None, transformers=None, tensorflow=None); import albert_jax.convert, "
          "safetensors.numpy, tokenizers; print('ok')")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert result.stdout == "ok\n", result.stderr
