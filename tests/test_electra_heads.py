"""ELECTRA's fine-tuned heads beyond sequence classification: transformers' ElectraForQuestionAnswering,
ElectraForTokenClassification and ElectraForMultipleChoice read (logits within 1e-5 of transformers') and written back
(the very tensors, the same class); the tasks on an ELECTRA backbone build those heads and name those classes; a
multiple-choice run fine-tuned from a released-style ELECTRA folder exports as ElectraForMultipleChoice with its
logits."""
import json

import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax import convert, families, finetune
from albert_jax.errors import InputError
from albert_jax.families.electra_model import ElectraMultipleChoice
from albert_jax.formats import hf_albert, hf_electra
from albert_jax.model_config import ModelConfig, model_config_from
from albert_jax.run import Run
from albert_jax.tasks import TaskSettings, get_task
from albert_jax.tasks.heads import PooledClassifier, SpanExtractor, TokenClassifier
from albert_jax.weights import store
from experiments import multiple_choice
from tests.helpers import quietly
from tests.test_electra_classifier import HF, IDS, MASK, TYPES, VOCAB

pytestmark = pytest.mark.hf
TAGS = ["O", "B-X", "I-X", "B-Y"]  # not sorted: id2label's order must survive


@pytest.fixture
def hf():
  from tests import hf_models
  return hf_models


def noisy(hf, model):
  """Every weight random (biases and LayerNorms too), so a swapped tensor shows."""
  hf.torch.manual_seed(0)
  with hf.torch.no_grad():
    for p in model.parameters():
      p.copy_(hf.torch.randn_like(p) * 0.1)
  return model.eval()


def choices(x):
  """The shared batch as 2 questions of 2 options each (the options a leading dimension)."""
  return np.stack([x, x[::-1]], axis=1)


def ours(c: ModelConfig, params, architecture: str):
  """Our model of `architecture`'s head on the shared batch, as transformers' forward returns its logits."""
  if architecture == hf_electra.MULTIPLE_CHOICE:
    inputs = [jnp.asarray(choices(x)) for x in (IDS, MASK, TYPES)]
    return np.asarray(ElectraMultipleChoice(c).apply({"params": params}, *inputs))[..., 0]
  inputs = [jnp.asarray(x) for x in (IDS, MASK, TYPES)]
  if architecture == hf_electra.QUESTION_ANSWERING:
    return np.stack([np.asarray(x) for x in SpanExtractor(c).apply({"params": params}, *inputs)])
  return np.asarray(TokenClassifier(c, len(TAGS)).apply({"params": params}, *inputs))


def theirs(hf, model, architecture: str):
  if architecture == hf_electra.MULTIPLE_CHOICE:
    return hf.hf_forward(model, *(choices(x) for x in (IDS, MASK, TYPES))).logits.numpy()
  out = hf.hf_forward(model, IDS, MASK, TYPES)
  if architecture == hf_electra.QUESTION_ANSWERING:
    return np.stack([out.start_logits.numpy(), out.end_logits.numpy()])
  return out.logits.numpy()


@pytest.mark.parametrize("architecture", [hf_electra.QUESTION_ANSWERING, hf_electra.TOKEN_CLASSIFICATION,
                                          hf_electra.MULTIPLE_CHOICE])
def test_each_electra_head_class_converts_both_ways_with_its_logits(hf, tmp_path, architecture):
  """--from=hf: our head's logits within 1e-5 of transformers' (padding rows' positions excluded: both mask keys,
  the padded query's own output differs); head.json names the class; --to=hf: the same class, the very tensors,
  and id2label's order for the token classifier."""
  labels = dict(id2label=dict(enumerate(TAGS)), label2id={t: i for i, t in enumerate(TAGS)})
  config = hf.transformers.ElectraConfig(**HF, **(labels if architecture == hf_electra.TOKEN_CLASSIFICATION else {}))
  model = noisy(hf, getattr(hf.transformers, architecture)(config))
  source = hf.saved(model, tmp_path / "hf")
  convert.convert("hf", None, source, str(tmp_path / "ours"))
  c, params = store.load_pretrained(str(tmp_path / "ours"))
  ours_logits, hf_logits = ours(c, params, architecture), theirs(hf, model, architecture)
  real = MASK.astype(bool) if architecture != hf_electra.MULTIPLE_CHOICE else np.ones_like(hf_logits, bool)
  if architecture == hf_electra.QUESTION_ANSWERING:
    real = np.broadcast_to(real, hf_logits.shape)
  np.testing.assert_allclose(ours_logits[real], hf_logits[real], atol=1e-5, rtol=0)
  recorded = json.loads((tmp_path / "ours" / "head.json").read_text())
  assert recorded["hf_architecture"] == architecture

  convert.convert(None, "hf", str(tmp_path / "ours"), str(tmp_path / "back"), spm_model=convert.NO_TOKENIZER)
  hf.assert_same_tensors({k: v for k, v in hf.read(source).items() if "position_ids" not in k},
                         hf.read(tmp_path / "back"))
  back = json.loads((tmp_path / "back" / "config.json").read_text())
  assert back["architectures"] == [architecture]
  if architecture == hf_electra.TOKEN_CLASSIFICATION:
    assert back["id2label"] == {str(i): t for i, t in enumerate(TAGS)}
  loaded = getattr(hf.transformers, architecture).from_pretrained(tmp_path / "back").eval()
  np.testing.assert_array_equal(theirs(hf, loaded, architecture), hf_logits)


def test_another_multiple_choice_summary_and_another_family_s_folder_are_refused(hf, tmp_path):
  config = hf.transformers.ElectraConfig(**HF, summary_type="mean")
  hf.saved(hf.transformers.ElectraForMultipleChoice(config), tmp_path / "mean")
  with pytest.raises(InputError, match=r"config.json has summary_type='mean'; albert_jax's ELECTRA multiple-choice "
                                       r"scorer computes the summary of summary_type='first', summary_use_proj=True"):
    hf_electra.load_hf(str(tmp_path / "mean"))
  types = ", ".join(sorted(family.hf_model_type for family in families.all_families()))
  assert "electra" in types
  with pytest.raises(InputError, match=rf"^config.json has model_type='electra', which ALBERT's classes cannot read; "
                                       rf"the model types read here are {types}, each by `convert --from=hf`"):
    hf_albert.config_from_hf({"model_type": "electra"})


def test_tasks_on_an_electra_backbone_build_its_heads_and_name_its_classes(tmp_path):
  """classifier_head=electra (what auto becomes for ELECTRA weights): RACE and multiple_choice score with
  ELECTRA's scorer, recorded with the run; SQuAD and tagging keep their heads (ELECTRA's are the same) and export
  as ELECTRA's classes. ALBERT's stay as they were."""
  c = ModelConfig(**{k: v for k, v in HF.items() if not k.endswith("dropout_prob")}, sharing="none")
  common = dict(path=str(tmp_path), max_seq_length=16, max_qa_length=8, max_query_length=8)
  tasks = {(task, head): get_task(TaskSettings(task=task, classifier_head=head, labels=("O", "B-X"), **common))
           for task in ("race", "multiple_choice", "squad_v1", "token_classification") for head in ("electra", "albert")}
  assert [type(tasks[task, "electra"].make_model(c)) for task in ("race", "multiple_choice")] == [
      ElectraMultipleChoice] * 2
  assert [type(tasks[task, "albert"].make_model(c)) for task in ("race", "multiple_choice")] == [PooledClassifier] * 2
  assert [tasks[task, head].hf_head.architecture for task in ("race", "squad_v1", "token_classification")
          for head in ("electra", "albert")] == [
      "ElectraForMultipleChoice", "AlbertForMultipleChoice", "ElectraForQuestionAnswering",
      "AlbertForQuestionAnswering", "ElectraForTokenClassification", "AlbertForTokenClassification"]
  assert tasks["race", "electra"].identity() == {**tasks["race", "albert"].identity(), "classifier_head": "electra"}
  assert tasks["squad_v1", "electra"].identity() == tasks["squad_v1", "albert"].identity()
  assert tasks["race", "electra"].describe_head(ElectraMultipleChoice(c)) == (
      "multiple-choice head: ELECTRA's (ElectraMultipleChoice)")


def questions(count: int) -> str:
  """multiple_choice's train.jsonl rows: 2 or 3 options (the third masked for every other question)."""
  rows = [{"id": f"q{i}", "context": "a good film", "question": "the film ?", "options": ["good", "bad", "fine"][
      :2 + i % 2], "answer": i % 2} for i in range(count)]
  return "".join(json.dumps(row) + "\n" for row in rows)


@pytest.mark.slow  # a fine-tuning run and two conversions checked through transformers: about 30 s on 2 busy cores
def test_multiple_choice_from_a_released_style_electra_folder_exports_as_electra_for_multiple_choice(hf, shared_data,
                                                                                                     tmp_path):
  """An ElectraForPreTraining folder with its vocab.txt, converted; multiple_choice fine-tunes from it with
  ELECTRA's scorer by default (recorded), and --to=hf of the run is an ElectraForMultipleChoice with the run's
  logits."""
  source = tmp_path / "hf"
  fields = {**HF, "vocab_size": len(VOCAB), "max_position_embeddings": 24}
  hf.saved(hf.transformers.ElectraForPreTraining(hf.transformers.ElectraConfig(**fields)), source)
  (source / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  quietly(convert.convert, "hf", None, str(source), str(tmp_path / "ours"))
  data = tmp_path / "data"
  data.mkdir()
  for split, count in (("train", 8), ("dev", 4)):
    (data / f"{split}.jsonl").write_text(questions(count))
  config = multiple_choice.get_config(f"size=tiny,data={data},spm={tmp_path / 'ours' / 'vocab.txt'},choices=3")
  config.init_checkpoint, config.allow_random_init = str(tmp_path / "ours"), False
  config.model.update({k: v for k, v in fields.items() if not k.endswith("dropout_prob")}, sharing="none")
  config.data.update(max_seq_length=16, max_qa_length=6)
  config.train.update(num_train_steps=2, global_batch_size=8, warmup_steps=1, eval_every=2, micro_batch_size=0)
  config.checkpoint.every = 2
  said = quietly(finetune.train, config, Run(str(tmp_path / "run")))
  assert "classifier_head=electra: " in said
  assert json.loads((tmp_path / "run" / "head.json").read_text())["classifier_head"] == "electra"

  quietly(convert.convert, None, "hf", str(tmp_path / "run"), str(tmp_path / "export"))
  exported = hf.transformers.ElectraForMultipleChoice.from_pretrained(tmp_path / "export").eval()
  best = json.loads((tmp_path / "run" / "best" / "best.json").read_text())["weights"]
  params = store.load_pretrained(best)[1]
  assert sorted(params) == ["albert", "classifier", "sequence_summary"]
  ids = choices(np.minimum(IDS, len(VOCAB) - 1))
  inputs = (ids, choices(MASK), choices(TYPES))
  ours_logits = ElectraMultipleChoice(model_config_from(config)).apply({"params": params},
                                                                       *map(jnp.asarray, inputs))[..., 0]
  np.testing.assert_allclose(hf.hf_forward(exported, *inputs).logits.numpy(), np.asarray(ours_logits), atol=1e-5,
                             rtol=0)
