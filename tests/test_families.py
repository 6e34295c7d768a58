"""The model-family registry: each family's transformers names, head and runs, the one-line refusals of an unknown
one, and no family branch outside it."""
import subprocess
import sys

import pytest

from albert_jax import families
from tests.helpers import REPO


def test_each_family_names_its_transformers_classes():
  assert families.get("albert").hf_class(families.PRETRAINING) == "AlbertForPreTraining"
  assert families.get("electra").hf_class(families.QUESTION_ANSWERING) == "ElectraForQuestionAnswering"
  assert families.for_hf_model_type("electra", "config.json").name == "electra"
  assert families.for_hf_class("AlbertForMultipleChoice").name == "albert"
  assert families.for_hf_class("BertForMaskedLM").name == "bert"
  assert families.for_hf_model_type("roberta", "config.json").name == "roberta"
  assert families.for_hf_class("RobertaForPreTraining") is None  # transformers has none
  assert families.for_hf_class("GPT2LMHeadModel") is None
  assert families.get("electra").role_of("ElectraModel") == families.BACKBONE


def test_an_unknown_family_or_model_type_is_refused_naming_the_known_ones():
  with pytest.raises(ValueError, match="No model family 'gpt2'; the families are albert, bert, electra, roberta"):
    families.get("gpt2")
  with pytest.raises(ValueError, match=r"x/config.json has model_type='t5'; the model types read here are albert"):
    families.for_hf_model_type("t5", "x/config.json")


def test_each_family_owns_its_classification_head_and_the_heads_are_named_after_them():
  from albert_jax.families.electra_model import ElectraClassifier
  from albert_jax.tasks.heads import PooledClassifier
  assert families.classifier_heads() == ("auto", "albert", "electra", "bert", "roberta")
  assert families.classifier_family("electra").classifier() is ElectraClassifier
  assert families.classifier_family("bert").classifier() is PooledClassifier
  roberta = families.classifier_family("roberta").classifier()
  assert (roberta.func, roberta.keywords) == (ElectraClassifier, {"activation": "tanh"})
  assert families.classifier_family("auto").classifier() is families.classifier_family("albert").classifier()
  assert families.classifier_family("albert").classifier() is PooledClassifier
  from albert_jax.families.electra_model import ElectraMultipleChoice
  assert [families.get(name).multiple_choice() for name in ("albert", "electra")] == [PooledClassifier,
                                                                                      ElectraMultipleChoice]
  assert families.hf_classes(families.SEQUENCE_CLASSIFICATION) == (
      "AlbertForSequenceClassification", "ElectraForSequenceClassification", "BertForSequenceClassification",
      "RobertaForSequenceClassification")
  assert families.hf_classes(families.PRETRAINING) == (
      "AlbertForPreTraining", "ElectraForPreTraining", "BertForPreTraining")


def test_the_registry_and_the_head_names_import_no_jax():
  """A family's head loads when asked: asking the registry (as head_identity does on import) leaves jax unloaded."""
  script = ("import sys; from albert_jax import families, head_identity; "
            "print([f.hf_class(families.BACKBONE) for f in families.all_families()], 'jax' in sys.modules)")
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.stdout.strip() == "['AlbertModel', 'ElectraModel', 'BertModel', 'RobertaModel'] False", (
      result.stderr[-3000:])


def test_a_run_s_family_is_told_by_its_params_or_its_recorded_config():
  electra_run = {"albert": {}, "generator": {}, "discriminator_predictions": {}, "generator_predictions": {}}
  assert families.family_of(electra_run).name == "electra"
  assert families.family_of({"albert": {}, "predictions": {}, "sop": {}}).name == "albert"
  assert families.family_of({"generator": {}}).name == "albert"  # no backbone: not a run of a pair
  assert [families.of_run(config).name for config in (
      {"task": "electra"}, {"task": "pretrain"}, {"task": "glue", "classifier_head": "electra"},
      {"task": "glue", "classifier_head": "auto"}, {"task": "squad_v1"},
      {"task": "pretrain", "model_family": "bert"}, {"task": "pretrain", "model_family": "roberta"},
      {"task": "glue", "classifier_head": "roberta"}, {"task": "squad_v1", "classifier_head": "bert"})] == [
          "electra", "albert", "electra", "albert", "albert", "bert", "roberta", "roberta", "bert"]
  with pytest.raises(ValueError, match="No model family 'gpt'"):
    families.of_run({"task": "pretrain", "model_family": "gpt"})


def test_no_module_outside_the_families_branches_on_a_family():
  """No comparison with a family's name (a string, or a constant spelled as one), nor a hasattr probe naming one,
  outside albert_jax/families/ and albert_jax/formats/, which name their families' weights. A key looked up in a
  mapping (`"albert" in params`: the backbone's name) is no branch."""
  import ast
  import pathlib
  names = {family.name for family in families.all_families()}
  root = pathlib.Path(families.__file__).parents[1]
  skipped = {"families", "formats"}

  def names_a_family(node) -> bool:
    values = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    spelled = lambda v: (v.value if isinstance(v, ast.Constant) and isinstance(v.value, str)
                         else v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else "")
    return any(spelled(v).lower() in names for v in values)

  def branches(node) -> bool:
    if isinstance(node, ast.Compare):
      return any(names_a_family(left) or names_a_family(right)
                 for left, op, right in zip([node.left, *node.comparators], node.ops, node.comparators)
                 if not isinstance(op, (ast.In, ast.NotIn)) or isinstance(right, (ast.Tuple, ast.List, ast.Set)))
    return (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr"
            and any(name in ast.unparse(node).lower() for name in names))

  found = [f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}" for path in sorted(root.rglob("*.py"))
           if path.relative_to(root).parts[0] not in skipped
           for node in ast.walk(ast.parse(path.read_text())) if branches(node)]
  assert not found, "\n".join(found)
