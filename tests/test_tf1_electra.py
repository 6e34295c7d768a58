"""google-research/electra's TF1 checkpoints (albert_jax/formats/tf1_electra.py): a fixture written by TensorFlow
(tests/fixtures/tf1/make_fixtures.py) converted by `convert --from=tf1` into a discriminator folder and its
generator's, whose logits equal the same checkpoint through transformers' `load_tf_weights_in_electra` (the *_hf
dirs); sizes and head counts from the weights' shapes by the released code's rule; what is not ELECTRA's pair as
released is refused in one line."""

import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax import convert
from albert_jax.errors import InputError
from albert_jax.families.electra_model import ElectraForPreTraining
from albert_jax.formats import hf_electra, names, tf1, tf1_electra
from albert_jax.model import AlbertModel, MaskedLMHead
from albert_jax.model_config import ModelConfig
from albert_jax.weights import record, store
from tests.helpers import quietly, require_module
from tests.test_tf1 import FIXTURES, batch

SOURCE = FIXTURES / "electra"


def fixture_variables():
  bundle = tf1.TensorBundle(str(SOURCE / "model.ckpt-5"))
  return {name: entry["shape"] for name, entry in bundle.entries.items() if name != "global_step"}, bundle.read


@pytest.mark.hf
def test_both_towers_equal_transformers_conversion_of_the_same_checkpoint(tmp_path):
  """Replaced-token logits of the discriminator and MLM logits of the generator within 1e-5 of transformers' on the
  real positions; each folder an ELECTRA backbone with the released folder's vocab.txt."""
  torch = require_module("torch", extra="hf")
  transformers = require_module("transformers", extra="hf")
  said = quietly(convert.convert, "tf1", None, str(SOURCE), str(tmp_path / "ours"))
  assert "ours/generator: albert, generator_predictions (H=32, heads=1)" in said, said
  ids, mask, types = batch()
  inputs = {k: torch.tensor(v) for k, v in zip(("input_ids", "attention_mask", "token_type_ids"), batch())}
  real = mask.astype(bool)  # padded positions are not compared: HF and we mask keys differently there

  c, params = store.load_pretrained(str(tmp_path / "ours"))
  assert (c.hidden_size, c.num_attention_heads, c.has_embedding_projection, sorted(params)) == (
      128, 2, False, ["albert", "discriminator_predictions"])
  ours = ElectraForPreTraining(c).apply({"params": params}, *map(jnp.asarray, batch()),
                                        method=ElectraForPreTraining.discriminator_logits)
  with torch.no_grad():
    theirs = transformers.ElectraForPreTraining.from_pretrained(FIXTURES / "electra_hf").eval()(**inputs).logits
  assert np.abs(np.asarray(ours) - theirs.numpy())[real].max() <= 1e-5

  g, generator = store.load_pretrained(str(tmp_path / "ours" / "generator"))
  assert (g.hidden_size, g.num_attention_heads, g.has_embedding_projection, sorted(generator)) == (
      32, 1, True, ["albert", "generator_predictions"])
  sequence, _ = AlbertModel(g).apply({"params": generator["albert"]}, *map(jnp.asarray, batch()))
  word = generator["albert"]["embeddings"]["word_embeddings"]["embedding"]
  ours = MaskedLMHead(g).apply({"params": generator["generator_predictions"]}, sequence, lambda x: x @ word.T)
  with torch.no_grad():
    theirs = transformers.ElectraForMaskedLM.from_pretrained(FIXTURES / "electra_generator_hf").eval()(**inputs)
  assert np.abs(np.asarray(ours) - theirs.logits.numpy())[real].max() <= 1e-5

  for folder in (tmp_path / "ours", tmp_path / "ours" / "generator"):
    assert record.backbone_family(str(folder)) == "electra"
    assert (folder / "vocab.txt").read_bytes() == (SOURCE / "vocab.txt").read_bytes()
  assert (c.hidden_act, g.hidden_act, c.layer_norm_eps) == ("gelu", "gelu", 1e-12)


def test_sizes_come_from_the_shapes_and_heads_from_the_released_rule():
  """ELECTRA-Small as released: H=256 (4 heads), its generator H=64 (1 head), E=128, 12 layers each."""
  shapes = {"electra/embeddings/word_embeddings": (30522, 128), "electra/embeddings/position_embeddings": (512, 128),
            "electra/embeddings/token_type_embeddings": (2, 128)}
  for scope, hidden in (("electra", 256), ("generator", 64)):
    for layer in range(12):
      shapes.update({f"{scope}/encoder/layer_{layer}/attention/self/query/kernel": (hidden, hidden),
                     f"{scope}/encoder/layer_{layer}/intermediate/dense/kernel": (hidden, 4 * hidden)})
  small, generator = (tf1_electra.tower_config(shapes, scope) for scope in ("electra", "generator"))
  assert (small.hidden_size, small.num_attention_heads, small.intermediate_size, small.num_hidden_layers,
          small.vocab_size, small.max_position_embeddings) == (256, 4, 1024, 12, 30522, 512)
  assert (generator.hidden_size, generator.num_attention_heads, generator.embedding_size) == (64, 1, 128)
  assert tf1_electra.tower_config({k: v for k, v in shapes.items() if not k.startswith("generator/")},
                                  "generator") is None


def test_a_fine_tuned_discriminator_alone_gives_the_backbone_and_other_pairs_are_refused():
  variables, read = fixture_variables()
  alone = {k: v for k, v in variables.items() if k.split("/")[0] in ("electra", "classifier")}
  towers = tf1_electra.load({**alone, "classifier/kernel": (128, 3)}, read, "ckpt")
  assert list(towers) == ["electra"] and sorted(towers["electra"][1]) == ["albert"]
  assert tf1_electra.holds_electra(set(variables)) and not tf1_electra.holds_electra({"bert/embeddings/word_embeddings"})

  untied = {**variables, "generator/embeddings/word_embeddings": (50, 128)}
  with pytest.raises(InputError, match=r"^ckpt: variables \['generator/embeddings/word_embeddings'\] have no place in "
                                       r"ELECTRA's pair .* only google-research/electra's ELECTRA objective"):
    tf1_electra.load(untied, read, "ckpt")
  cut = {k: v for k, v in variables.items() if k != "generator/encoder/layer_1/output/dense/bias"}
  with pytest.raises(InputError, match=r"^ckpt: variable generator/encoder/layer_1/output/dense/bias \(ours albert/"
                                       r"encoder/group_1/inner_0/ffn/output/bias\) is missing; the generator/ tower"):
    tf1_electra.load(cut, read, "ckpt")


def test_the_tf1_electra_columns_name_every_parameter_of_each_tower_once():
  c = ModelConfig(vocab_size=50, embedding_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=40, sharing="none")
  for column, head in ((names.TF1_ELECTRA, "discriminator_predictions"),
                       (names.TF1_ELECTRA_GENERATOR, "generator_predictions")):
    entries = names.name_map(column, c)
    assert {ours for ours, _, _ in entries} == {path for path in hf_electra.pair_shapes(c) if path[0] in (
        "albert", head) and path[:2] != ("albert", "pooler")}
    assert len({name for _, name, _ in entries}) == len(entries)
