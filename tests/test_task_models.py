"""Task models on a tiny ALBERT: the backbone is the submodule "albert" (pretrained weights map by name), losses
and predictions are jittable, gradients reach head and backbone, and a few steps learn a toy task."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from albert_jax.model import AlbertModel, init_params
from albert_jax.model_config import model_config_for
from albert_jax.tasks import get_task
from experiments import common, glue, race

TINY = model_config_for("tiny", num_hidden_layers=2)  # a small graph: fast compiles


def tiny_task(config, max_seq_length=16):
  config.model = common.model_config("tiny")
  config.data.max_seq_length = max_seq_length
  if "max_qa_length" in config.data:
    config.data.max_qa_length = 8
  if "max_query_length" in config.data:
    config.data.max_query_length = 8
  return get_task(config)


TASKS = {"glue": lambda: tiny_task(glue.get_config("task=mnli")),
         "sts-b": lambda: tiny_task(glue.get_config("task=sts-b")),
         "squad": lambda: tiny_task(common.squad_config("base", 2, "", "")),
         "race": lambda: tiny_task(race.get_config())}
HEADS = {"glue": "classifier", "sts-b": "classifier", "squad": "qa_outputs", "race": "classifier"}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_model_interface(name):
  task = TASKS[name]()
  model = task.build_model(TINY)
  params = task.init_params(model, jax.random.key(0))
  assert set(params) == {"albert", HEADS[name]}
  backbone = init_params(AlbertModel(TINY), jax.random.key(0))
  assert jax.tree.structure(params["albert"]) == jax.tree.structure(backbone)

  batch = {k: jnp.asarray(v) for k, v in task.dummy_batch(2).items()}
  batch["input_ids"] = batch["input_ids"] + jnp.arange(batch["input_ids"].shape[-1]) % 7 + 5
  loss_and_grad = jax.jit(jax.value_and_grad(lambda p, b, r: task.loss_and_metrics(model, p, b, r, False),
                                             has_aux=True))
  (loss, metrics), grads = loss_and_grad(params, batch, jax.random.key(1))
  assert np.isfinite(loss) and "loss" in metrics and loss.shape == ()
  norms = jax.tree.map(lambda g: float(jnp.abs(nn_unbox(g)).sum()), grads)
  assert sum(jax.tree.leaves(norms[HEADS[name]])) > 0 and sum(jax.tree.leaves(norms["albert"])) > 0
  outputs = jax.jit(lambda p, b: task.predict_step(model, p, b))(params, batch)
  assert all(v.shape[0] == 2 and v.dtype == jnp.float32 for v in outputs.values())
  if name in ("glue", "race"):  # classifier dropout 0.1 draws from the 'dropout' rng in training mode
    assert loss_and_grad(params, batch, jax.random.key(2))[0][0] != loss


def nn_unbox(x):
  return getattr(x, "value", x)


def test_race_options_are_scored_independently():
  task = TASKS["race"]()
  model = task.build_model(TINY)
  params = task.init_params(model, jax.random.key(0))
  rng = np.random.default_rng(0)
  batch = {k: np.asarray(v) for k, v in task.dummy_batch(1).items()}
  batch["input_ids"] = rng.integers(5, 1000, batch["input_ids"].shape).astype(np.int32)
  logits = task.predict_step(model, params, batch)["logits"]
  permuted = dict(batch, input_ids=batch["input_ids"][:, ::-1])
  np.testing.assert_allclose(task.predict_step(model, params, permuted)["logits"], logits[:, ::-1], rtol=1e-5)


def test_max_seq_length_above_position_table():
  task = TASKS["glue"]()
  with pytest.raises(ValueError, match=r"max_seq_length=16 exceeds model.max_position_embeddings=8"):
    task.build_model(TINY.replace(max_position_embeddings=8))
  config = glue.get_config("task=rte,size=tiny")  # tiny has 128 positions, GLUE's recipe uses 512
  with pytest.raises(ValueError, match=r"max_seq_length=512 exceeds model.max_position_embeddings=128"):
    get_task(config)


@pytest.mark.slow
def test_a_few_steps_learn_a_toy_task():
  """Label = whether token 7 occurs: the classifier gets it from [CLS] through attention."""
  task = tiny_task(glue.get_config("task=sst-2"))
  model = task.build_model(TINY)
  params = task.init_params(model, jax.random.key(0))
  rng = np.random.default_rng(0)
  ids = rng.integers(10, 200, (32, 16)).astype(np.int32)
  labels = (np.arange(32) % 2).astype(np.int32)
  ids[labels == 1, 5] = 7
  ids[:, 0] = 2
  batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids),
           "label": labels}
  optimizer = optax.adam(3e-3)
  state = optimizer.init(params)

  @jax.jit
  def step(params, state, rng):
    (loss, metrics), grads = jax.value_and_grad(
        lambda p: task.loss_and_metrics(model, p, batch, rng, False), has_aux=True)(params)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, metrics

  for i in range(60):
    params, state, metrics = step(params, state, jax.random.key(i))
  _, final = task.loss_and_metrics(model, params, batch, None, True)
  assert final["accuracy"] == 1.0 and final["loss"] < 0.1
