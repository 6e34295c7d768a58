"""Cloud TPU slice names -> JAX topologies and compile-only TPU devices (after MaxText `accelerator_to_spec_map.py`).

`tpu_devices("v3-256")` returns the 256 devices of a v3-256 slice without a TPU: libtpu describes the topology and
`jax.jit(...).lower(...).compile()` targets it from a CPU host. Cloud names count TensorCores for v2-v4 and v5p
(`v4-128` is 64 chips) and chips for v5e and v6e (`v5litepod-64` is 64 chips). v3 shows one JAX device per
TensorCore (two per chip); v4 and v5p run "megacore" (both TensorCores of a chip are one JAX device), as on a real
TPU VM; v5e and v6e have one TensorCore per chip.
"""
from __future__ import annotations

import dataclasses
import glob
import math
import os
import re

import jax
from jax.experimental import topologies

from albert_jax.errors import EnvironmentUserError, InputError

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class _Generation:
  names: tuple[str, ...]          # accelerator-type prefixes, first = canonical ("v5litepod", "v5e")
  topology_prefix: str            # prefix of the JAX topology string ("v5e" in "v5e:8x8")
  counts_cores: bool              # the number in the Cloud name counts TensorCores (2 per chip), not chips
  devices_per_chip: int           # JAX devices per chip (1 = megacore or one TensorCore per chip)
  megacore: bool                  # get_topology_desc needs chip_config_name="megacore"
  rank: int                       # 2-D torus (v3, v5e, v6e) or 3-D (v4, v5p)
  hbm_bytes_per_chip: int         # Cloud TPU system-architecture pages
  peak_bf16_flops_per_chip: float  # same pages
  all_reduce_bytes_per_second_per_chip: float  # same pages: "all-reduce bandwidth per Pod" over the Pod's chips
  dcn_bytes_per_second_per_chip: float         # same pages: data-centre network bandwidth per chip
  shapes: dict[int, str]          # Cloud name number -> default slice shape (chips per axis)


# Figures from cloud.google.com/tpu/docs/{v3,v4,v5e,v5p,v6e} (per chip): v3 123 TFLOP/s and 32 GiB; v4 275 and
# 32 GiB; v5e 197 and 16 GB; v5p 459 and 95 GB; v6e 918 and 32 GB (read as GiB). The compiler keeps part of the HBM
# for itself: on v3 it reports 15.48 GiB available of a core's 16 GiB. All-reduce bandwidth per Pod over its chips:
# v3 340 TB/s / 1024, v4 1.1 PB/s / 4096, v5e 51.2 TB/s / 256, v6e 102.4 TB/s / 256; v5p, not given, is half its
# 1,200 GB/s bidirectional interconnect per chip, the ratio of v5e's and v6e's figures. Data-centre network per chip:
# v5p 50 Gbit/s, v5e 6.4 Tbit/s per Pod of 256 chips (25 Gbit/s); the pages give none for v3, v4 and v6e, which take
# v5e's 25 Gbit/s.
_GENERATIONS = {
    "v3": _Generation(("v3",), "v3", True, 2, False, 2, 32 * GiB, 123e12, 340e12 / 1024, 25e9 / 8, {
        8: "2x2", 32: "4x4", 64: "4x8", 128: "8x8", 256: "8x16", 512: "16x16", 1024: "16x32", 2048: "32x32"}),
    "v4": _Generation(("v4",), "v4", True, 1, True, 3, 32 * GiB, 275e12, 1.1e15 / 4096, 25e9 / 8, {
        8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8", 384: "4x4x12",
        512: "4x8x8", 1024: "8x8x8", 1536: "8x8x12", 2048: "8x8x16", 4096: "8x16x16"}),
    "v5e": _Generation(("v5litepod", "v5e"), "v5e", False, 1, False, 2, 16 * GiB, 197e12, 51.2e12 / 256, 25e9 / 8, {
        1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}),
    "v5p": _Generation(("v5p",), "v5p", True, 1, True, 3, 95 * GiB, 459e12, 600e9, 50e9 / 8, {
        8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8", 512: "4x8x8",
        1024: "8x8x8", 2048: "8x8x16", 4096: "8x16x16", 8192: "16x16x16", 12288: "16x16x24"}),
    "v6e": _Generation(("v6e",), "v6e", False, 1, False, 2, 32 * GiB, 918e12, 102.4e12 / 256, 25e9 / 8, {
        1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}),
}
_BY_NAME = {name: gen for gen, g in _GENERATIONS.items() for name in g.names}
_BY_TOPOLOGY_PREFIX = {g.topology_prefix: gen for gen, g in _GENERATIONS.items()}
_BY_TOPOLOGY_PREFIX["v5"] = "v5p"  # libtpu's own spelling of v5p topologies ("v5:4x4x4")
_FORMS = ("Cloud TPU names: v3-256, v4-128, v5litepod-64 (or v5e-64), v5p-256, v6e-64 (cores for v3/v4/v5p, chips "
          "for v5e/v6e); JAX topology strings: v3:8x16, v4:4x4x4, v5e:8x8, v5p:4x4x8, v6e:16x16 (chips per axis)")


@dataclasses.dataclass(frozen=True)
class TpuTopology:
  """One slice: what the name means in chips and JAX devices, and what each device has."""
  name: str                      # as given, e.g. "v3-256"
  generation: str                # "v3" | "v4" | "v5e" | "v5p" | "v6e"
  topology: str                  # JAX topology string, e.g. "v3:8x16"
  chips: int
  devices: int                   # JAX devices in the slice (per slice when several)
  hbm_bytes_per_device: int      # nominal; the compiler reserves some (v3: 15.48 of 16 GiB usable)
  peak_bf16_flops_per_device: float
  megacore: bool
  all_reduce_bytes_per_second_per_chip: float
  dcn_bytes_per_second_per_chip: float

  @property
  def chip_config_name(self) -> str:
    return "megacore" if self.megacore else "default"


def parse(name: str) -> TpuTopology:
  """A Cloud TPU name (`v3-256`, `v5litepod-64`) or a JAX topology string (`v3:8x16`) -> TpuTopology."""
  text = name.strip().lower()
  if m := re.fullmatch(r"([a-z0-9]+)-(\d+)", text):
    gen = _BY_NAME.get(m[1])
    if gen is None:
      raise InputError(f"Unknown TPU generation {m[1]!r} in {name!r}. Valid forms: {_FORMS}.")
    g = _GENERATIONS[gen]
    number = int(m[2])
    if number not in g.shapes:
      unit = "TensorCores" if g.counts_cores else "chips"
      raise InputError(f"{gen} slices do not come in size {number} ({unit}); known sizes: "
                       f"{', '.join(f'{g.names[0]}-{n}' for n in g.shapes)}. For another shape give a JAX topology "
                       f"string such as {g.topology_prefix}:{g.shapes[max(g.shapes)]}.")
    shape = g.shapes[number]
  elif m := re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+)+)", text):
    gen = _BY_TOPOLOGY_PREFIX.get(m[1])
    if gen is None:
      raise InputError(f"Unknown TPU generation {m[1]!r} in topology {name!r}. Valid forms: {_FORMS}.")
    g = _GENERATIONS[gen]
    shape = m[2]
    dims = [int(d) for d in shape.split("x")]
    if len(dims) != g.rank or min(dims) < 1:
      example = "x".join(["4"] * g.rank)
      raise InputError(f"{gen} topologies have {g.rank} positive dimensions (e.g. {g.topology_prefix}:{example}), "
                       f"got {name!r}.")
    max_chips = max(g.shapes) // (2 if g.counts_cores else 1)
    if math.prod(dims) > max_chips:
      raise InputError(f"{name!r} has {math.prod(dims)} chips; the largest {gen} slice has {max_chips}.")
  else:
    raise InputError(f"Cannot parse TPU name {name!r}. Valid forms: {_FORMS}.")
  chips = math.prod(int(d) for d in shape.split("x"))
  return TpuTopology(
      name=name, generation=gen, topology=f"{g.topology_prefix}:{shape}", chips=chips,
      devices=chips * g.devices_per_chip, hbm_bytes_per_device=g.hbm_bytes_per_chip // g.devices_per_chip,
      peak_bf16_flops_per_device=g.peak_bf16_flops_per_chip / g.devices_per_chip, megacore=g.megacore,
      all_reduce_bytes_per_second_per_chip=g.all_reduce_bytes_per_second_per_chip,
      dcn_bytes_per_second_per_chip=g.dcn_bytes_per_second_per_chip)


def answer_libtpus_host_query() -> None:
  """Off a TPU VM, libtpu (the `tpu` extra) asks the cloud metadata server what this host is and prints warnings
  and an "unexpected worker hostname" error before jax falls back to the CPU. These defaults answer it; variables
  already set are left alone. Read when libtpu first loads in the process."""
  for variable, value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_WORKER_HOSTNAMES", "localhost"),
                          ("TPU_ACCELERATOR_TYPE", "v3-8")):
    os.environ.setdefault(variable, value)


def quiet_libtpu_off_tpu_vms() -> None:
  """`answer_libtpus_host_query` on a host without TPU chips (a TPU VM shows them as /dev/accel* up to v5e, under
  /dev/vfio from v5p; there libtpu must ask the metadata server)."""
  if not glob.glob("/dev/accel*") and not os.path.isdir("/dev/vfio"):
    answer_libtpus_host_query()


def tpu_devices(name: str | TpuTopology, num_slices: int = 1) -> list:
  """The compile-only devices of `num_slices` slices of `name` (no TPU needed, libtpu must be installed).

  With several slices each device has a `slice_index`; `sharding.create_mesh` then puts the slices on the data
  axis (the data-centre network). Use these devices only to lower and compile, never to run. libtpu lets one
  process per host load it (/tmp/libtpu_lockfile); compiling needs no chip, so unless the caller chose otherwise
  this sets ALLOW_MULTIPLE_LIBTPU_LOAD=1 and compiles run beside each other (and beside a job on a TPU VM).
  """
  topo = parse(name) if isinstance(name, str) else name
  if num_slices < 1:
    raise InputError(f"num_slices must be at least 1, got {num_slices}.")
  kwargs = {"chip_config_name": topo.chip_config_name, "num_slices": num_slices}
  if topo.chips < 4:  # libtpu's default host is 2x2 chips; a smaller slice is its own host
    dims = [int(d) for d in topo.topology.split(":")[1].split("x")]
    kwargs["chips_per_host_bounds"] = tuple(dims + [1] * (3 - len(dims)))
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # read when libtpu first loads in this process
  answer_libtpus_host_query()  # describing a topology needs no host
  try:
    devices = topologies.get_topology_desc(topology_name=topo.topology, platform="tpu", **kwargs).devices
  except jax.errors.JaxRuntimeError as e:
    if "lockfile" in str(e):
      raise RuntimeError(f"Another process on this host holds libtpu ({e}). Set ALLOW_MULTIPLE_LIBTPU_LOAD=1 before "
                         "libtpu is first loaded in this process (a compile needs no TPU chip).") from e
    raise InputError(f"libtpu rejected topology {topo.topology!r} ({topo.name!r}): {e}. Use a shape that the "
                     f"generation comes in; {_FORMS}.") from e
  except RuntimeError as e:  # jax: "JAX TPU support not installed; cannot generate TPU topology."
    raise EnvironmentUserError(f"The TPU compiler (libtpu) is not installed, so {topo.name!r} cannot be described "
                               f"on this host ({e}). Install it with: pip install -e '.[tpu]'") from e
  expected = topo.devices * num_slices
  if len(devices) != expected:
    raise RuntimeError(f"libtpu described {len(devices)} devices for {topo.topology!r} x {num_slices} slice(s); "
                       f"expected {expected}. Is the installed libtpu the one the `tpu` extra pins?")
  return list(devices)
