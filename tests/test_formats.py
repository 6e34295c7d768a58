"""The weight formats: the name table's columns against the models' parameter trees, its entries in each format's
spelling, and the registry that `convert --from/--to` dispatch over."""
import flax.linen as nn
from flax import traverse_util
import pytest

from albert_jax import model as model_lib
from albert_jax.families.electra_model import ElectraForPreTraining
from albert_jax.errors import InputError
from albert_jax.formats import names, registry
from albert_jax.model_config import ModelConfig
from tests.test_cli_args import run

ALBERT = ModelConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=4, num_hidden_groups=2,
                     inner_group_num=2, num_attention_heads=2, intermediate_size=32)
ELECTRA = ALBERT.replace(num_hidden_groups=1, inner_group_num=1, sharing="none", num_hidden_layers=3)


def param_paths(module) -> set[tuple[str, ...]]:
  return set(traverse_util.flatten_dict(nn.unbox(model_lib.abstract_params(module))))


@pytest.mark.parametrize("column", [names.HF_ALBERT, names.TF1_ALBERT])
def test_an_albert_column_names_every_parameter_of_the_model_once(column):
  entries = names.name_map(column, ALBERT)
  assert {ours for ours, _, _ in entries} == param_paths(model_lib.AlbertForPreTraining(ALBERT))
  assert len({name for _, name, _ in entries}) == len(entries)


def test_the_electra_column_names_the_discriminator_and_the_generator_of_a_run():
  discriminator = names.name_map(names.HF_ELECTRA, ELECTRA, names.ENCODER_PARTS + (names.DISCRIMINATOR,))
  generator = names.name_map(names.HF_ELECTRA, ELECTRA, (names.PROJECTION, names.LAYERS, names.GENERATOR),
                             encoder=("generator",))
  ours = {path for path, _, _ in discriminator + generator}
  assert ours == param_paths(ElectraForPreTraining(ELECTRA, 1.0)) - {("albert", "pooler", "kernel"),
                                                                      ("albert", "pooler", "bias")}


@pytest.mark.parametrize("column, ours, name, transposed", [
    (names.HF_ALBERT, ("albert", "encoder", "group_1", "inner_1", "attention", "query", "kernel"),
     "albert.encoder.albert_layer_groups.1.albert_layers.1.attention.query.weight", True),
    (names.HF_ALBERT, ("albert", "encoder", "group_0", "inner_1", "ffn", "LayerNorm", "scale"),
     "albert.encoder.albert_layer_groups.0.albert_layers.1.full_layer_layer_norm.weight", False),
    (names.HF_ALBERT, ("sop_classifier", "kernel"), "sop_classifier.classifier.weight", True),
    (names.TF1_ALBERT, ("albert", "encoder", "group_1", "inner_0", "ffn", "output", "kernel"),
     "bert/encoder/transformer/group_1/inner_group_0/ffn_1/intermediate/output/dense/kernel", False),
    (names.TF1_ALBERT, ("albert", "embeddings", "LayerNorm", "bias"), "bert/embeddings/LayerNorm/beta", False),
    (names.TF1_ALBERT, ("albert", "embeddings", "word_embeddings", "embedding"), "bert/embeddings/word_embeddings",
     False),
    (names.TF1_ALBERT, ("sop_classifier", "kernel"), "cls/seq_relationship/output_weights", True),
    (names.TF1_ALBERT, ("predictions", "bias"), "cls/predictions/output_bias", False),
    (names.HF_ELECTRA, ("albert", "encoder", "group_2", "inner_0", "attention", "LayerNorm", "scale"),
     "electra.encoder.layer.2.attention.output.LayerNorm.weight", False),
    (names.HF_ELECTRA, ("albert", "encoder", "embedding_hidden_mapping_in", "bias"), "electra.embeddings_project.bias",
     False),
    (names.HF_ELECTRA, ("classifier", "out_proj", "kernel"), "classifier.out_proj.weight", True)])
def test_each_entry_is_spelt_as_its_format_spells_it(column, ours, name, transposed):
  config = ELECTRA if column == names.HF_ELECTRA else ALBERT
  assert (ours, name, transposed) in names.name_map(column, config)


def test_the_projection_is_named_only_where_the_model_has_one():
  same_width = ELECTRA.replace(embedding_size=16)
  assert not [e for e in names.name_map(names.HF_ELECTRA, same_width) if "embeddings_project" in e[1]]
  assert len([e for e in names.name_map(names.HF_ELECTRA, ELECTRA) if "embeddings_project" in e[1]]) == 2


def test_the_registry_lists_what_each_format_can_do_and_refuses_an_unknown_one():
  assert registry.readers() == ["hf", "tf1"] and registry.writers() == ["hf"]
  with pytest.raises(InputError, match=r"^No weight format 'onnx'; the formats are hf, tf1\.$"):
    registry.get("onnx")


def test_convert_help_and_a_wrong_format_name_the_registered_formats():
  shown = run("albert_jax.convert", "--help").stdout
  assert "--from: <hf|tf1>: Convert from this format" in shown and "--to: <hf>: Convert our" in shown, shown
  from_help, to_help = shown.split("--from:")[1].split("--revision")[0], shown.split("--to:")[1]
  assert "tf1: a TF1 checkpoint + albert_config.json" in from_help and "tf1:" not in to_help, shown
  refused = run("albert_jax.convert", "--to=tf1", "--src=a", "--dst=b")
  assert refused.returncode != 0 and "flag --to=tf1: value should be one of <hf>" in refused.stderr, refused.stderr
