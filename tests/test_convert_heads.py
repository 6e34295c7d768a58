"""Converted weights keep what their head was trained for: a transformers classifier's class order and problem
type go to head.json and back to config.json, eval/predict/warm starts read them (or refuse another order), token
classifiers and masked LMs round-trip as their own classes; every load into a model built from the current config
refuses a head count (activation, layer count) that no weight shape shows; an export onto a full disk is one line;
predict and embed read a read-only workdir."""
import contextlib
import importlib
import io
import json
import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from albert_jax import cli, compilation_cache, convert, embed, finetune, job_kinds, pretrain
from albert_jax import model as model_lib
from albert_jax.errors import InputError
from albert_jax.model_config import model_config_from
from albert_jax.run import Run
from albert_jax.run.layout import HEAD_FILE
from albert_jax.tasks.heads import PooledClassifier
from albert_jax.weights import store
from albert_jax.weights.resolve import resolve
from experiments import classification, glue, pretrain_tiny
from tests.helpers import REPO, config_for, glue_data, quietly, spm, write_split

# The model of every run here: SMALL of tests/hf_models.py with the vocabulary of the shared spiece.model.
MODEL = dict(vocab_size=30000, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=24)


@pytest.fixture
def hf():
  """tests/hf_models.py, the transformers models and files; without torch and transformers (the `hf` extra) a
  failure in CI (CI set) and a skip elsewhere."""
  return importlib.import_module("tests.hf_models")


def converted(hf, tmp_path, architecture, name="ours", **hf_config) -> str:
  """A random transformers model of `architecture` (MODEL + `hf_config`) converted with `convert --from=hf`; a
  classifier's bias makes it predict its class 0 for every input."""
  model = hf.hf_model(getattr(hf.transformers, architecture), **{**MODEL, **hf_config})
  if architecture == "AlbertForSequenceClassification":
    with hf.torch.no_grad():
      model.classifier.bias[:] = hf.torch.linspace(5.0, -5.0, model.num_labels)
  source = hf.saved(model, tmp_path / f"{name}_hf")
  convert.convert("hf", None, source, str(tmp_path / name))
  return str(tmp_path / name)


def printing(fn, *args):
  """(fn(*args), what it printed)."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    result = fn(*args)
  return result, out.getvalue()


def labelled(labels) -> dict:
  return {"id2label": dict(enumerate(labels)), "label2id": {label: i for i, label in enumerate(labels)}}


def own_data_config(shared_data, tmp_path, labels=""):
  """Your own classification data (labels pos and neg) for MODEL."""
  data = tmp_path / "data"
  data.mkdir(exist_ok=True)
  write_split(data / "train.tsv", 8)
  write_split(data / "dev.tsv", 4)
  config = config_for(data, spm(shared_data), labels)
  config.model.update(MODEL)
  return config


def rte_config(shared_data, tmp_path):
  config = glue.get_config(f"task=rte,size=tiny,data={glue_data(shared_data, 'rte', tmp_path / 'glue')},"
                           f"spm={spm(shared_data)}")
  config.model.update(MODEL)
  config.data.max_seq_length = 16
  config.train.micro_batch_size = 0
  return config


# ------------------------------------------------------------------------ class order, problem type

@pytest.mark.hf
def test_a_converted_classifier_predicts_and_exports_in_its_own_class_order(hf, shared_data, tmp_path):
  """HF id2label [pos, neg] (not the sorted order): recorded by --from=hf, used by predict on a config without
  labels=, refused against labels=neg|pos, and written back by --to=hf with the very tensors."""
  weights = converted(hf, tmp_path, "AlbertForSequenceClassification", **labelled(["pos", "neg"]))
  texts = tmp_path / "in.tsv"
  write_split(texts, 3, labeled=False)
  args = job_kinds.RunArgs(input=str(texts), output=str(tmp_path / "out.jsonl"))
  quietly(finetune.predict, own_data_config(shared_data, tmp_path), Run(weights), args)
  rows = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
  assert [(r["label"], list(r["probabilities"])) for r in rows] == [("pos", ["pos", "neg"])] * 3
  with pytest.raises(ValueError, match=r"labels=pos\|neg, num_labels=2, not for this run's task=classification, "
                                       r"labels=neg\|pos; .*pass labels=pos\|neg \(--config.data.labels\)"):
    finetune.predict(own_data_config(shared_data, tmp_path, labels="neg|pos"), Run(weights), args)

  convert.convert(None, "hf", weights, str(tmp_path / "back"), spm_model=convert.NO_TOKENIZER)
  back = json.loads((tmp_path / "back" / "config.json").read_text())
  assert (back["architectures"], back["id2label"], back["label2id"], back["problem_type"]) == (
      ["AlbertForSequenceClassification"], {"0": "pos", "1": "neg"}, {"pos": 0, "neg": 1},
      "single_label_classification")
  hf.assert_same_tensors(hf.read(tmp_path / "ours_hf"), hf.read(tmp_path / "back"))
  assert json.loads((tmp_path / "ours" / HEAD_FILE).read_text()) == {
      "hf_architecture": "AlbertForSequenceClassification", "labels": ["pos", "neg"], "num_labels": 2,
      "problem_type": None}


def test_a_fine_tuning_run_exports_the_class_order_it_recorded(shared_data, tmp_path):
  """A run whose config names no labels trained with the train file's sorted classes, recorded in best.json:
  --to=hf writes those, without the train file (which is gone here)."""
  config = own_data_config(shared_data, tmp_path)
  (tmp_path / "data" / "train.tsv").unlink()
  workdir = tmp_path / "run"
  step = workdir / "best" / "step_3"
  model_config = model_config_from(config)
  params = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nn.unbox(model_lib.abstract_params(
      PooledClassifier(model_config, 2))))
  store.save_pretrained(str(step), model_config, params)
  (workdir / "config.json").write_text(config.to_json_best_effort())
  (workdir / "best" / "best.json").write_text(json.dumps(
      {"step": 3, "metric": "accuracy", "value": 0.5, "weights": str(step),
       "head": {"task": "classification", "task_name": "", "labels": ["pos", "neg"]}}))
  convert.convert(None, "hf", str(workdir), str(tmp_path / "hf"))
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["id2label"] == {"0": "pos", "1": "neg"}


@pytest.mark.hf
def test_glue_reads_a_converted_head_in_its_fixed_order_or_refuses_it(hf, shared_data, tmp_path):
  """GLUE's classes have a fixed order (RTE: entailment, not_entailment): a transformers RTE model in that order
  is scored as it is, one in the other order is refused by eval, by num_train_steps=0 prediction, and its head
  starts afresh in a warm start (never read as swapped classes)."""
  config = rte_config(shared_data, tmp_path)
  same = converted(hf, tmp_path, "AlbertForSequenceClassification", "same",
                   **labelled(["entailment", "not_entailment"]))
  output = quietly(finetune.evaluate, config, Run(same))  # always class 0, entailment: the share of entailment rows
  dev = (tmp_path / "glue" / "RTE" / "dev.tsv").read_text().splitlines()[1:]
  share = sum(line.endswith("\tentailment") for line in dev) / len(dev)
  assert json.loads(output.splitlines()[-1])["accuracy"] == pytest.approx(share)

  swapped = converted(hf, tmp_path, "AlbertForSequenceClassification", "swapped",
                      **labelled(["not_entailment", "entailment"]))
  with pytest.raises(ValueError, match=r"labels=not_entailment\|entailment, num_labels=2, not for this run's "
                                       r"task=glue, task_name=rte, labels=entailment\|not_entailment; .*class order "
                                       r"is fixed.*labels=not_entailment\|entailment"):
    finetune.evaluate(config, Run(swapped))
  assert not (tmp_path / "swapped" / "dev_predictions.tsv").exists()
  config.init_checkpoint, config.train.num_train_steps = swapped, 0
  with pytest.raises(ValueError, match=f"init_checkpoint={re.escape(swapped)} holds a head trained for .*fixed"):
    finetune.predict_test(config, Run(str(tmp_path / "predicted")))  # predicts with the head as it is

  task = finetune.get_task(config)
  model = task.build_model(model_config_from(config))
  fresh = jax.device_get(nn.unbox(task.init_params(model, jax.random.key(0))))
  for weights, kept in ((same, True), (swapped, False)):
    config.init_checkpoint = weights
    start, printed = printing(finetune._warm_start, config, task, model, resolve(weights, config))
    params, left_fresh = start(fresh)
    assert ("classifier/kernel" not in left_fresh) == kept
    assert ("starts afresh" in printed) == (not kept)
    np.testing.assert_array_equal(params["classifier"]["bias"],
                                  store.load_pretrained(weights)[1]["classifier"]["bias"] if kept
                                  else fresh["classifier"]["bias"])


@pytest.mark.hf
def test_a_warm_start_takes_a_converted_heads_order_for_the_train_files_classes(hf, shared_data, tmp_path):
  """No labels= in the config: the classes of the train file (neg, pos) in the converted head's order; a head for
  other classes leaves the sorted order and starts afresh."""
  config = own_data_config(shared_data, tmp_path)
  config.init_checkpoint = converted(hf, tmp_path, "AlbertForSequenceClassification", "ours",
                                     **labelled(["pos", "neg"]))
  assert finetune._task_and_model(config, resolve(config.init_checkpoint, config), warm_start=True)[0].labels == (
      "pos", "neg")
  config.init_checkpoint = converted(hf, tmp_path, "AlbertForSequenceClassification", "other",
                                     **labelled(["yes", "no"]))
  weights = resolve(config.init_checkpoint, config)
  task, _, _, model = finetune._task_and_model(config, weights, warm_start=True)
  assert task.labels == ("neg", "pos")
  assert "labels=yes|no, num_labels=2, not for this run's task=classification, labels=neg|pos: it starts afresh" in (
      quietly(finetune._warm_start, config, task, model, weights))


@pytest.mark.hf
@pytest.mark.parametrize("overrides, head", [
    (dict(num_labels=1, problem_type="regression"),
     {"labels": None, "num_labels": 1, "problem_type": "regression"}),
    (dict(problem_type="single_label_classification", **labelled(["neg", "pos"])),
     {"labels": ["neg", "pos"], "num_labels": 2, "problem_type": "single_label_classification"}),
    (dict(num_labels=3), {"labels": None, "num_labels": 3, "problem_type": None})],
    ids=["regression", "named", "unnamed"])
def test_hf_to_ours_to_hf_keeps_id2label_and_problem_type(hf, tmp_path, overrides, head):
  weights = converted(hf, tmp_path, "AlbertForSequenceClassification", **overrides)
  convert.convert(None, "hf", weights, str(tmp_path / "back"), spm_model=convert.NO_TOKENIZER)
  source, back = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("ours_hf", "back"))
  assert back["id2label"] == source["id2label"] and back["label2id"] == source["label2id"]
  assert back["problem_type"] == (source.get("problem_type") or "single_label_classification")
  hf.assert_same_tensors(hf.read(tmp_path / "ours_hf"), hf.read(tmp_path / "back"))
  assert json.loads((tmp_path / "ours" / HEAD_FILE).read_text()) == {
      "hf_architecture": "AlbertForSequenceClassification", **head}


@pytest.mark.hf
def test_a_converted_multi_label_classifier_predicts_a_sigmoid_per_class_in_its_own_order(hf, shared_data,
                                                                                          tmp_path):
  """HF problem_type multi_label_classification, id2label [c, a, b], biases 5, 0, -5 (logits about those, the
  weights being small): a multi_label=true task without labels= reads one sigmoid per class in that order (a
  softmax would give 0.993, 0.007, 0.00005), a single-label task refuses the head, and --to=hf writes it back."""
  weights = converted(hf, tmp_path, "AlbertForSequenceClassification", problem_type="multi_label_classification",
                      **labelled(["c", "a", "b"]))
  data = tmp_path / "data"
  data.mkdir()
  write_split(data / "train.tsv", 8)
  texts = tmp_path / "in.tsv"
  write_split(texts, 3, labeled=False)
  args = job_kinds.RunArgs(input=str(texts), output=str(tmp_path / "out.jsonl"))
  config = classification.get_config(f"size=tiny,data={data},spm={spm(shared_data)},text=sentence,multi_label=true")
  config.model.update(MODEL)
  config.data.max_seq_length = 16
  quietly(finetune.predict, config, Run(weights), args)
  rows = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
  for row in rows:
    assert list(row["probabilities"]) == ["c", "a", "b"]
    np.testing.assert_allclose(list(row["probabilities"].values()), [0.9933, 0.5, 0.0067], atol=0.05)
  with pytest.raises(ValueError, match=r"problem_type=multi_label_classification, not for this run's "
                                       r"task=classification, .*of another problem_type"):
    finetune.predict(own_data_config(shared_data, tmp_path), Run(weights), args)
  convert.convert(None, "hf", weights, str(tmp_path / "back"), spm_model=convert.NO_TOKENIZER)
  back = json.loads((tmp_path / "back" / "config.json").read_text())
  assert (back["id2label"], back["problem_type"]) == ({"0": "c", "1": "a", "2": "b"}, "multi_label_classification")
  hf.assert_same_tensors(hf.read(tmp_path / "ours_hf"), hf.read(tmp_path / "back"))


# ------------------------------------------------------------------------- token classification, masked LM

@pytest.mark.hf
@pytest.mark.parametrize("architecture, overrides", [
    ("AlbertForTokenClassification", labelled(["B-X", "I-X", "O"])), ("AlbertForMaskedLM", {})])
def test_classes_without_a_pooler_round_trip_as_themselves(hf, tmp_path, architecture, overrides):
  """transformers builds both without the pooler: loaded as zeros, not written back, and each exports as its own
  class (no invented pooler, no AlbertForSequenceClassification for a token classifier)."""
  weights = converted(hf, tmp_path, architecture, **{**overrides, "vocab_size": 97})
  assert not np.any(store.load_pretrained(weights)[1]["albert"]["pooler"]["kernel"])
  convert.convert(None, "hf", weights, str(tmp_path / "back"), spm_model=convert.NO_TOKENIZER)
  back = json.loads((tmp_path / "back" / "config.json").read_text())
  assert back["architectures"] == [architecture] and back.get("id2label") == (
      {str(i): name for i, name in overrides["id2label"].items()} if overrides else None)
  hf.assert_same_tensors(hf.read(tmp_path / "ours_hf"), hf.read(tmp_path / "back"))
  cls = getattr(hf.transformers, architecture)
  reloaded, info = cls.from_pretrained(tmp_path / "back", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  original = cls.from_pretrained(tmp_path / "ours_hf").eval()
  inputs = hf.batch()
  assert hf.torch.equal(hf.hf_forward(reloaded.eval(), *inputs).logits, hf.hf_forward(original, *inputs).logits)


# ------------------------------------------------------------------------- one check of shapeless model fields

def saved_with_heads(path, model_config, heads: int, config_json: bool = False) -> str:
  """Zero backbone weights of `model_config` recorded with `heads` attention heads (a converted directory, or a
  training workdir's config.json)."""
  recorded = model_config.replace(num_attention_heads=heads)
  if config_json:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model": recorded.to_dict()}))
    return str(path)
  backbone = jax.eval_shape(lambda: model_lib.init_params(model_lib.AlbertModel(model_config), jax.random.key(0)))
  store.save_pretrained(str(path), recorded, {"albert": jax.tree.map(lambda x: np.zeros(x.shape, x.dtype),
                                                                     nn.unbox(backbone))})
  return str(path)


def refused(name: str, path: str) -> str:
  return (f"{name}={re.escape(path)} was saved with model.num_attention_heads=8 but this run has 4; .*"
          "Pass --config.model.num_attention_heads=8.")


def test_a_pretraining_warm_start_refuses_another_head_count(tmp_path):
  config = pretrain_tiny.get_config("synthetic")
  config.init_checkpoint = saved_with_heads(tmp_path / "init", model_config_from(config), 8)
  with pytest.raises(ValueError, match=refused("init_checkpoint", config.init_checkpoint)):
    pretrain.train(config, Run(str(tmp_path / "run")))
  assert not (tmp_path / "run").exists()


def test_pretraining_eval_refuses_a_workdir_saved_with_another_head_count(tmp_path):
  config = pretrain_tiny.get_config("synthetic")
  workdir = saved_with_heads(tmp_path / "run", model_config_from(config), 8, config_json=True)
  with pytest.raises(ValueError, match=refused("--workdir", workdir)):
    pretrain.evaluate_checkpoint(config, Run(workdir))


def test_embed_refuses_an_init_checkpoint_or_workdir_with_another_head_count(shared_data, tmp_path):
  config = own_data_config(shared_data, tmp_path)
  config.model.num_attention_heads = 4
  (tmp_path / "texts.txt").write_text("a good film\n")
  args = job_kinds.RunArgs(input=str(tmp_path / "texts.txt"), output=str(tmp_path / "out.npy"))
  config.init_checkpoint = saved_with_heads(tmp_path / "init", model_config_from(config), 8)
  with pytest.raises(ValueError, match=refused("init_checkpoint", config.init_checkpoint)):
    embed.embed(config, Run(str(tmp_path / "new")), args, job_kinds.kind_for(config))
  workdir = saved_with_heads(tmp_path / "run", model_config_from(config), 8)
  (tmp_path / "run" / "checkpoints").mkdir()  # what makes embed take the workdir's weights
  with pytest.raises(ValueError, match=refused("--workdir", workdir)):
    embed.embed(config, Run(workdir), args, job_kinds.kind_for(config))
  assert not (tmp_path / "out.npy").exists()


def test_fine_tuning_eval_refuses_a_workdir_saved_with_another_head_count(shared_data, tmp_path):
  config = own_data_config(shared_data, tmp_path, labels="neg|pos")
  workdir = saved_with_heads(tmp_path / "run", model_config_from(config), 8)
  with pytest.raises(ValueError, match=refused("--workdir", workdir)):
    finetune.evaluate(config, Run(workdir))


# ---------------------------------------------------------------------------------------- a full disk, one line

# `python -m albert_jax.convert` in a process whose files cannot grow past the limit: writes then fail with EFBIG,
# as on a full disk (SIGXFSZ, which would kill it instead, is ignored).
LIMITED = ("import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           "resource.setrlimit(resource.RLIMIT_FSIZE, ({0}, {0})); runpy.run_module('albert_jax.convert', "
           "run_name='__main__')")


@pytest.mark.hf
def test_export_that_cannot_be_written_is_one_line_and_leaves_no_model(hf, tmp_path):
  weights = converted(hf, tmp_path, "AlbertForPreTraining", vocab_size=97)
  dst = tmp_path / "hf"
  convert.convert(None, "hf", weights, str(dst), spm_model=convert.NO_TOKENIZER)  # an earlier export, overwritten below
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "PYTHONDONTWRITEBYTECODE": "1"}
  result = subprocess.run([sys.executable, "-c", LIMITED.format(16384), "--to=hf", "--overwrite", "--spm_model=none",
                           f"--src={weights}", f"--dst={dst}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
  assert result.stderr.startswith(f"convert: error: Writing the transformers model into {dst} failed (")
  assert "File too large" in result.stderr and "Free space on that disk" in result.stderr
  assert os.listdir(dst) == []  # neither the older pair nor a part of the new one


# ------------------------------------------------------------------------------ predict and embed read only

def test_predict_and_embed_with_an_output_accept_a_read_only_workdir(tmp_path, monkeypatch, capsys):
  workdir = tmp_path / "run"
  workdir.mkdir()
  writable = os.access
  monkeypatch.setattr(os, "access", lambda p, mode: writable(p, mode) and not str(p).startswith(str(workdir)))
  for mode in ("eval", "predict", "embed"):
    cli.check_workdir(str(workdir), mode, output=str(tmp_path / "out"))
  for mode in ("eval", "predict"):  # fine-tuning's eval writes its dev predictions there without --output
    with pytest.raises(PermissionError, match=rf"run is not writable; .*\(or pass --output: {mode} then writes"):
      cli.check_workdir(str(workdir), mode)
  with pytest.raises(PermissionError, match="run is not writable; pass a writable directory.$"):
    cli.check_workdir(str(workdir), "train", output=str(tmp_path / "out"))
  with pytest.raises(InputError, match=r"^--output does nothing with --mode=eval of this config: its eval writes no "
                                       r"predictions. Drop it.$"):
    cli.check_workdir(str(workdir), "eval", output=str(tmp_path / "out"), eval_reads_only=True)
  config = pretrain_tiny.get_config("synthetic")
  assert compilation_cache.use(config, Run(str(workdir))) is None
  assert capsys.readouterr().out == (f"Compilation cache off: {workdir}/compilation_cache cannot be written; pass "
                                     "--config.compilation_cache_dir=DIR to keep one elsewhere.\n")
  assert not (workdir / "compilation_cache").exists()
