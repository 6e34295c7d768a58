"""Layer-wise learning-rate decay (ELECTRA's fine-tuning): each parameter's factor against a hand computation on a
3-layer model, a step equal to the undecayed step times those factors, the refusal where layers share weights, and
a tiny fine-tuning run on ELECTRA's recipe. The bias-corrected AdamW against a hand computation, and ELECTRA's
generator learning rate scaling exactly the generator's updates."""
import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from albert_jax import engine, optim, pretrain
from albert_jax.errors import InputError
from albert_jax.families import electra_pretraining
from albert_jax.model import dummy_inputs, init_params
from albert_jax.model_config import model_config_for
from albert_jax.tasks.heads import PooledClassifier
from experiments import common, pretrain_electra
from tests.cli_forks import run_each
from tests.helpers import TINY_RUN, cpu_env, finetune_cli, glue_data, spm

DECAY = 0.8
# L = 3: the embeddings and the E -> H projection at depth 0, layer l at l + 1, the pooler and the head at L + 2;
# factor = 0.8^(5 - depth).
HAND_FACTORS = {"albert/embeddings/": 0.32768, "albert/encoder/embedding_hidden_mapping_in/": 0.32768,
                "albert/encoder/group_0/": 0.4096, "albert/encoder/group_1/": 0.512,
                "albert/encoder/group_2/": 0.64, "albert/pooler/": 1.0, "classifier/": 1.0}


def three_layers(**overrides):
  """Unshared, E (32) != H (64), so the projection is there."""
  return model_config_for("tiny", num_hidden_layers=3, sharing="none", vocab_size=97, max_position_embeddings=32,
                          **overrides)


def classifier_params(config):
  return nn.unbox(init_params(PooledClassifier(config, num_outputs=2), jax.random.key(0)))


def flat(tree):
  return {"/".join(k.key for k in path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def train_config(decay, optimizer="adamw"):
  c = common.finetuning_config("base", "glue").train
  c.update(dict(optimizer=optimizer, learning_rate=1e-3, warmup_steps=0, num_train_steps=10,
                layerwise_lr_decay=decay))
  return c


@pytest.mark.parametrize("scan_layers", [True, False])
def test_each_parameter_gets_its_layers_factor(scan_layers):
  params = jax.eval_shape(lambda: classifier_params(three_layers(scan_layers=scan_layers)))
  factors = flat(optim.layerwise_factors(params, DECAY, 3))
  for name, factor in factors.items():
    expected = [f for prefix, f in HAND_FACTORS.items() if name.startswith(prefix)]
    assert len(expected) == 1, name
    assert factor == pytest.approx(expected[0], rel=1e-12), name
  for prefix in HAND_FACTORS:  # every part of the model is there
    assert any(name.startswith(prefix) for name in factors), prefix


def named_like_a_three_layer_classifier():
  """Small arrays under the names of `classifier_params(three_layers())`'s parts (few shapes: fast on CPU)."""
  rng = np.random.default_rng(0)
  dense = lambda: {"kernel": rng.normal(size=(3, 4)).astype(np.float32), "bias": rng.normal(size=4).astype(np.float32)}
  layer = lambda: {"inner_0": {"attention": {"query": dense(), "LayerNorm": {"scale": np.ones(4, np.float32)}},
                               "ffn": {"output": dense()}}}
  return {"albert": {"embeddings": {"word_embeddings": {"embedding": rng.normal(size=(3, 4)).astype(np.float32)}},
                     "encoder": {"embedding_hidden_mapping_in": dense(),
                                 **{f"group_{l}": layer() for l in range(3)}},
                     "pooler": dense()},
          "classifier": dense()}


@pytest.mark.parametrize("optimizer", optim.OPTIMIZERS)
def test_a_step_is_the_undecayed_step_times_each_factor(optimizer):
  params = named_like_a_three_layer_classifier()
  rng = np.random.default_rng(1)
  decayed, _ = optim.create_optimizer(train_config(DECAY, optimizer), three_layers())
  plain, _ = optim.create_optimizer(train_config(0.0, optimizer), three_layers())
  decayed_state, plain_state = decayed.init(params), plain.init(params)
  factors = flat(optim.layerwise_factors(params, DECAY, 3))
  assert sorted(set(factors.values())) == pytest.approx(sorted(set(HAND_FACTORS.values())))
  for _ in range(2):  # the moments carry over: the second step too
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    a, decayed_state = decayed.update(grads, decayed_state, params)
    b, plain_state = plain.update(grads, plain_state, params)
    for name, update in flat(a).items():
      np.testing.assert_allclose(update, flat(b)[name] * factors[name], rtol=1e-6, atol=1e-12, err_msg=name)


def one_step_change(config, job, batch) -> tuple[dict, dict]:
  """({name: change} of every parameter over one compiled train step of `job` on `batch`, the parameters before),
  from the state of key 0 and the step key 5, so that two configs' steps compare from one state and batch."""
  s = engine.setup(config, job, devices=jax.devices()[:1])
  state = s.create_state(jax.random.key(0))
  before = jax.tree.map(np.array, state.params)  # copies: the step donates `state`
  with s.context():
    after, _ = s.train_step(state, s.global_batch(batch), jax.random.key(5))
  return flat(jax.tree.map(lambda a, b: np.asarray(a) - b, after.params, before)), before


@pytest.mark.slow
def test_the_engines_step_changes_each_parameter_by_its_factor_of_the_undecayed_change():
  """One compiled train step (clipping, AdamW, weight decay, the schedule) of an unshared 3-layer pretraining model
  at decay 0.8 against the same step at 1.0 (every factor 1), from the same state and batch."""
  config = common.pretraining_config("tiny")
  config.model.update(vocab_size=300, max_position_embeddings=16, num_hidden_layers=3, sharing="none",
                      dtype="float32", remat_policy="none")
  config.data.update(max_seq_length=16, max_predictions_per_seq=4)
  config.train.update(global_batch_size=4, warmup_steps=0, learning_rate=0.01, optimizer="adamw")
  batch = pretrain.synthetic_batch(config.data, 4, 300, (3, 0))
  changes = {}
  for decay in (DECAY, 1.0):
    config.train.layerwise_lr_decay = decay
    changes[decay], before = one_step_change(config, pretrain.make_job(config), batch)
  factors = flat(optim.layerwise_factors(before, DECAY, 3))
  assert factors["sop_classifier/kernel"] == 1.0 and factors["albert/encoder/group_0/inner_0/ffn/output/kernel"] == (
      pytest.approx(0.4096))
  assert np.abs(changes[1.0]["albert/embeddings/word_embeddings/embedding"]).max() > 1e-3
  for name, change in changes[DECAY].items():  # atol: float32 rounding of the LayerNorm scales near 1
    np.testing.assert_allclose(change, changes[1.0][name] * factors[name], rtol=1e-5, atol=2e-7, err_msg=name)


@pytest.mark.parametrize("sharing", ["all", "attention", "ffn"])
def test_shared_layers_are_refused(sharing):
  with pytest.raises(InputError, match=(
      rf"^train.layerwise_lr_decay=0.8 needs layers with their own weights, but model.sharing='{sharing}' shares "
      r"them across layers; set train.layerwise_lr_decay=0.$")):
    optim.create_optimizer(train_config(DECAY), three_layers().replace(sharing=sharing))


def test_a_decay_outside_0_to_1_is_refused_and_0_adds_nothing():
  with pytest.raises(InputError, match=r"^train.layerwise_lr_decay=1.5 must be in \(0, 1\]"):
    optim.create_optimizer(train_config(1.5), three_layers())
  params = named_like_a_three_layer_classifier()
  off, _ = optim.create_optimizer(train_config(0.0), three_layers())
  without_model, _ = optim.create_optimizer(train_config(0.0))
  assert jax.tree.structure(off.init(params)) == jax.tree.structure(without_model.init(params))


@pytest.mark.slow
def test_fine_tuning_on_electras_recipe_runs_unshared_and_is_refused_shared(shared_data, tmp_path):
  root = glue_data(shared_data, "rte", tmp_path / "glue")
  config = f"experiments/glue.py:task=rte,size=tiny,data={root},spm={spm(shared_data)},recipe=electra_small"
  shared, = run_each([[f"--config={config}", f"--workdir={tmp_path / 'shared'}", "--mode=train", *TINY_RUN]],
                     cpu_env())
  assert shared.returncode == 1 and shared.stderr.strip().splitlines()[-1] == (
      "error: train.layerwise_lr_decay=0.8 needs layers with their own weights, but model.sharing='all' shares them "
      "across layers; set train.layerwise_lr_decay=0.")
  result = finetune_cli(config, tmp_path / "run", *TINY_RUN, "--config.model.sharing=none", fast_compile=True)
  assert result.returncode == 0, result.stdout + result.stderr
  recorded = json.load(open(tmp_path / "run" / "config.json"))
  assert (recorded["train"]["layerwise_lr_decay"], recorded["train"]["learning_rate"],
          recorded["model"]["sharing"]) == (0.8, 3e-4, "none")
  assert json.load(open(tmp_path / "run" / "best" / "best.json"))["step"] in (2, 4)


def adamw_config(**overrides):
  c = common.pretraining_config("tiny").train
  c.update({**dict(optimizer="adamw", learning_rate=1e-2, warmup_steps=0, num_train_steps=10, weight_decay=0.1,
                   clip_grad_norm=1.0), **overrides})
  return c


def test_bias_corrected_adamw_matches_a_hand_computation_for_two_steps():
  """Clipped to global norm 1, m̂ = m / (1 - β1^t), v̂ = v / (1 - β2^t), u = m̂ / (√v̂ + ε) + wd · p (not for
  biases and LayerNorm), p -= lr_t · u with lr_t = lr · (1 - t / T) from t = 0."""
  c = adamw_config(adam_bias_correction=True)
  tx, _ = optim.create_optimizer(c)
  rng = np.random.default_rng(0)
  params = {"dense": {"kernel": rng.normal(size=(3, 4)).astype(np.float32), "bias": np.zeros(4, np.float32)},
            "LayerNorm": {"scale": np.ones(4, np.float32)}}
  decayed = {"dense/kernel": True, "dense/bias": False, "LayerNorm/scale": False}
  state, expected = tx.init(params), {k: v.astype(np.float64) for k, v in flat(params).items()}
  m = {k: 0.0 for k in expected}
  v = {k: 0.0 for k in expected}
  for t in (1, 2):
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32) * 3, params)  # norm > 1: clipped
    g = flat(grads)
    norm = np.sqrt(sum(np.sum(np.square(x.astype(np.float64))) for x in g.values()))
    lr = c.learning_rate * (1 - (t - 1) / c.num_train_steps)
    for k in expected:
      clipped = g[k] / max(norm, 1.0)
      m[k] = c.b1 * m[k] + (1 - c.b1) * clipped
      v[k] = c.b2 * v[k] + (1 - c.b2) * clipped ** 2
      u = (m[k] / (1 - c.b1 ** t)) / (np.sqrt(v[k] / (1 - c.b2 ** t)) + c.eps)
      expected[k] = expected[k] - lr * (u + c.weight_decay * expected[k] * decayed[k])
    updates, state = tx.update(grads, state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
    for k, value in flat(params).items():
      np.testing.assert_allclose(value, expected[k], rtol=2e-5, atol=1e-7, err_msg=f"{k} at step {t}")
  # A first step moves each bias by lr · |m̂ / (√v̂ + ε)| = lr; uncorrected, by (1 - β1) / √(1 - β2) = 3.16 × lr.
  first, _ = tx.update(grads, tx.init(params), params)
  plain, _ = optim.create_optimizer(adamw_config())
  uncorrected, _ = plain.update(grads, plain.init(params), params)
  np.testing.assert_allclose(np.abs(flat(first)["dense/bias"]), c.learning_rate, rtol=5e-3)   # rtol: ε
  np.testing.assert_allclose(np.abs(flat(uncorrected)["dense/bias"]), c.learning_rate * 0.1 / np.sqrt(0.001),
                             rtol=5e-3)


def test_the_default_is_the_uncorrected_adamw_bit_for_bit():
  """`adam_bias_correction=False` and a config saved without the field build the same chain and the same updates."""
  params = named_like_a_three_layer_classifier()
  rng = np.random.default_rng(2)
  off, _ = optim.create_optimizer(adamw_config(adam_bias_correction=False))
  without = adamw_config()
  del without["adam_bias_correction"]
  unset, _ = optim.create_optimizer(without)
  a_state, b_state = off.init(params), unset.init(params)
  assert jax.tree.structure(a_state) == jax.tree.structure(b_state)
  assert isinstance(a_state[1], optim.AdamMomentsState)
  for _ in range(2):
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    a, a_state = off.update(grads, a_state, params)
    b, b_state = unset.update(grads, b_state, params)
    for name, update in flat(a).items():
      np.testing.assert_array_equal(update, flat(b)[name], err_msg=name)


@pytest.mark.parametrize("optimizer", ["lamb", "optax_lamb"])
def test_bias_correction_is_refused_for_the_lambs(optimizer):
  with pytest.raises(InputError, match=(
      rf"^train.adam_bias_correction=True applies to train.optimizer='adamw' only, not '{optimizer}' \(optax_lamb's "
      r"moments are corrected, lamb's are not\); set train.adam_bias_correction=False.$")):
    optim.create_optimizer(adamw_config(optimizer=optimizer, adam_bias_correction=True))


def electra_config(multiplier):
  config = pretrain_electra.get_config()
  config.model.update(vocab_size=300, max_position_embeddings=16, num_hidden_layers=2, hidden_size=64,
                      intermediate_size=128, num_attention_heads=4, embedding_size=32)
  config.data.update(max_seq_length=16, max_predictions_per_seq=4)
  config.train.update(global_batch_size=4, warmup_steps=0, learning_rate=1e-3, optimizer="adamw",
                      adam_bias_correction=True)
  config.electra.generator_lr_multiplier = multiplier
  return config


@pytest.mark.parametrize("corrected", [True, False])
def test_the_generator_multiplier_scales_exactly_the_generators_updates(corrected):
  """Two optimizer steps on ELECTRA's parameter tree: the generator's encoder and MLM head move 0.25 times as far;
  the shared embeddings, the discriminator and its head exactly as without the multiplier."""
  model = electra_pretraining.make_model(electra_config(0.25))
  shapes = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), **dummy_inputs(1, 16))["params"]))
  assert set(shapes) == {"albert", "discriminator_predictions", "generator", "generator_predictions"}
  rng = np.random.default_rng(3)
  params = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), shapes)
  train = adamw_config(adam_bias_correction=corrected)
  scaled, _ = optim.create_optimizer(train, update_factors=electra_pretraining.generator_update_factors(0.25))
  plain, _ = optim.create_optimizer(train)
  scaled_state, plain_state = scaled.init(params), plain.init(params)
  for _ in range(2):
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    a, scaled_state = scaled.update(grads, scaled_state, params)
    b, plain_state = plain.update(grads, plain_state, params)
    for name, update in flat(a).items():
      factor = 0.25 if name.startswith("generator") else 1.0
      np.testing.assert_array_equal(update, flat(b)[name] * np.float32(factor), err_msg=name)
  assert electra_pretraining.generator_update_factors(1.0) is None   # the default adds nothing to the chain


@pytest.mark.slow
def test_the_engines_electra_step_moves_the_generator_by_its_multiplier():
  """One compiled ELECTRA train step from the same state and batch at multiplier 0.5 and 1: the job carries the
  factors to the optimizer."""
  changes = {}
  for multiplier in (0.5, 1.0):
    config = electra_config(multiplier)
    batch = pretrain.synthetic_batch(config.data, 4, 300, (3, 0))
    changes[multiplier], _ = one_step_change(config, electra_pretraining.make_job(config), batch)
  assert np.abs(changes[1.0]["generator_predictions/dense/kernel"]).max() > 1e-4
  for name, change in changes[0.5].items():  # atol: float32 rounding of the LayerNorm scales near 1
    factor = 0.5 if name.startswith("generator") else 1.0
    np.testing.assert_allclose(change, changes[1.0][name] * factor, rtol=1e-5, atol=2e-7, err_msg=name)


@pytest.mark.parametrize("multiplier", [0.0, -1.0, float("nan")])
def test_a_generator_multiplier_that_is_not_positive_is_refused(multiplier):
  with pytest.raises(InputError, match=(
      rf"^electra.generator_lr_multiplier={multiplier} must be a positive number \(1: the discriminator's rate\).$")):
    electra_pretraining.make_job(electra_config(multiplier))


def test_resuming_with_the_correction_switched_is_refused(tmp_path, monkeypatch):
  """The corrected AdamW keeps other state (a step count) and takes other steps: not the same run."""
  from albert_jax.run import Run, config as run_config
  monkeypatch.setattr(run_config, "latest_step", lambda run: 2)
  config = pretrain_electra.get_config()
  (tmp_path / "config.json").write_text(config.to_json_best_effort())
  config.train.adam_bias_correction = True
  with pytest.raises(InputError, match=r"with changed train\.adam_bias_correction would not continue the same run"):
    run_config.check_resume(Run(str(tmp_path)), config)
