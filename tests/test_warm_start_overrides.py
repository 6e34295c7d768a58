"""A warm start refuses a `--config.model` override that changes the parameter tree of the weights it loads or
what they compute (issue #57, class 2): sharing, layers and their groups, sizes, the embedding projection, the
vocabulary, heads. Each refusal names the field, the weights' value and the fix, before the run writes anything;
the weights' own value given explicitly is taken."""
import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from albert_jax import finetune, model as model_lib
from albert_jax.errors import InputError
from albert_jax.model_config import model_config_for
from albert_jax.run import Run
from albert_jax.weights import store
from albert_jax.weights.resolve import resolve
from experiments import classification
from tests.helpers import spm, write_split

UNSHARED = dict(sharing="none")  # an ELECTRA or RoBERTa run's layers: one set per layer
SQUARE = dict(embedding_size=64)  # E = H (the tiny size's H): no embedding projection unless one is asked for


def converted(path, **fields) -> str:
  """Weights of the tiny model with `fields`, saved as a converted folder (model_config.json records the model)."""
  model_config = model_config_for("tiny", **{"vocab_size": 300, **fields})
  backbone = jax.eval_shape(lambda: model_lib.init_params(model_lib.AlbertModel(model_config), jax.random.key(0)))
  store.save_pretrained(str(path), model_config, {"albert": jax.tree.map(lambda x: np.zeros(x.shape, x.dtype),
                                                                         nn.unbox(backbone))})
  return str(path)


def training_run(path, **fields) -> str:
  """A training run's folder whose config.json records the tiny model with `fields`, beside an empty checkpoints/
  (refused before its checkpoints are read)."""
  (path / "checkpoints").mkdir(parents=True)
  model = model_config_for("tiny", **{"vocab_size": 300, **fields})
  (path / "config.json").write_text(json.dumps({"model": model.to_dict()}))
  return str(path)


def config_with(init: str, field: str, value):
  """A fine-tuning config from `init` with --config.model.<field>=value, as `main` resolves it."""
  config = classification.get_config("size=tiny,spm=unused.model,text=sentence")
  config.init_checkpoint = init
  config.model[field] = value
  return resolve(init, config, overrides=(f"model.{field}",))


@pytest.mark.parametrize("saved_as", [converted, training_run])
@pytest.mark.parametrize("weights, field, value, saved", [
    (UNSHARED, "sharing", "all", "'none'"), (UNSHARED, "sharing", "ffn", "'none'"),
    (UNSHARED, "num_hidden_layers", 2, "4"), (SQUARE, "num_hidden_groups", 2, "1"),
    (SQUARE, "inner_group_num", 2, "1"), (SQUARE, "embedding_projection", True, "False"),
    (SQUARE, "hidden_size", 32, "64"), (SQUARE, "embedding_size", 16, "64"), (SQUARE, "vocab_size", 400, "300"),
    (SQUARE, "intermediate_size", 64, "256"), (SQUARE, "num_attention_heads", 2, "4")])
def test_an_override_that_changes_the_weights_model_is_refused_naming_the_field(tmp_path, saved_as, weights, field,
                                                                                value, saved):
  init = saved_as(tmp_path / "init", **weights)
  with pytest.raises(InputError) as refused:
    config_with(init, field, value).params
  fix = saved.strip("'")
  assert str(refused.value) == (
      f"init_checkpoint={init} was saved with model.{field}={saved} but this run has {value!r}; loaded into this "
      f"run's model, the weights would lose, reuse or misfit layers, or compute a different function. Pass "
      f"--config.model.{field}={fix}.")


@pytest.mark.parametrize("weights, field, value", [(UNSHARED, "sharing", "none"), (SQUARE, "embedding_projection",
                                                                                     False)])
def test_the_weights_own_value_given_explicitly_is_taken(tmp_path, weights, field, value):
  init = converted(tmp_path / "init", **weights)
  weights = config_with(init, field, value)
  assert weights.config.model[field] == value
  assert jax.tree.structure(weights.params) == jax.tree.structure(store.load_pretrained(init)[1])


def test_fine_tuning_with_sharing_all_from_an_unshared_run_is_refused_before_anything_is_written(shared_data,
                                                                                              tmp_path):
  """The case found: an ELECTRA or RoBERTa run's unshared layers fine-tuned with --config.model.sharing=all took
  layer 0 for all four and dropped layers 1-3."""
  init = training_run(tmp_path / "init", sharing="none", vocab_size=30000)
  write_split(tmp_path / "train.tsv", 8)
  write_split(tmp_path / "dev.tsv", 4)
  config = classification.get_config(f"size=tiny,data={tmp_path},spm={spm(shared_data)},text=sentence,"
                                     "labels=pos|neg")
  config.init_checkpoint, config.model.sharing = init, "all"
  config = resolve(init, config, overrides=("model.sharing",)).config
  with pytest.raises(InputError, match=rf"^init_checkpoint={init} was saved with model.sharing='none' but this run "
                                       r"has 'all'; .* Pass --config.model.sharing=none\.$"):
    finetune.train(config, Run(str(tmp_path / "run")))
  assert not (tmp_path / "run").exists()
