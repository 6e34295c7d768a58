"""Whether a run fits this host's memory, checked from shapes alone before anything big is allocated: a batch the
host cannot hold would otherwise compile for minutes and then be killed by the kernel's out-of-memory killer, with
no message (and on a shared host perhaps another process with it).

What is counted is a lower bound of what the run holds: every array of its host batch, twice on a CPU backend
(the loader's batch and the device batch made from it, both in host memory), and on a CPU backend, whose devices
are host memory, the training state (parameters and optimizer state) and the gradients on every local device, and
each micro batch row's input to every layer, which the backward pass keeps.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from albert_jax import compile_stats, model_config
from albert_jax.errors import InputError

GIB = 2**30
TOKEN_BYTES = 3 * 4  # token ids, mask and token types (int32): what every job's rows hold at least


def batch_fits(global_batch: int, seq_len: int) -> tuple[bool, str]:
  """(ok, message) for this host's rows of a global batch of `seq_len`-token rows, from the config alone (before the
  job is built): their token ids, masks and token types. A length below 1 is refused by the job's own check."""
  row, memory, hosts = max(seq_len, 1) * TOKEN_BYTES, model_config.host_memory(), jax.process_count()
  needed = global_batch // hosts * row
  return (needed <= memory, f"train.global_batch_size={global_batch} rows of {seq_len} tokens need "
                            f"{needed / GIB:,.1f} GiB of this host's {memory / GIB:,.1f} GiB of memory for their "
                            f"token ids, masks and token types alone; at most {memory // row * hosts:,} rows fit")


def check_run(config, split, example_row: dict[str, np.ndarray], tokens_per_row: int, abstract_state: Any,
              mesh: jax.sharding.Mesh) -> None:
  """Refuses, in one line naming the largest global batch that fits, a run whose batch (see the module docstring)
  needs more than this host's memory. `split`: the engine's BatchSplit; `example_row`: one row of every batch
  array; `abstract_state`: the train state as shapes with shardings."""
  local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
  on_host = local[0].platform == "cpu"
  row = sum(array.nbytes for array in example_row.values()) * (2 if on_host else 1)
  fixed = activations = 0
  if on_host:
    fixed = (compile_stats.per_device_bytes(abstract_state)
             + compile_stats.per_device_bytes(abstract_state.params)) * len(local)
    model = model_config.model_config_from(config)
    activations = model_config.layer_inputs_bytes(model, tokens_per_row) / split.accumulation_steps
  per_row, memory = row + activations, model_config.host_memory()
  needed = fixed + split.host_batch * per_row
  if needed <= memory:
    return
  step = split.data_parallel * split.process_count // np.gcd(split.data_parallel, split.process_count)
  fits = max(memory - fixed, 0) // per_row * split.process_count // step * step
  parts = [f"its {split.host_batch:,} rows on this host {split.host_batch * row / GIB:,.1f} GiB"]
  if on_host:
    parts += [f"parameters, optimizer state and gradients on {len(local)} CPU device(s) {fixed / GIB:,.1f} GiB",
              f"its micro batches' layer inputs {split.host_batch * activations / GIB:,.1f} GiB"]
  most = f"at most {int(fits):,} rows fit" if fits else "no batch fits beside the model: use a smaller model"
  raise InputError(f"train.global_batch_size={split.global_batch} needs at least {needed / GIB:,.1f} GiB of this "
                   f"host's {memory / GIB:,.1f} GiB of memory ({'; '.join(parts)}): {most}; lower "
                   "--config.train.global_batch_size.")
