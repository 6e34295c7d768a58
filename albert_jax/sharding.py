"""Device mesh, logical-axis rules and global arrays (after big_vision `sharding.py` and flax lm1b `utils.py`).

Parameters carry logical axis names (model.py); `config.mesh.logical_axis_rules` maps them to the mesh axes
`data`, `fsdp` and `tensor`. The default is pure data parallelism over every device of every host: ALBERT's
12M-235M parameters and their LAMB moments fit on every chip, so only the batch is split.
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

BATCH_AXES = ("data", "fsdp")


def create_mesh(mesh_config, devices=None) -> Mesh:
  """A Mesh of `mesh_config.shape`, e.g. (("data", -1), ("fsdp", 1), ("tensor", 1)); -1 takes what is left."""
  devices = jax.devices() if devices is None else devices
  names = [name for name, _ in mesh_config.shape]
  sizes = [int(size) for _, size in mesh_config.shape]
  if names != ["data", "fsdp", "tensor"]:
    raise ValueError(f"mesh.shape axes must be data, fsdp, tensor in that order, got {names}.")
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh.shape has more than one -1 in {sizes}; give at most one axis as -1.")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices cannot be split into mesh axes {dict(zip(names, sizes))}.")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(f"mesh.shape {dict(zip(names, sizes))} needs {math.prod(sizes)} devices but "
                     f"{len(devices)} are present; use -1 for the data axis to take all of them.")
  try:
    grid = mesh_utils.create_device_mesh(sizes, devices=devices, allow_split_physical_axes=True)
  except (ValueError, NotImplementedError):  # e.g. CPU devices without a physical topology
    grid = np.asarray(devices).reshape(sizes)
  return Mesh(grid, tuple(names), axis_types=(AxisType.Auto,) * len(names))


def logical_rules(mesh_config) -> tuple[tuple[str, Any], ...]:
  return tuple((name, tuple(axes) if isinstance(axes, (list, tuple)) else axes)
               for name, axes in mesh_config.logical_axis_rules)


def data_parallel_size(mesh: Mesh) -> int:
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Examples split over the data-parallel axes; every other dimension replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules) -> Any:
  """Shardings for a tree whose leaves may be `nn.Partitioned` (shape structs are fine); unboxed leaves replicate."""
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed_tree), mesh, rules)


def make_global_batch(host_batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
  """Each process passes its own slice of the global batch (leading dimension = global / process_count)."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in host_batch.items()}
