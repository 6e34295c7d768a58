"""`python -m bench.saved_activations`: what one encoder layer keeps for its backward, per token, three ways.

- `jax`: jax's own account of the residuals (`jax.ad_checkpoint.print_saved_residuals`) of one layer, summed over
  the arrays with a batch axis, less the layer's inputs. Backend-independent and exact: tests/test_ops.py holds it
  to the hand count.
- `cpu`, `gpu`, `tpu`: what the compiled program holds per layer: the temporaries of the encoder's forward +
  backward at 6 layers minus at 2, over 4 layers (under `nn.scan` each layer's residuals sit in `[L, ...]`
  stacks). `gpu` is this host's GPU, where it has one; `tpu` compiles for one TPU v4 chip (libtpu, the `tpu`
  extra; no TPU needed), and is left out without libtpu.

The residuals are what the backward reads back and, on an accelerator, what bounds the micro batch without remat:
ALBERT-base seq 128 bf16 kept 73.5 KiB per token and layer compiled for TPU before albert_jax/ops.py, 20.9 after.

  python -m bench.saved_activations                      # the default rows
  python -m bench.saved_activations --rows large:512:bfloat16:none
"""
from __future__ import annotations

import argparse
import contextlib
import io
import math
import re

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from albert_jax import model as albert_model
from albert_jax.model_config import ModelConfig, model_config_for
from bench import common

MODULE = "bench.saved_activations"
DEFAULT_ROWS = ("base:128:float32:none", "base:128:bfloat16:none", "large:512:bfloat16:none",
                "large:512:bfloat16:dots_with_no_batch_dims_saveable")
_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "s32": "int32", "u32": "uint32", "pred": "bool"}


def row_config(spec: str, **overrides) -> ModelConfig:
  """size:seq:dtype:remat -> the model config (XLA attention, 3-D dense products: the same on every backend)."""
  size, _, dtype, remat = spec.split(":")
  return model_config_for(size, dtype=dtype, remat_policy=remat, flat_matmuls=False,
                          attention_implementation="xla", **overrides)


def saved_bytes_per_token(config: ModelConfig, length: int, batch: int = 2) -> float:
  """jax's account of one layer's residuals: the arrays with a batch axis that are neither the layer's input x
  nor the padding mask (nn.scan stacks neither), in bytes per token."""
  layer = albert_model.TransformerLayer(config)
  x = jnp.zeros((batch, length, config.hidden_size), jnp.dtype(config.dtype))
  mask = jnp.ones((batch, 1, 1, length), bool)
  params = jax.eval_shape(lambda: layer.init(jax.random.key(0), x, mask, True))
  def loss(p, x):
    apply = lambda p, x: layer.apply(p, x, mask, True)
    if config.remat_policy != "none":
      apply = jax.checkpoint(apply, policy=albert_model.remat_policy(config.remat_policy))
    return apply(p, x).astype(jnp.float32).sum()
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    jax.ad_checkpoint.print_saved_residuals(loss, params, x)
  total = 0
  for line in printed.getvalue().splitlines():
    found = re.match(r"(\w+)\[([\d,]*)\] (.*)", line)
    if found and not found[3].startswith(("from the argument", "from a constant")):
      shape = [int(d) for d in found[2].split(",") if d]
      if shape and shape[0] == batch:
        total += math.prod(shape) * jnp.dtype(_DTYPES.get(found[1], found[1])).itemsize
  return total / (batch * length)


def compiled_bytes_per_token(config: ModelConfig, length: int, device, batch: int = 8) -> float:
  """The compiled encoder's forward + backward temporaries per layer and token: (6 layers - 2 layers) / 4."""
  replicated = NamedSharding(Mesh([device], ("x",)), PartitionSpec())
  def temporaries(layers: int) -> int:
    c = config.replace(num_hidden_layers=layers)
    encoder = albert_model.Encoder(c)
    mask = jnp.ones((batch, 1, 1, length), bool)
    x = jax.ShapeDtypeStruct((batch, length, c.embedding_size), jnp.float32, sharding=replicated)
    params = jax.eval_shape(lambda: encoder.init(jax.random.key(0), jnp.zeros(x.shape), mask, True))
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), params)
    loss = lambda p, x: encoder.apply(p, x, jnp.ones((batch, 1, 1, length), bool), True).astype(jnp.float32).sum()
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1)), out_shardings=replicated).lower(params, x).compile()
    return compiled.memory_analysis().temp_size_in_bytes
  return (temporaries(6) - temporaries(2)) / 4 / (batch * length)


def tpu_device():
  """One TPU v4 chip to compile for, or None without libtpu."""
  from albert_jax import topology
  try:
    return topology.tpu_devices("v4-8")[0]
  except RuntimeError as e:
    print(f"tpu column left out: {e}", flush=True)
    return None


def measure_row(spec: str, tpu) -> dict:
  config, length = row_config(spec), int(spec.split(":")[1])
  devices = {"cpu": jax.devices("cpu")[0], "gpu": jax.devices()[0] if jax.default_backend() == "gpu" else None,
             "tpu": tpu}
  row = {"row": spec, "jax_kib": saved_bytes_per_token(config, length) / 1024}
  for name, device in devices.items():
    row[f"{name}_kib"] = compiled_bytes_per_token(config, length, device) / 1024 if device is not None else None
  return row


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), help="size:seq:dtype:remat_policy")
  p.add_argument("--no-tpu", action="store_true", help="leave out the TPU column")
  p.add_argument("--results-dir", default=common.RESULTS_DIR)
  p.add_argument("--name", default="")
  args = p.parse_args(argv)
  tpu = None if args.no_tpu else tpu_device()
  rows = [measure_row(spec, tpu) for spec in args.rows]
  common.print_table(rows, (("size:seq:dtype:remat", "row", ""), ("jax KiB/token", "jax_kib", ".1f"),
                            ("CPU compiled", "cpu_kib", ".1f"), ("GPU compiled", "gpu_kib", ".1f"),
                            ("TPU v4 compiled", "tpu_kib", ".1f")),
                     "Saved for the backward, per token and encoder layer")
  payload = {"rows": rows}
  common.write_json(args, "saved_activations", MODULE, payload)
  return payload


if __name__ == "__main__":
  main()
