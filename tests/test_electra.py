"""ELECTRA (albert_jax/families/electra_pretraining.py, electra_model.py): the loss on a hand-made batch, no
gradient through the sampling, one embedding block shared by both towers, exact resume, fine-tuning from the
discriminator, describe."""
import json
import shutil

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from albert_jax.errors import InputError
from albert_jax.families import electra_pretraining as electra
from albert_jax.families.electra_model import ElectraForPreTraining, generator_config
from albert_jax.model import AlbertForPreTraining, AlbertModel, dummy_inputs
from albert_jax.weights import loading
from experiments import pretrain_electra
from tests.helpers import SMALL_RUN, TINY_MODEL, assert_trees_equal, final_params, logged, pretrain_cli

# Two rows of 6 tokens, 3 prediction slots. Row 0: slots at 2 and 4 (originals 20 and 40), the third a pad slot.
# Row 1: padded from position 4; one slot at 1 (original 11), two pad slots, one pointing at a real token.
BATCH = {"input_ids": jnp.array([[2, 9, 3, 9, 3, 9], [2, 3, 7, 9, 0, 0]], jnp.int32),
         "attention_mask": jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], jnp.int32),
         "token_type_ids": jnp.zeros((2, 6), jnp.int32),
         "masked_lm_positions": jnp.array([[2, 4, 0], [1, 0, 3]], jnp.int32),
         "masked_lm_ids": jnp.array([[20, 40, 0], [11, 0, 0]], jnp.int32),
         "masked_lm_weights": jnp.array([[1, 1, 0], [1, 0, 0]], jnp.float32)}
# The generator's samples: 20 at row 0's first slot equals the original (not replaced), 41 replaces 40, 12
# replaces 11; the pad slots' samples (77, 88, 99) must change nothing.
SAMPLES = jnp.array([[20, 41, 77], [12, 88, 99]], jnp.int32)


def test_corrupt_replaces_masked_positions_and_labels_only_real_changes():
  replaced_input, labels = electra.corrupt(BATCH, SAMPLES)
  np.testing.assert_array_equal(replaced_input, [[2, 9, 20, 9, 41, 9], [2, 12, 7, 9, 0, 0]])
  np.testing.assert_array_equal(labels, [[0, 0, 0, 0, 1, 0], [0, 1, 0, 0, 0, 0]])


def test_objective_on_a_hand_made_batch_weights_the_discriminator_by_50():
  _, labels = electra.corrupt(BATCH, SAMPLES)
  vocab = 50
  mlm_logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, vocab)), jnp.float32)
  disc_logits = jnp.array([[-2.0, 1.0, -1.0, -3.0, 0.5, -1.0], [-1.0, -0.5, 2.0, -2.0, 9.0, 9.0]])
  totals = electra.electra_totals(BATCH)
  loss, sums = electra.electra_objective(mlm_logits, disc_logits, labels, BATCH, totals, 50.0)
  # By hand: the MLM nll at the 3 real slots over their count, the logistic loss at the 10 non-pad positions.
  log_probs = np.asarray(jax.nn.log_softmax(mlm_logits))
  mlm = -(log_probs[0, 0, 20] + log_probs[0, 1, 40] + log_probs[1, 0, 11]) / 3
  x, y = np.asarray(disc_logits)[[0, 0, 0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]], np.array(
      [0, 0, 0, 0, 1, 0, 0, 1, 0, 0])
  disc = np.mean(np.log1p(np.exp(-x)) * y + np.log1p(np.exp(x)) * (1 - y))
  np.testing.assert_allclose(loss, mlm + 50 * disc, rtol=1e-5)
  assert float(sums["disc_tokens"]) == 10 and float(sums["mlm_weight"]) == 3
  metrics = electra.summarize_electra(50.0, jax.device_get(sums))
  # Predicted replaced (logit > 0, non-pad): row 0 positions 1 and 4, row 1 position 2; truly replaced: (0,4), (1,1).
  assert metrics["disc_precision"] == pytest.approx(1 / 3) and metrics["disc_recall"] == pytest.approx(1 / 2)
  assert metrics["disc_accuracy"] == pytest.approx(7 / 10) and metrics["replaced_share"] == pytest.approx(2 / 10)
  assert metrics["disc_chance_loss"] == pytest.approx(-(0.2 * np.log(0.2) + 0.8 * np.log(0.8)))
  np.testing.assert_allclose(metrics["loss"], mlm + 50 * disc, rtol=1e-5)
  loss_1, _ = electra.electra_objective(mlm_logits, disc_logits, labels, BATCH, totals, 1.0)
  np.testing.assert_allclose(loss - loss_1, 49 * disc, rtol=1e-5)


@pytest.fixture(scope="module")
def tiny_pair():
  """(model, params, gradients of the loss at discriminator weight 1, at weight 50), in one compiled call: the
  same samples (key 3) and no dropout, so the two differ by 49 times the discriminator's gradient alone."""
  model = ElectraForPreTraining(TINY_MODEL.replace(vocab_size=60, sharing="none", num_hidden_layers=1), 0.25)
  totals = electra.electra_totals(BATCH)

  def init_and_gradients(rng):
    params = flax.linen.unbox(model.init(rng, **dummy_inputs(1, 6))["params"])
    grad = lambda weight: jax.grad(lambda p: electra.electra_loss(
        model, weight, p, BATCH, jax.random.key(3), totals, deterministic=True)[0])(params)
    return params, grad(1.0), grad(50.0)

  params, at_1, at_50 = jax.jit(init_and_gradients)(jax.random.key(0))
  return model, params, _leaves(at_1), _leaves(at_50)


def _leaves(tree):
  return flax.traverse_util.flatten_dict(tree, sep="/")


def test_one_embedding_block_shared_and_the_discriminator_is_an_albert_backbone(tiny_pair):
  model, params, at_1, at_50 = tiny_pair
  paths = list(_leaves(params))
  for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    assert [p for p in paths if table in p] == [f"albert/embeddings/{table}/embedding"]
  backbone = jax.eval_shape(lambda: AlbertModel(model.config).init(jax.random.key(0), **dummy_inputs(1, 6)))
  shapes = lambda tree: {k: v.shape for k, v in _leaves(flax.linen.unbox(tree)).items()}
  assert shapes(params["albert"]) == shapes(backbone["params"])
  assert sorted(params) == ["albert", "discriminator_predictions", "generator", "generator_predictions"]
  assert params["generator"]["embedding_hidden_mapping_in"]["kernel"].shape == (32, 16)  # E=32 -> H/4=16
  # Both towers train the one block: the discriminator's gradient (at_50 - at_1) / 49 and the generator's (the
  # rest) reach every table.
  for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    path = f"albert/embeddings/{table}/embedding"
    discriminator = (at_50[path] - at_1[path]) / 49
    assert np.abs(discriminator).max() > 0 and np.abs(at_1[path] - discriminator).max() > 0, table


def test_no_gradient_flows_through_the_sampling(tiny_pair):
  """The discriminator's loss reaches the generator only through its samples: the generator's gradient is the
  same at weight 1 and 50, while the discriminator's and the shared embeddings' change."""
  _, _, at_1, at_50 = tiny_pair
  for path in at_1:
    same = np.array_equal(at_1[path], at_50[path])
    if path.startswith("generator"):
      assert same, path
    elif path.startswith(("albert/encoder", "albert/embeddings", "discriminator_predictions")):
      assert not same, path


def _detectable_batch(rng, vocab_size, b=16, s=12, m=3):
  """Originals drawn from ids 5-19, three positions a row "masked" and given uniform samples over the other ids:
  replacements a discriminator can tell apart by the token alone."""
  ids = rng.integers(5, 20, (b, s)).astype(np.int32)
  positions = np.argsort(rng.random((b, s)), axis=1)[:, :m].astype(np.int32)
  batch = {"input_ids": jnp.asarray(ids), "attention_mask": jnp.ones((b, s), jnp.int32),
           "token_type_ids": jnp.zeros((b, s), jnp.int32), "masked_lm_positions": jnp.asarray(positions),
           "masked_lm_ids": jnp.asarray(np.take_along_axis(ids, positions, 1)),
           "masked_lm_weights": jnp.ones((b, m), jnp.float32)}
  return batch, jnp.asarray(rng.integers(20, vocab_size, (b, m)), jnp.int32)


def test_the_discriminator_learns_replacements_it_can_tell_apart():
  """The discriminator's path (`corrupt`, its logits, `electra_objective` at weight 50) trains: on replacements
  told apart by the token alone, 120 AdamW steps take its held-out loss below a tenth of chance (the loss of knowing
  only the replaced share). A generator's samples at the CPU study's scale are much harder to tell apart
  (docs/paper_small_scale.md)."""
  model = ElectraForPreTraining(TINY_MODEL.replace(sharing="none", num_hidden_layers=1), 0.25)
  params = jax.jit(lambda rng: flax.linen.unbox(model.init(rng, **dummy_inputs(1, 12))["params"]))(jax.random.key(0))
  optimizer = optax.adamw(3e-3)

  def objective(p, batch, samples):
    replaced_input, labels = electra.corrupt(batch, samples)
    disc_logits = model.apply({"params": p}, replaced_input, batch["attention_mask"], batch["token_type_ids"],
                              method=model.discriminator_logits)
    mlm_logits = jnp.zeros((*samples.shape, model.config.vocab_size))   # the generator's part stays constant
    return electra.electra_objective(mlm_logits, disc_logits, labels, batch, electra.electra_totals(batch), 50.0)

  @jax.jit
  def step(p, opt_state, batch, samples):
    grads = jax.grad(lambda p: objective(p, batch, samples)[0])(p)
    updates, opt_state = optimizer.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state

  rng, opt_state = np.random.default_rng(0), optimizer.init(params)
  for _ in range(120):
    params, opt_state = step(params, opt_state, *_detectable_batch(rng, model.config.vocab_size))
  _, sums = jax.jit(objective)(params, *_detectable_batch(rng, model.config.vocab_size, b=64))
  metrics = electra.summarize_electra(50.0, jax.tree.map(float, sums))
  assert metrics["replaced_share"] > 0.2
  assert metrics["disc_loss"] < 0.1 * metrics["disc_chance_loss"]
  assert metrics["disc_recall"] > 0.9 and metrics["disc_precision"] > 0.9


def test_generator_width_and_refusals():
  small = pretrain_electra.get_config("size=small")
  model = electra.make_model(small)
  gen = generator_config(model.config, model.generator_fraction)
  assert (gen.hidden_size, gen.intermediate_size, gen.num_attention_heads, gen.num_hidden_layers) == (64, 256, 1, 12)
  base = pretrain_electra.get_config("size=base")
  gen = generator_config(electra.make_model(base).config, base.electra.generator_fraction)
  assert (gen.hidden_size, gen.intermediate_size, gen.num_attention_heads) == (256, 1024, 4)
  large = pretrain_electra.get_config("size=large")
  assert (large.data.masked_lm_prob, large.data.max_predictions_per_seq, small.data.max_predictions_per_seq) == (
      0.25, 130, 19)
  small.data.sentence_task = "sop"
  with pytest.raises(InputError, match="sentence_task=none"):
    electra.make_job(small)
  with pytest.raises(InputError, match="do not divide"):
    generator_config(model.config.replace(num_attention_heads=12, hidden_size=192), 0.3)  # 58 wide, 4 heads


def test_describe_counts_both_towers(capsys):
  """ELECTRA-Small (V=30000): the discriminator and shared embeddings, the generator, and FLOPs per token by hand."""
  info = electra.describe_config(pretrain_electra.get_config("size=small"))
  assert capsys.readouterr().out.splitlines()[-1] == json.dumps(info)
  assert info["params_backbone"] == (30000 + 512 + 2) * 128 + 2 * 128 + (128 * 256 + 256) + 12 * (
      4 * (256 * 256 + 256) + 512 + 2 * 256 * 1024 + 1024 + 256 + 512) + 256 * 256 + 256 == 13_481_984
  assert info["params_generator"] == (128 * 64 + 64) + 12 * (4 * (64 * 64 + 64) + 128 + 2 * 64 * 256 + 256 + 64
                                                             + 128) + (64 * 128 + 128) + 256 + 30000 == 646_640
  assert info["params_total"] == 13_481_984 + 646_640 + 66_049
  discriminator = 12 * (6 * (4 * 256**2 + 2 * 256 * 1024) + 12 * 128 * 256) + 6 * 128 * 256 + 6 * (256**2 + 256)
  generator = 12 * (6 * (4 * 64**2 + 2 * 64 * 256) + 12 * 128 * 64) + 6 * 128 * 64 + 19 / 128 * 6 * (
      64 * 128 + 128 * 30000)
  assert info["train_flops_per_token"] == discriminator + generator == 70_128_096


# ------------------------------------------------------------------------------------------------- runs
RUN = [*SMALL_RUN, "--config.model.num_hidden_layers=1", "--config.train.num_train_steps=4",
       "--config.checkpoint.every=2", "--config.checkpoint.keep=4", "--config.data.kind=synthetic",
       "--config.data.max_seq_length=16", "--config.data.max_predictions_per_seq=3", "--config.model.scan_unroll=1"]
CONFIG = "experiments/pretrain_electra.py:size=tiny"


@pytest.fixture(scope="module")
def electra_run(tmp_path_factory):
  """A 4-step ELECTRA run on synthetic batches, checkpoints at 2 and 4, and its compilation cache."""
  root = tmp_path_factory.mktemp("electra")
  flags = [*RUN, f"--config.compilation_cache_dir={root / 'cache'}"]
  result = pretrain_cli(root / "run", *flags, config=CONFIG, fast_compile=True)
  assert result.returncode == 0, result.stdout + result.stderr
  return root / "run", flags


def test_run_logs_the_discriminator_metrics_and_resumes_exactly(electra_run, tmp_path):
  workdir, flags = electra_run
  row = json.loads(open(workdir / "metrics.jsonl").readline())
  assert {"mlm_accuracy", "disc_loss", "disc_accuracy", "disc_precision", "disc_recall", "replaced_share"} <= set(row)
  # The same run stopped at its checkpoint of step 2, then resumed: steps 3 and 4 again, sampling included.
  stopped = tmp_path / "stopped"
  shutil.copytree(workdir, stopped)
  shutil.rmtree(stopped / "checkpoints" / "4")
  resumed = pretrain_cli(stopped, *flags, config=CONFIG, fast_compile=True)
  assert resumed.returncode == 0, resumed.stderr
  assert "Resumed from step 2" in resumed.stdout
  (step_a, params_a), (step_b, params_b) = final_params(workdir), final_params(stopped)
  assert step_a == step_b == 4
  assert_trees_equal(params_a, params_b)
  assert logged(workdir, "disc_loss")[4] == logged(stopped, "disc_loss")[4]


def test_fine_tuning_loads_the_discriminator_and_drops_the_generator(electra_run, capsys):
  workdir, _ = electra_run
  loaded = loading.load_init_params(str(workdir))
  assert "is an ELECTRA run" in capsys.readouterr().out
  _, saved = final_params(workdir)
  assert list(loaded) == ["albert"]
  assert_trees_equal(loaded["albert"], saved["albert"])
  config = json.load(open(workdir / "config.json"))["model"]
  from albert_jax.model_config import ModelConfig
  target = jax.eval_shape(lambda: flax.linen.unbox(AlbertForPreTraining(ModelConfig.from_mapping(config)).init(
      jax.random.key(0), **dummy_inputs(1, 8))["params"]))
  merged, fresh = loading.merge_init_params(target, loaded)
  assert sorted({path.split("/")[0] for path in fresh}) == ["predictions", "sop_classifier"]
  assert_trees_equal(merged["albert"], saved["albert"])


def test_the_cli_runs_electra_as_its_own_kind_and_refuses_predict(monkeypatch):
  from albert_jax import job_kinds, runner
  from albert_jax.run import Run
  config = pretrain_electra.get_config("size=tiny")
  kind = job_kinds.kind_for(config)
  assert isinstance(kind, job_kinds.Electra) and isinstance(kind, job_kinds.Pretraining)
  called = []
  monkeypatch.setattr(electra, "train", lambda config, run, args: called.append(("train", run)))
  monkeypatch.setattr(electra, "evaluate_checkpoint", lambda config, run, args: called.append(("eval", run)))
  runner.run(config, Run("W"), "train")
  runner.run(config, Run("W"), "eval")
  assert called == [("train", Run("W")), ("eval", Run("W"))]
  assert kind.make_job(config).flops_per_token == electra.train_flops_per_token(config)
  with pytest.raises(InputError, match="--mode=predict does not apply to ELECTRA pretraining configs"):
    runner.run(config, Run("W"), "predict")
