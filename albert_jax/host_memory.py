"""Whether a run fits this host's memory, checked twice before its first step: from shapes alone before anything
big is allocated (`check_run`), then from the compiled train step (`check_compiled`). A batch the host cannot hold
would otherwise compile for minutes and then be killed by the kernel's out-of-memory killer, with no message (and on
a shared host perhaps another process with it).

The shapes' count is a lower bound of what the run holds: every array of its host batch, twice on a CPU backend
(the loader's batch and the device batch made from it, both in host memory), and on a CPU backend, whose devices
are host memory, the training state (parameters and optimizer state) and the gradients on every local device, and
each micro batch row's input to every layer, which the backward pass keeps. The compiled step's count is XLA's own
(arguments, outputs, temporaries: attention scores, the feed-forward's intermediates, workspace) on every local
device, with the loader's copy of the batch: what the step allocates, which the lower bound leaves out.
"""
from __future__ import annotations

import math
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


def on_host(mesh: jax.sharding.Mesh) -> bool:
  """Whether the devices of `mesh` that this process drives are host memory (a CPU backend)."""
  return _local_devices(mesh)[0].platform == "cpu"


def _local_devices(mesh: jax.sharding.Mesh) -> list:
  return [d for d in mesh.devices.flat if d.process_index == jax.process_index()]


def check_run(config, split, example_row: dict[str, np.ndarray], tokens_per_row: int, abstract_state: Any,
              mesh: jax.sharding.Mesh) -> None:
  """Refuses, in one line naming the largest global batch that fits, a run whose batch (see the module docstring)
  needs more than this host's memory. `split`: the engine's BatchSplit; `example_row`: one row of every batch
  array; `abstract_state`: the train state as shapes with shardings."""
  local, host = _local_devices(mesh), on_host(mesh)
  row = sum(array.nbytes for array in example_row.values()) * (2 if host else 1)
  fixed = activations = 0
  if host:
    fixed = (compile_stats.per_device_bytes(abstract_state)
             + compile_stats.per_device_bytes(abstract_state.params)) * len(local)
    model = model_config.model_config_from(config)
    activations = model_config.layer_inputs_bytes(model, tokens_per_row) / split.accumulation_steps
  per_row, memory = row + activations, model_config.host_memory()
  needed = fixed + split.host_batch * per_row
  if needed <= memory:
    return
  fits = _largest_batch(memory - fixed, per_row, split)
  parts = [f"its {split.host_batch:,} rows on this host {split.host_batch * row / GIB:,.1f} GiB"]
  if host:
    parts += [f"parameters, optimizer state and gradients on {len(local)} CPU device(s) {fixed / GIB:,.1f} GiB",
              f"its micro batches' layer inputs {split.host_batch * activations / GIB:,.1f} GiB"]
  raise InputError(f"train.global_batch_size={split.global_batch} needs at least {needed / GIB:,.1f} GiB of this "
                   f"host's {memory / GIB:,.1f} GiB of memory ({'; '.join(parts)}): {_most(fits)}; lower "
                   "--config.train.global_batch_size.")


def check_compiled(compiled, split, abstract_state: Any, abstract_batch: dict[str, Any], mesh: jax.sharding.Mesh
                   ) -> None:
  """Refuses, in one line naming about the largest global batch that fits, a compiled train step that needs more
  than this host's memory where its devices are the host's (a CPU backend; see the module docstring). The state's
  share is fixed, the rest is taken as growing with the rows (an estimate: with several accumulation steps the
  temporaries grow with the micro batch only)."""
  local = _local_devices(mesh)
  if not on_host(mesh) or compiled.memory_analysis() is None:
    return
  step_bytes = compile_stats.memory_breakdown(compiled).total * len(local)
  loader = split.host_batch * sum(math.prod(a.shape[1:]) * np.dtype(a.dtype).itemsize
                                  for a in abstract_batch.values())
  needed, memory = step_bytes + loader, model_config.host_memory()
  if needed <= memory:
    return
  fixed = compile_stats.per_device_bytes(abstract_state) * len(local)
  fits = _largest_batch(memory - fixed, (needed - fixed) / split.host_batch, split)
  raise InputError(f"train.global_batch_size={split.global_batch} needs {needed / GIB:,.1f} GiB of this host's "
                   f"{memory / GIB:,.1f} GiB of memory (the compiled train step's own count on {len(local)} CPU "
                   f"device(s) {step_bytes / GIB:,.1f} GiB, of which the parameters and optimizer state "
                   f"{fixed / GIB:,.1f} GiB; the loader's batch {loader / GIB:,.1f} GiB): {_most(fits, 'about ')}; "
                   "lower --config.train.global_batch_size (a smaller train.micro_batch_size lowers the step's "
                   "temporaries).")


def _largest_batch(room: float, per_row: float, split) -> int:
  """The largest global batch whose rows on this host take at most `room` bytes at `per_row` each: a multiple of
  the data-parallel devices and of the processes."""
  step = split.data_parallel * split.process_count // np.gcd(split.data_parallel, split.process_count)
  return int(max(room, 0) // per_row * split.process_count // step * step)


def _most(fits: int, about: str = "") -> str:
  return f"{about}at most {fits:,} rows fit" if fits else "no batch fits beside the model: use a smaller model"
