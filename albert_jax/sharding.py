"""Device mesh, logical-axis rules and global arrays (after big_vision `sharding.py` and flax lm1b `utils.py`).

Parameters carry logical axis names (model.py); `config.mesh.logical_axis_rules` maps them to the mesh axes
`data`, `fsdp` and `tensor`. The default is pure data parallelism over every device of every host: ALBERT's
12M-235M parameters and their LAMB moments fit on every chip, so only the batch is split. Across TPU slices
(multislice) `config.mesh.dcn_shape` puts the data axis on the data-centre network.
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from albert_jax.errors import InputError

BATCH_AXES = ("data", "fsdp")
DEFAULT_DCN_SHAPE = (("data", -1), ("fsdp", 1), ("tensor", 1))  # multislice: the slices split the data axis


def _axes(shape, field: str) -> tuple[list[str], list[int]]:
  """The names and sizes of `mesh.shape` or `mesh.dcn_shape`, refused in one line unless each is an (axis, size)
  pair with a positive size or -1: a 0 would divide by zero later, and negative sizes pass the product check."""
  def valid(pair) -> bool:
    return (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str)
            and isinstance(pair[1], int) and (pair[1] > 0 or pair[1] == -1))
  if not isinstance(shape, (list, tuple)) or not all(map(valid, shape)):
    raise InputError(f"{field}={shape!r}: give (axis, size) pairs, each size positive or -1 (what is left), e.g. "
                     f"--config.{field}=\"(('data', -1), ('fsdp', 1), ('tensor', 1))\".")
  return [name for name, _ in shape], [size for _, size in shape]


def create_mesh(mesh_config, devices=None) -> Mesh:
  """A Mesh of `mesh_config.shape`, e.g. (("data", -1), ("fsdp", 1), ("tensor", 1)); -1 takes what is left.

  TPU devices are laid out by their physical coordinates (`mesh_utils.create_device_mesh`). Devices of several
  slices (multislice: `slice_index` differs) are joined by the data-centre network (DCN), which is far slower than
  the chips' own links (ICI); `mesh_config.dcn_shape` says how many slices each axis spans (default: the data axis
  spans all of them), so only that axis's collectives - the gradient all-reduce for data parallelism - cross DCN.
  """
  devices = jax.devices() if devices is None else devices
  names, sizes = _axes(mesh_config.shape, "mesh.shape")
  if names != ["data", "fsdp", "tensor"]:
    raise InputError(f"mesh.shape axes must be data, fsdp, tensor in that order, got {names}.")
  if sizes.count(-1) > 1:
    raise InputError(f"mesh.shape has more than one -1 in {sizes}; give at most one axis as -1.")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise InputError(f"{len(devices)} devices cannot be split into mesh axes {dict(zip(names, sizes))}.")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise InputError(f"mesh.shape {dict(zip(names, sizes))} needs {math.prod(sizes)} devices but "
                     f"{len(devices)} are present; use -1 for the data axis to take all of them.")
  num_slices = len({getattr(d, "slice_index", 0) for d in devices})
  dcn_sizes = _dcn_sizes(getattr(mesh_config, "dcn_shape", DEFAULT_DCN_SHAPE), names, sizes, num_slices)
  if devices[0].platform != "tpu":
    try:
      grid = mesh_utils.create_device_mesh(sizes, devices=devices, allow_split_physical_axes=True)
    except (ValueError, NotImplementedError):  # e.g. CPU devices without a physical topology
      grid = np.asarray(devices).reshape(sizes)
  else:
    ici_sizes = [s // d for s, d in zip(sizes, dcn_sizes)]
    try:
      if num_slices > 1:
        grid = mesh_utils.create_hybrid_device_mesh(ici_sizes, dcn_sizes, devices, allow_split_physical_axes=True)
      else:
        grid = mesh_utils.create_device_mesh(sizes, devices=devices, allow_split_physical_axes=True)
    except (AssertionError, ValueError, NotImplementedError) as e:
      raise InputError(f"Cannot lay out mesh {dict(zip(names, ici_sizes))} per slice x {dict(zip(names, dcn_sizes))} "
                       f"slices on {len(devices)} {devices[0].device_kind} devices: {e}. For v4/v5p use one device "
                       "per chip (albert_jax.topology.tpu_devices does).") from e
  return Mesh(grid, tuple(names), axis_types=(AxisType.Auto,) * len(names))


def _dcn_sizes(dcn_shape, names: list[str], sizes: list[int], num_slices: int) -> list[int]:
  """How many slices each mesh axis spans; their product is the number of slices."""
  dcn_names, dcn = _axes(dcn_shape, "mesh.dcn_shape")
  if dcn_names != names:
    raise InputError(f"mesh.dcn_shape axes must be {', '.join(names)} in that order, got {dcn_names}.")
  if dcn.count(-1) > 1:
    raise InputError(f"mesh.dcn_shape has more than one -1 in {dcn}; give at most one axis as -1.")
  if -1 in dcn:
    dcn[dcn.index(-1)] = max(num_slices // math.prod(s for s in dcn if s != -1), 1)
  if math.prod(dcn) != num_slices:
    raise InputError(f"mesh.dcn_shape {dict(zip(names, dcn))} spans {math.prod(dcn)} slices but the devices come "
                     f"from {num_slices}; use -1 for the data axis to span all of them.")
  for name, size, slices in zip(names, sizes, dcn):
    if size % slices:
      raise InputError(f"mesh axis {name} has {size} devices, which cannot be split over {slices} slices "
                       f"(mesh.dcn_shape); make mesh.shape's {name} a multiple of {slices}.")
  return dcn


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
