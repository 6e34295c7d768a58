"""Model core: exact parameter counts, sharing semantics, scan == loop, dtypes, remat, clear errors."""
import collections
import dataclasses
import json
import subprocess
import sys

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax import flops
from albert_jax.model import (AlbertForPreTraining, AlbertModel, Embeddings, abstract_params, count_params,
                              flat_dot_general, init_params, layers_per_group)
from albert_jax.model_config import MODEL_SIZES, ModelConfig, model_config_for
from tests.helpers import TINY_MODEL as TINY, model_batch as batch

# ../shared/REFERENCE.md b.4 (V=30000, P=512, T=2): (backbone, backbone + MLM + SOP heads).
EXACT_COUNTS = {
    "base": (11_683_584, 11_813_810),
    "large": (17_683_968, 17_847_474),
    "xlarge": (58_724_864, 59_021_490),
    "xxlarge": (222_595_584, 223_158_450),
}


def backbone_count(config: ModelConfig) -> int:
  return count_params(abstract_params(AlbertModel(config)))


@pytest.mark.parametrize("size", sorted(EXACT_COUNTS))
def test_paper_sizes_have_exact_parameter_counts(size):
  for flavour in (size, f"{size}_v1", f"{size}_v2"):
    config = model_config_for(flavour)
    params = abstract_params(AlbertForPreTraining(config))
    assert (count_params(params["albert"]), count_params(params)) == EXACT_COUNTS[size]


@pytest.mark.parametrize("embedding_size,expected", [(64, 9.68e6), (128, 11.68e6), (256, 15.69e6), (768, 31.11e6)])
def test_embedding_size_ablation_counts(embedding_size, expected):
  # E=768 keeps no projection (E == H), as the original.
  count = backbone_count(model_config_for("base", embedding_size=embedding_size))
  assert round(count / 1e6, 2) == expected / 1e6


@pytest.mark.parametrize("sharing,expected", [("attention", 63.65e6), ("ffn", 37.69e6), ("none", 89.65e6)])
def test_sharing_ablation_counts(sharing, expected):
  count = backbone_count(model_config_for("base", sharing=sharing))
  assert round(count / 1e6, 2) == expected / 1e6


def test_bert_large_counts():
  assert backbone_count(model_config_for("bert_large")) == 334_607_360
  # transformers' BertModel at BERT's vocabulary (30522), same formula.
  assert backbone_count(model_config_for("bert_large", vocab_size=30522)) == 335_141_888
  assert backbone_count(model_config_for("bert_xlarge")) == 1_275_291_648


def test_every_named_size_builds():
  for size in MODEL_SIZES:
    assert count_params(abstract_params(AlbertModel(model_config_for(size)))) > 0


def test_layers_per_group_follows_the_original_rule():
  # layer l uses group int(l / L * G)
  assert layers_per_group(12, 1) == [12]
  assert layers_per_group(4, 2) == [2, 2]
  assert layers_per_group(5, 2) == [3, 2]
  assert layers_per_group(6, 6) == [1] * 6


def test_train_flops_per_token_matches_performance_md():
  # ../shared/PERFORMANCE.md §3, seq 512, 20 predictions (G = 1e9 FLOPs per token).
  table = {"base": 0.568, "large": 1.965, "xlarge": 7.552, "xxlarge": 14.802}
  for size, expected in table.items():
    assert round(flops.train_flops_per_token(model_config_for(size), 512, 20) / 1e9, 3) == expected
  assert round(flops.train_flops_per_token(model_config_for("base"), 128, 20) / 1e9, 3) == 0.528
  # 72·L·H² + 12·L·S·H + 6·E·H + (M/S)·6·(H·E + E·V), by hand for a small case.
  c = model_config_for("tiny")
  l, h, s, e, v, m = 4, 64, 128, 32, 30000, 20
  assert flops.train_flops_per_token(c, s, m) == pytest.approx(
      72 * l * h * h + 12 * l * s * h + 6 * e * h + m / s * 6 * (h * e + e * v))


def run(config, params, inputs, **kw):
  return AlbertForPreTraining(config).apply({"params": params}, **inputs, **kw)


@pytest.fixture(scope="module")
def tiny_params():
  return nn.unbox(init_params(AlbertForPreTraining(TINY), jax.random.key(0)))


def test_output_shapes_and_masked_positions(tiny_params):
  inputs = batch()
  out = run(TINY, tiny_params, inputs)
  assert out["mlm_logits"].shape == (3, 12, 97) and out["sop_logits"].shape == (3, 2)
  positions = jnp.array([[1, 5], [2, 3], [0, 11]])
  sparse = run(TINY, tiny_params, inputs, masked_lm_positions=positions)
  assert sparse["mlm_logits"].shape == (3, 2, 97)
  dense_at = np.take_along_axis(np.asarray(out["mlm_logits"]), np.asarray(positions)[..., None], axis=1)
  np.testing.assert_allclose(sparse["mlm_logits"], dense_at, atol=1e-5)


def test_one_shared_layer_and_changing_it_changes_every_layer(tiny_params):
  encoder = tiny_params["albert"]["encoder"]
  assert sorted(encoder) == ["embedding_hidden_mapping_in", "group_0"]
  assert encoder["group_0"]["inner_0"]["attention"]["query"]["kernel"].shape == (64, 64)  # no layer axis
  # Capture every layer application's output (loop path: same params as scan); perturb the single shared
  # kernel; all of them move.
  def layer_outputs(params):
    _, state = AlbertModel(TINY.replace(scan_layers=False)).apply(
        {"params": params["albert"]}, **batch(), capture_intermediates=lambda m, _: m.name == "inner_0",
        mutable=["intermediates"])
    return np.stack(jax.tree.leaves(state))
  base = layer_outputs(tiny_params)
  assert base.shape[0] == TINY.num_hidden_layers  # one output per application of the shared layer
  flat = flax.traverse_util.flatten_dict(tiny_params, sep="/")
  kernel = "albert/encoder/group_0/inner_0/ffn/intermediate/kernel"
  noise = 0.05 * jax.random.normal(jax.random.key(9), flat[kernel].shape)  # (a constant shift would cancel
  perturbed = flax.traverse_util.unflatten_dict({**flat, kernel: flat[kernel] + noise}, sep="/")  # after LN)
  moved = np.abs(layer_outputs(perturbed) - base).reshape(TINY.num_hidden_layers, -1).max(axis=1)
  assert (moved > 1e-3).all()


@pytest.mark.parametrize("overrides", [{}, {"num_hidden_groups": 2}, {"inner_group_num": 2},
                                       {"sharing": "none"}, {"embedding_size": 64}])
def test_scan_equals_python_loop(overrides):
  config = TINY.replace(**overrides)
  params = nn.unbox(init_params(AlbertForPreTraining(config), jax.random.key(1)))
  scanned = run(config, params, batch())
  looped = run(config.replace(scan_layers=False), params, batch())
  for key in scanned:
    np.testing.assert_allclose(scanned[key], looped[key], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("unroll", [2, 3, 4])  # TINY has 4 layers: 2 loop iterations, a remainder, straight-line
def test_unrolled_scan_equals_scan_forward_and_gradient(unroll):
  params = nn.unbox(init_params(AlbertForPreTraining(TINY), jax.random.key(1)))
  def loss_and_grad(config):
    model = AlbertForPreTraining(config)
    loss = lambda p: model.apply({"params": p}, **batch())["mlm_logits"].std()
    return jax.value_and_grad(loss)(params)
  (loss, grads), (unrolled_loss, unrolled_grads) = loss_and_grad(TINY), loss_and_grad(TINY.replace(scan_unroll=unroll))
  np.testing.assert_allclose(unrolled_loss, loss, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), unrolled_grads, grads)


def _kernel_gradient_contractions(jaxpr) -> list[int]:
  """How many dimensions each dot_general of a (nested) jaxpr contracts, for dots without batch dimensions."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (contract, _), (batch_dims, _) = eqn.params["dimension_numbers"]
      if not batch_dims:
        found.append(len(contract))
    for sub in jax.core.jaxprs_in_params(eqn.params):
      found += _kernel_gradient_contractions(sub)
  return found


def test_flat_matmuls_give_the_same_numbers_with_one_dimension_contracted():
  params = nn.unbox(init_params(AlbertForPreTraining(TINY), jax.random.key(1)))
  positions = jnp.asarray([[1, 3, 5], [2, 4, 6], [0, 7, 11]])
  def loss_and_grad(flat):
    model = AlbertForPreTraining(TINY.replace(flat_matmuls=flat))
    return jax.value_and_grad(lambda p: model.apply({"params": p}, **batch(), masked_lm_positions=positions)[
        "mlm_logits"].std())
  flat, nd = loss_and_grad(True), loss_and_grad(False)
  # Every dense kernel's (and the tied decoder's) gradient contracts the tokens as one dimension, not [B, T]...
  assert set(_kernel_gradient_contractions(jax.make_jaxpr(flat)(params).jaxpr)) == {1}
  assert 2 in _kernel_gradient_contractions(jax.make_jaxpr(nd)(params).jaxpr)
  assert TINY.flat_matmuls is None and jax.default_backend() == "cpu"  # None: on, for the backend traced for
  assert set(_kernel_gradient_contractions(jax.make_jaxpr(loss_and_grad(None))(params).jaxpr)) == {1}
  # ...and the function is the same: the forward bit for bit, the gradients to rounding.
  (loss, grads), (reference_loss, reference_grads) = flat(params), nd(params)
  assert loss == reference_loss
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-7, rtol=1e-5), grads, reference_grads)


def _kernel_shapes(jaxpr) -> list[tuple[int, ...]]:
  """The right operand's shape of each dot_general without batch dimensions in a (nested) jaxpr."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general" and not eqn.params["dimension_numbers"][1][0]:
      found.append(tuple(eqn.invars[1].aval.shape))
    for sub in jax.core.jaxprs_in_params(eqn.params):
      found += _kernel_shapes(sub)
  return found


def test_fused_qkv_is_one_product_of_the_same_parameters_with_the_same_numbers():
  """The query/key/value projections as one [H, 3, H] product: the parameters (tree, initial values) of three
  nn.Dense layers, the forward bit for bit, the gradients to float32 rounding (dx sums one K=3H product instead of
  three), as 3-D and as 2-D products (flat_matmuls)."""
  h = TINY.hidden_size
  model = lambda fused, flat=None: AlbertForPreTraining(TINY.replace(fused_qkv=fused, flat_matmuls=flat))
  params = init_params(model(True), jax.random.key(1))
  jax.tree.map(np.testing.assert_array_equal, nn.unbox(params), nn.unbox(init_params(model(False), jax.random.key(1))))
  attention = params["albert"]["encoder"]["group_0"]["inner_0"]["attention"]
  assert {n: attention[n]["kernel"].names for n in ("query", "key", "value")} == {
      n: ("embed", "qkv") for n in ("query", "key", "value")}
  params = nn.unbox(params)
  for flat in (True, False):
    loss_and_grad = lambda fused: jax.jit(jax.value_and_grad(
        lambda p: model(fused, flat).apply({"params": p}, **batch())["mlm_logits"].std()))(params)
    kernels = lambda fused: collections.Counter(_kernel_shapes(jax.make_jaxpr(model(fused, flat).apply)(
        {"params": params}, **batch()).jaxpr))
    # The forward's layer body (one scan iteration) and pooler: the stacked kernel [H, 3, H] ([H, 3H] as 2-D
    # products); H x H: attention's output dense, the pooler, and the three projections when separate.
    stacked = (h, 3 * h) if flat else (h, 3, h)
    assert (kernels(True)[stacked], kernels(True)[(h, h)]) == (1, 2), flat
    assert (kernels(False)[stacked], kernels(False)[(h, h)]) == (0, 5), flat
    (loss, grads), (reference_loss, reference_grads) = loss_and_grad(True), loss_and_grad(False)
    assert loss == reference_loss
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-7, rtol=1e-5), grads, reference_grads)


def test_fused_qkv_none_is_one_product_except_where_the_step_is_traced_for_a_tpu(monkeypatch):
  from albert_jax import model
  for backend, expected in (("cpu", True), ("gpu", True), ("tpu", False)):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert TINY.fused_qkv is None and model.fused_qkv(TINY) is expected
    assert [model.fused_qkv(TINY.replace(fused_qkv=v)) for v in (True, False)] == [True, False]


def test_attention_auto_is_cudnn_on_a_gpu_in_half_precision_where_cudnn_takes_the_shapes(monkeypatch):
  from albert_jax import model
  odd_heads = dict(hidden_size=60, num_attention_heads=6)   # head size 10: cuDNN wants a multiple of 8
  for backend, changes, length, expected in [
      ("cpu", {}, 128, "xla"), ("tpu", {}, 128, "xla"), ("gpu", dict(dtype="float32"), 128, "xla"),
      ("gpu", {}, 128, "cudnn"), ("gpu", dict(dtype="float16"), 128, "cudnn"), ("gpu", {}, 127, "xla"),
      ("gpu", odd_heads, 128, "xla"), ("gpu", dict(hidden_size=1024, num_attention_heads=4), 128, "xla"),
      ("gpu", dict(attention_probs_dropout_prob=0.1), 128, "xla")]:  # cuDNN has no dropout of the probabilities
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    config = TINY.replace(**{"dtype": "bfloat16", **changes})
    assert model.attention_implementation(config, length) == expected, (backend, changes, length)
    assert model.attention_implementation(config.replace(attention_implementation="xla"), length) == "xla"


def _scan_unrolls(jaxpr) -> list[int]:
  """The `unroll` of every scan in a (nested) jaxpr, in order."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan":
      found.append(eqn.params["unroll"])
    for sub in jax.core.jaxprs_in_params(eqn.params):
      found += _scan_unrolls(sub)
  return found


def test_scan_unroll_left_to_the_backend_unrolls_every_layer_on_a_gpu_only(monkeypatch):
  """None: straight-line layers where the step is traced for a GPU (H200: 1.19x ALBERT-base's step), the one-layer
  loop elsewhere; a number is kept, at most a group's layers."""
  two_groups = dict(num_hidden_groups=2)   # TINY's 4 layers as 2 groups of 2
  for backend, changes, expected in [("cpu", {}, [1]), ("tpu", {}, [1]), ("gpu", {}, [4]), ("gpu", two_groups, [2, 2]),
                                     ("gpu", dict(scan_unroll=1), [1]), ("cpu", dict(scan_unroll=3), [3]),
                                     ("cpu", dict(scan_unroll=3, **two_groups), [2, 2])]:
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    module = AlbertModel(TINY.replace(**changes))
    params = nn.unbox(abstract_params(module))
    jaxpr = jax.make_jaxpr(lambda p: module.apply({"params": p}, **batch()))(params)
    assert _scan_unrolls(jaxpr.jaxpr) == expected, (backend, changes)


def _scatter_add_shapes(jaxpr) -> list[tuple[int, ...]]:
  """The output shape of every scatter-add in a (nested) jaxpr."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scatter-add":
      found.append(tuple(eqn.outvars[0].aval.shape))
    for sub in jax.core.jaxprs_in_params(eqn.params):
      found += _scatter_add_shapes(sub)
  return found


def test_only_the_word_embeddings_gradient_is_a_scatter():
  """Positions are a slice and token types a one-hot product: their gradients are a reduction and a matmul. As
  gathers, every token's gradient was scatter-added into their few rows, which on an H100 took 146 ms of ALBERT-base's
  196 ms step (atomics on 2 rows, in bfloat16)."""
  model = AlbertModel(TINY)
  params = nn.unbox(init_params(model, jax.random.key(1)))
  grad = jax.grad(lambda p: model.apply({"params": p}, **batch())[0].std())
  shapes = _scatter_add_shapes(jax.make_jaxpr(grad)(params).jaxpr)
  assert shapes == [(TINY.vocab_size, TINY.embedding_size)], shapes


def test_bfloat16_compute_sums_the_embedding_gradients_in_float32():
  """8,192 tokens' gradients into the token-type, position and word tables: with bfloat16 compute, as close to the
  float32 model's as the bfloat16 rounding of each token's gradient allows: 0.17% here. Accumulated in bfloat16
  they were 6.6% off for the token types, 2.8% for the words and 0.8% for the positions."""
  config = TINY.replace(vocab_size=16, max_position_embeddings=128)
  rng = np.random.default_rng(0)
  inputs = dict(input_ids=jnp.asarray(rng.integers(0, 16, (64, 128)), jnp.int32),
                token_type_ids=jnp.asarray(rng.integers(0, 2, (64, 128)), jnp.int32))
  weights = jnp.asarray(rng.normal(size=(64, 128, config.embedding_size)), jnp.float32)
  params = nn.unbox(init_params(AlbertForPreTraining(config), jax.random.key(1)))["albert"]["embeddings"]
  def embedding_grads(dtype):
    embeddings = Embeddings(config.replace(dtype=dtype))
    loss = lambda p: jnp.sum(embeddings.apply({"params": p}, **inputs, deterministic=True) * weights)
    return jax.grad(loss)(params)
  reference, half = embedding_grads("float32"), embedding_grads("bfloat16")
  for table in ("token_type_embeddings", "position_embeddings", "word_embeddings"):
    want, got = reference[table]["embedding"], half[table]["embedding"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 5e-3, table


def test_flat_dot_general_refuses_products_other_than_dense():
  x, kernel = jnp.ones((2, 3, 4)), jnp.ones((4, 5))
  assert flat_dot_general(x, kernel, (((2,), (0,)), ((), ()))).shape == (2, 3, 5)
  with pytest.raises(ValueError, match="kernel"):
    flat_dot_general(x, jnp.ones((3, 5)), (((1,), (0,)), ((), ())))


def test_groups_and_inner_groups_create_distinct_layers():
  params = abstract_params(AlbertModel(TINY.replace(num_hidden_groups=2, inner_group_num=3)))
  encoder = flax.linen.unbox(params)["encoder"]
  assert sorted(encoder) == ["embedding_hidden_mapping_in", "group_0", "group_1"]
  assert sorted(encoder["group_1"]) == ["inner_0", "inner_1", "inner_2"]


@pytest.mark.parametrize("sharing", ["attention", "ffn"])
def test_partial_sharing_has_one_shared_block(sharing):
  encoder = flax.linen.unbox(abstract_params(AlbertModel(TINY.replace(sharing=sharing))))["encoder"]
  per_layer = "ffn" if sharing == "attention" else "attention"
  assert sharing in encoder
  assert sorted(k for k in encoder if k.startswith(per_layer + "_")) == [f"{per_layer}_{i}" for i in range(4)]


def test_bfloat16_compute_runs_and_stays_close(tiny_params):
  inputs = batch()
  f32 = run(TINY, tiny_params, inputs)
  bf16 = run(TINY.replace(dtype="bfloat16"), tiny_params, inputs)
  assert bf16["mlm_logits"].dtype == jnp.float32  # logits are returned in float32 for the loss
  np.testing.assert_allclose(bf16["mlm_logits"], f32["mlm_logits"], atol=0.1)
  np.testing.assert_allclose(bf16["sop_logits"], f32["sop_logits"], atol=0.05)
  assert np.abs(np.asarray(bf16["mlm_logits"]) - np.asarray(f32["mlm_logits"])).mean() < 0.02


@pytest.mark.parametrize("policy", ["full", "dots_saveable"])
def test_remat_gives_the_same_values_and_gradients(tiny_params, policy):
  inputs = batch()
  def loss(config, params):
    return run(config, params, inputs)["mlm_logits"].sum()
  plain = jax.value_and_grad(lambda p: loss(TINY, p))(tiny_params)
  remat = jax.value_and_grad(lambda p: loss(TINY.replace(remat_policy=policy), p))(tiny_params)
  np.testing.assert_allclose(plain[0], remat[0], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(plain[1]), jax.tree.leaves(remat[1])):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_jitted_forward_equals_eager(tiny_params):
  inputs = batch()
  eager = run(TINY, tiny_params, inputs)
  jitted = jax.jit(lambda p, x: run(TINY, p, x))(tiny_params, inputs)
  np.testing.assert_allclose(eager["mlm_logits"], jitted["mlm_logits"], atol=1e-5)


def test_padding_does_not_leak_into_real_tokens(tiny_params):
  inputs = batch()
  out = run(TINY, tiny_params, inputs)
  changed = dict(inputs, input_ids=inputs["input_ids"].at[2, 4:].set(7))  # only padded positions of row 2
  again = run(TINY, tiny_params, changed)
  np.testing.assert_allclose(out["mlm_logits"][2, :4], again["mlm_logits"][2, :4], atol=1e-5)
  np.testing.assert_allclose(out["sop_logits"], again["sop_logits"], atol=1e-5)


def test_dropout_is_active_only_when_not_deterministic():
  config = TINY.replace(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
  params = nn.unbox(init_params(AlbertForPreTraining(config), jax.random.key(0)))
  inputs = batch()
  a = run(config, params, inputs, deterministic=False, rngs={"dropout": jax.random.key(1)})
  b = run(config, params, inputs, deterministic=False, rngs={"dropout": jax.random.key(2)})
  assert not np.allclose(a["mlm_logits"], b["mlm_logits"])
  np.testing.assert_allclose(run(config, params, inputs)["mlm_logits"], run(TINY, params, inputs)["mlm_logits"])


def test_init_follows_the_original():
  params = flax.linen.unbox(init_params(AlbertForPreTraining(model_config_for("base")), jax.random.key(0)))
  words = np.asarray(params["albert"]["embeddings"]["word_embeddings"]["embedding"])
  assert np.abs(words).max() <= 0.04 + 1e-7          # truncated at 2 sigma
  assert abs(words.std() - 0.0176) < 5e-4             # realised sigma of a 2-sigma truncated N(0, 0.02)
  layer = params["albert"]["encoder"]["group_0"]["inner_0"]
  assert (np.asarray(layer["attention"]["LayerNorm"]["scale"]) == 1).all()
  assert (np.asarray(layer["ffn"]["intermediate"]["bias"]) == 0).all()


def test_every_parameter_has_logical_axis_names():
  boxed = abstract_params(AlbertForPreTraining(TINY))
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)
  assert all(len(x.names) == len(x.value.shape) for x in leaves)


@pytest.mark.parametrize("overrides,message", [
    ({"hidden_size": 100, "num_attention_heads": 12}, "not divisible by model.num_attention_heads"),
    ({"sharing": "some"}, "model.sharing"),
    ({"hidden_act": "swish"}, "model.hidden_act"),
    ({"num_hidden_groups": 20}, "num_hidden_groups"),
    ({"attention_implementation": "flash"}, "model.attention_implementation='flash'; choose one of"),
    ({"attention_implementation": "cudnn"}, "bfloat16 or float16 only; set model.dtype=bfloat16"),
    ({"attention_implementation": "cudnn", "dtype": "bfloat16", "attention_probs_dropout_prob": 0.1},
     "no attention-probability dropout; set model.attention_probs_dropout_prob=0"),
])
def test_bad_configs_fail_with_clear_errors(overrides, message):
  with pytest.raises(ValueError, match=message):
    model_config_for("base", **overrides)


def test_unknown_config_key_is_named():
  with pytest.raises(ValueError, match="hiden_size"):
    ModelConfig.from_mapping({"hiden_size": 3})


def test_a_saved_config_with_a_retired_key_still_loads():
  # A workdir or export written before albert_jax.ops has model.softmax_custom_jvp in its config.json.
  saved = {**dataclasses.asdict(TINY), "softmax_custom_jvp": False}
  assert ModelConfig.from_mapping(saved) == TINY


def test_sequence_longer_than_positions_fails_clearly(tiny_params):
  with pytest.raises(ValueError, match="exceeds model.max_position_embeddings=32"):
    run(TINY, tiny_params, batch(s=40))


def test_wrong_shape_checkpoint_is_refused(tiny_params):
  from albert_jax.weights.loading import merge_init_params
  bad = jax.tree.map(np.asarray, tiny_params)
  bad["albert"]["embeddings"]["word_embeddings"]["embedding"] = np.zeros((50, 32), np.float32)
  del bad["albert"]["pooler"]
  with pytest.raises(ValueError) as error:
    merge_init_params(tiny_params, bad)
  assert "albert/embeddings/word_embeddings/embedding: expected shape (97, 32), found shape (50, 32)" in str(error.value)
  assert "albert/pooler/kernel: expected shape (64, 64), found missing" in str(error.value)


@pytest.mark.parametrize("size", sorted(EXACT_COUNTS))
def test_describe_cli_prints_exact_counts_last(size):
  out = subprocess.run([sys.executable, "-m", "albert_jax.main", f"--config=experiments/pretrain_{size}.py",
                        "--mode=describe"], capture_output=True, text=True, check=True)
  info = json.loads(out.stdout.strip().splitlines()[-1])
  assert (info["params_backbone"], info["params_total"]) == EXACT_COUNTS[size]
  assert info["train_flops_per_token"] == pytest.approx(
      flops.train_flops_per_token(model_config_for(size), 512, 20))


def test_uncapped_predictions_count_the_mlm_head_at_the_masking_budget(capsys):
  """max_predictions_per_seq=0 (no cap) gives the MLM head round(0.15 * 128) = 19 rows per sequence, not all 128:
  `--mode=describe`, the run's MFU and the synthetic batches agree on them."""
  from albert_jax import job_kinds, pretrain
  from albert_jax.cli import experiment_config
  config = experiment_config(["prog", "--config=experiments/pretrain_base.py", "--config.data.max_seq_length=128",
                              "--config.data.max_predictions_per_seq=0"])
  c, s, m = model_config_for("base"), 128, 19
  expected = 72 * 12 * 768 ** 2 + 12 * 12 * s * 768 + 6 * 128 * 768 + m / s * 6 * (768 * 128 + 128 * 30000)
  job_kinds.kind_for(config).describe()
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["train_flops_per_token"] == pytest.approx(
      expected)
  assert pretrain.make_job(config).flops_per_token == pytest.approx(expected)
  assert pretrain.synthetic_batch(config.data, 2, c.vocab_size, 0)["masked_lm_ids"].shape == (2, m)


@pytest.mark.parametrize("experiment, heads, seq_len", [
    ("glue.py:task=mnli", {"classifier/kernel": 768 * 3, "classifier/bias": 3}, 512),
    ("race.py", {"classifier/kernel": 768, "classifier/bias": 1}, 512),
    ("squad_v1.py", {"qa_outputs/kernel": 768 * 2, "qa_outputs/bias": 2}, 384)])
def test_describe_of_a_fine_tuning_config_counts_the_task_model(experiment, heads, seq_len):
  """The backbone of ALBERT-base with the task's head instead of the MLM and sentence-order heads: the model the
  config trains, not the pretraining model."""
  out = subprocess.run([sys.executable, "-m", "albert_jax.main", f"--config=experiments/{experiment}",
                        "--mode=describe"], capture_output=True, text=True, check=True)
  lines = out.stdout.strip().splitlines()
  info = json.loads(lines[-1])
  listed = {line.split()[0]: int(line.split()[-1].replace(",", "")) for line in lines
            if line.split() and "/" in line.split()[0] and not line.startswith("albert/")}
  assert listed == heads
  assert (info["params_backbone"], info["params_heads"]) == (EXACT_COUNTS["base"][0], sum(heads.values()))
  assert info["params_total"] == EXACT_COUNTS["base"][0] + sum(heads.values())
  base = model_config_for("base")
  assert info["train_flops_per_token"] == flops.encoder_train_flops_per_token(base, seq_len) == pytest.approx(
      flops.train_flops_per_token(base, seq_len, seq_len) - 6 * (768 * 128 + 128 * 30000))
