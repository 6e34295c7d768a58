"""The model-family registry: each family's transformers names, and the one-line refusals of an unknown one."""
import pytest

from albert_jax import families


def test_each_family_names_its_transformers_classes():
  assert families.get("albert").hf_class(families.PRETRAINING) == "AlbertForPreTraining"
  assert families.get("electra").hf_class(families.QUESTION_ANSWERING) == "ElectraForQuestionAnswering"
  assert families.for_hf_model_type("electra", "config.json").name == "electra"
  assert families.for_hf_class("AlbertForMultipleChoice").name == "albert"
  assert families.for_hf_class("BertForMaskedLM") is None
  assert families.get("electra").role_of("ElectraModel") == families.BACKBONE


def test_an_unknown_family_or_model_type_is_refused_naming_the_known_ones():
  with pytest.raises(ValueError, match="No model family 'gpt2'; the families are albert, electra"):
    families.get("gpt2")
  with pytest.raises(ValueError, match=r"x/config.json has model_type='t5'; the model types read here are albert"):
    families.for_hf_model_type("t5", "x/config.json")
