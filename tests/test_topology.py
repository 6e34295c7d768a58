"""TPU slice names, compile-only TPU devices, meshes on them, and what the TPU compiler's output says."""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.experimental import mesh_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from albert_jax import compile_stats, sharding, topology
from albert_jax.errors import EnvironmentUserError, is_user_error
from tests.helpers import require_module

MIB = 1 << 20


@pytest.fixture(scope="module")
def libtpu():
  """The `tpu` extra (the TPU compiler): required in CI (CI set), a skip on a machine without it."""
  require_module("libtpu", extra="tpu")


def mesh_config(shape=(-1, 1, 1), dcn=(-1, 1, 1)):
  return ml_collections.ConfigDict({"shape": tuple(zip(("data", "fsdp", "tensor"), shape)),
                                    "dcn_shape": tuple(zip(("data", "fsdp", "tensor"), dcn))})


def ids(mesh_or_grid) -> list[int]:
  grid = getattr(mesh_or_grid, "devices", mesh_or_grid)
  return [d.id for d in np.asarray(grid).flat]


@pytest.mark.parametrize("name, generation, topo, chips, devices", [
    ("v3-8", "v3", "v3:2x2", 4, 8),
    ("v3-256", "v3", "v3:8x16", 128, 256),
    ("v3-1024", "v3", "v3:16x32", 512, 1024),
    ("v4-8", "v4", "v4:2x2x1", 4, 4),
    ("v4-128", "v4", "v4:4x4x4", 64, 64),
    ("v5litepod-64", "v5e", "v5e:8x8", 64, 64),
    ("v5e-16", "v5e", "v5e:4x4", 16, 16),
    ("v5p-256", "v5p", "v5p:4x4x8", 128, 128),
    ("v6e-64", "v6e", "v6e:8x8", 64, 64),
    ("v3:8x16", "v3", "v3:8x16", 128, 256),
    ("v4:4x4x4", "v4", "v4:4x4x4", 64, 64),
    ("v5e:8x8", "v5e", "v5e:8x8", 64, 64),
    ("v5:2x2x2", "v5p", "v5p:2x2x2", 8, 8),
])
def test_parse_names(name, generation, topo, chips, devices):
  t = topology.parse(name)
  assert (t.generation, t.topology, t.chips, t.devices) == (generation, topo, chips, devices)


def test_per_device_figures():
  v3, v4 = topology.parse("v3-8"), topology.parse("v4-8")
  assert v3.hbm_bytes_per_device == 16 * (1 << 30) and v3.peak_bf16_flops_per_device == 61.5e12  # a core
  assert v4.hbm_bytes_per_device == 32 * (1 << 30) and v4.megacore and v4.chip_config_name == "megacore"


@pytest.mark.parametrize("name, message", [
    ("v9-8", "Unknown TPU generation 'v9'"),
    ("tpu", "Cannot parse TPU name"),
    ("v3-100", "do not come in size 100 .TensorCores.*v3-256"),
    ("v5litepod-3", "do not come in size 3 .chips."),
    ("v4:4x4", "3 positive dimensions"),
    ("v5e:32x32", "largest v5e slice has 256"),
])
def test_bad_names(name, message):
  with pytest.raises(ValueError, match=message):
    topology.parse(name)


def test_missing_libtpu_names_the_fix(monkeypatch):
  def absent(**_):
    raise RuntimeError("JAX TPU support not installed; cannot generate TPU topology.")
  monkeypatch.setattr(topology.topologies, "get_topology_desc", lambda **kw: absent(**kw))
  with pytest.raises(EnvironmentUserError, match=r"pip install -e '\.\[tpu\]'") as raised:
    topology.tpu_devices("v3-8")
  assert is_user_error(raised.value)  # `--mode=compile` prints it as one line, not a traceback


@pytest.mark.tpu
@pytest.mark.parametrize("name, slices, count", [("v3:2x2", 1, 8), ("v4-16", 1, 8), ("v5e:2x2", 1, 4),
                                                 ("v5e:2x2", 2, 8)])
def test_device_counts(libtpu, name, slices, count):
  devices = topology.tpu_devices(name, num_slices=slices)
  assert len(devices) == count and {d.platform for d in devices} == {"tpu"}
  if topology.parse(name).megacore:
    assert {d.core_on_chip for d in devices} == {0}
  assert sorted({getattr(d, "slice_index", 0) for d in devices}) == list(range(slices))


@pytest.mark.tpu
@pytest.mark.parametrize("name, shape", [("v3:2x2", (4, 2, 1)), ("v4-16", (8, 1, 1)), ("v5e:2x2", (2, 1, 2))])
def test_mesh_follows_physical_layout(libtpu, name, shape):
  devices = topology.tpu_devices(name)
  mesh = sharding.create_mesh(mesh_config(shape), devices)
  assert ids(mesh) == ids(mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True))


@pytest.mark.tpu
def test_v3_data_axis_is_a_ring(libtpu):
  mesh = sharding.create_mesh(mesh_config(), topology.tpu_devices("v3:2x2"))
  assert ids(mesh) == [0, 1, 2, 3, 6, 7, 4, 5]  # chips (0,0) (1,0) (1,1) (0,1), both cores each: not id order


@pytest.mark.tpu
def test_two_slice_mesh_puts_slices_on_data(libtpu):
  devices = topology.tpu_devices("v5e:2x2", num_slices=2)
  mesh = sharding.create_mesh(mesh_config(), devices)
  assert dict(mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1}
  assert [d.slice_index for d in mesh.devices[:, 0, 0]] == [0] * 4 + [1] * 4
  first = [d for d in devices if d.slice_index == 0]
  assert ids(mesh.devices[:4]) == ids(mesh_utils.create_device_mesh((4, 1, 1), first))
  with pytest.raises(ValueError, match="spans 4 slices but the devices come from 2"):
    sharding.create_mesh(mesh_config(dcn=(4, 1, 1)), devices)
  with pytest.raises(ValueError, match="fsdp has 1 devices, which cannot be split over 2 slices"):
    sharding.create_mesh(mesh_config(dcn=(1, 2, 1)), devices)


def _compile_mean(mesh, rows_per_device=4, width=1024):
  x = jax.ShapeDtypeStruct((mesh.size * rows_per_device, width), jnp.float32,
                           sharding=NamedSharding(mesh, P(sharding.BATCH_AXES)))
  return x, jax.jit(lambda x: x.mean(0), out_shardings=NamedSharding(mesh, P())).lower(x).compile()


@pytest.mark.tpu
def test_batch_mean_on_one_slice(libtpu):
  mesh = sharding.create_mesh(mesh_config(), topology.tpu_devices("v3:2x2"))
  x, compiled = _compile_mean(mesh)
  stats = compile_stats.collective_stats(compiled, list(mesh.devices.flat))
  # each core sums its 4 rows, then all 8 cores all-reduce 1024 float32 partial sums: 4096 bytes
  assert [(c.kind, c.bytes, c.executions, c.group_size, c.across_slices) for c in stats.collectives] == [
      ("all-reduce", 4096, 1, 8, False)]
  assert stats.totals()["all-reduce"] == {"within_slice": 4096, "across_slices": 0}
  memory = compile_stats.memory_breakdown(compiled, {"batch": x})
  assert memory.arguments == memory.argument_groups["batch"] == 4 * 1024 * 4
  assert memory.outputs == 4096 and memory.total >= memory.arguments + memory.outputs


@pytest.mark.tpu
def test_batch_mean_across_two_slices(libtpu):
  mesh = sharding.create_mesh(mesh_config(), topology.tpu_devices("v3:2x2", num_slices=2))
  _, compiled = _compile_mean(mesh)
  stats = compile_stats.collective_stats(compiled, list(mesh.devices.flat))
  # the same 4096 bytes: reduced over the slice's 8 cores (ICI), then between the 2 slices (DCN)
  assert stats.totals()["all-reduce"] == {"within_slice": 4096, "across_slices": 4096}
  assert sum(t["within_slice"] + t["across_slices"] for t in stats.totals().values()) == 8192
  assert stats.to_dict()["collectives"][0]["bytes_per_step"] == 4096


@pytest.mark.tpu
def test_collectives_in_a_scan_count_per_layer(libtpu):
  mesh = sharding.create_mesh(mesh_config((-1, 2, 1)), topology.tpu_devices("v3:2x2"))
  x = jax.ShapeDtypeStruct((64, 256), jnp.bfloat16, sharding=NamedSharding(mesh, P(sharding.BATCH_AXES)))
  w = jax.ShapeDtypeStruct((6, 256, 256), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "fsdp", None)))

  def layers(x, ws):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0].mean(0)

  compiled = jax.jit(layers, out_shardings=NamedSharding(mesh, P())).lower(x, w).compile()
  stats = compile_stats.collective_stats(compiled, list(mesh.devices.flat))
  gathers = [c for c in stats.collectives if c.kind == "all-gather"]
  # FSDP: each of the 6 layers gathers its 256x256 bfloat16 weight from the 2 fsdp shards: 128 KiB per layer
  assert [(c.bytes, c.executions, c.group_size) for c in gathers] == [(256 * 256 * 2, 6, 2)]
  assert stats.totals()["all-gather"]["within_slice"] == 6 * 256 * 256 * 2 and not stats.unknown_trip_counts


@pytest.mark.parametrize("unroll, dots", [(6, 17), (1, 18)])
def test_matmul_flops_count_every_trip_of_a_scan(unroll, dots):
  """The gradient of 6 tanh(h @ w) layers: each layer's forward dot and its two backward dots (2 x 64 x 128 x 128
  FLOPs each), except the gradient of the first layer's input, which unrolled code drops and the loop body computes
  anyway. XLA's cost_analysis() counts the loop body once."""
  x, ws = jnp.ones((64, 128)), jnp.ones((6, 128, 128))
  grad = jax.grad(lambda ws: jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws, unroll=unroll)[0].sum())
  compiled = jax.jit(grad).lower(ws).compile()
  assert compile_stats.matmul_flops(compiled) == (dots * 2 * 64 * 128 * 128, ())


@pytest.mark.tpu
def test_matmul_flops_of_batched_products_the_tpu_writes_as_convolutions(libtpu):
  """8 x 4 products of (64 x 32) by (32 x 64): the TPU compiler writes them as one convolution whose input is
  dilated by its window (one real tap per output)."""
  mesh = sharding.create_mesh(mesh_config(), topology.tpu_devices("v3:2x2"))
  q = jax.ShapeDtypeStruct((64, 64, 4, 32), jnp.bfloat16, sharding=NamedSharding(mesh, P(sharding.BATCH_AXES)))
  compiled = jax.jit(lambda q, k: jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
                     ).lower(q, q).compile()
  assert compile_stats.matmul_flops(compiled) == (8 * 4 * 2 * 64 * 64 * 32, ())


HLO = """HloModule synthetic, num_partitions=4

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%cond (p: (s32[], f32[256])) -> pred[] {
  %p = (s32[], f32[256]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (q: (s32[], f32[256])) -> (s32[], f32[256]) {
  %q = (s32[], f32[256]) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %v = f32[256] get-tuple-element(%q), index=1
  %ar = f32[256] all-reduce(%v), replica_groups=[2,2]<=[2,2]T(1,0), to_apply=%add
  ROOT %t = (s32[], f32[256]) tuple(%j, %ar)
}

ENTRY %main (x: f32[64]) -> f32[256] {
  %x = f32[64] parameter(0)
  %ag = (f32[64], f32[256]) all-gather-start(%x), replica_groups={{0,1,2,3}}, dimensions={0}
  %agd = f32[256] all-gather-done(%ag)
  %zero = s32[] constant(1)
  %init = (s32[], f32[256]) tuple(%zero, %agd)
  %w = (s32[], f32[256]) while(%init), condition=%cond, body=%body
  %r = f32[256] get-tuple-element(%w), index=1
  ROOT %cp = f32[256] collective-permute(%r), source_target_pairs={{0,1},{1,0},{2,3},{3,2}}
}
"""


def test_hlo_forms_and_slices_from_replica_groups():
  devices = [types.SimpleNamespace(slice_index=s) for s in (0, 0, 1, 1)]
  stats = compile_stats.collective_stats(HLO, devices)
  got = {c.kind: (c.bytes, c.executions, c.group_size, c.across_slices) for c in stats.collectives}
  assert got == {
      "all-gather": (1024, 1, 4, True),           # async start counted once; the gathered buffer; spans slices
      "all-reduce": (1024, 2, 2, True),           # counter 1 -> 3: two trips; groups {0,2},{1,3} cross slices
      "collective-permute": (1024, 1, 2, False),  # pairs stay inside a slice
  }
  assert compile_stats.collective_stats(HLO).totals()["all-reduce"] == {"within_slice": 2048, "across_slices": 0}


def test_mesh_form_replica_groups():
  rest = "%v), replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0'}, to_apply=%add"
  assert compile_stats._groups(rest, 8) == [[0, 1], [2, 3], [4, 5], [6, 7]]
  assert compile_stats._groups("%v), replica_groups=mesh['a'=4,'b'=2] {'b'}", 8) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_out_of_memory_message():
  error = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                       "temporaries (16.06G) exceeds available HBM (15.48G).")
  assert compile_stats.out_of_memory(error) == {"required_bytes": int(16.06 * (1 << 30)),
                                                "available_bytes": int(15.48 * (1 << 30))}
  assert compile_stats.out_of_memory(ValueError("other")) is None
