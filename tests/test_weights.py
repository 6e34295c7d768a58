"""`weights.resolve`: each kind of source (converted weights, a pretraining run, a fine-tuning run, a Hugging Face
folder) gives its family, head identity, tokenizer and origin; the command line's overrides stay and the rest is
taken from the record; the params load on first use; a missing or damaged source is refused in one line."""
import importlib
import json

import numpy as np
import pytest

from albert_jax.errors import InputError, MissingFileError
from albert_jax.families.albert import ALBERT
from albert_jax.families.electra import ELECTRA
from albert_jax.model_config import model_config_for
from albert_jax.run.layout import BEST_DIR
from albert_jax.weights import store
from albert_jax.weights.resolve import resolve, resolve_init_checkpoint
from experiments import glue

HEAD = {"hf_architecture": "ElectraForSequenceClassification", "labels": ["neg", "pos"], "num_labels": 2,
        "problem_type": None}
PARAMS = {"albert": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}}
RUN_MODEL = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
                 max_position_embeddings=128)


def converted(path, family=ALBERT.name, head=None, tokenizer=True) -> str:
  """Converted weights as `convert --from=hf` leaves them: a tiny model, its head, its spiece.model and
  tokenizer_config.json."""
  store.save_pretrained(str(path), model_config_for("tiny"), PARAMS, head=head, family=family)
  if tokenizer:
    (path / "spiece.model").write_bytes(b"")
    (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
  return str(path)


def training_run(path, task="pretrain", data=None) -> str:
  """A run's folder with the config.json that albert_jax.main writes (the tiny model at RUN_MODEL's sizes)."""
  path.mkdir(parents=True)
  model = {**model_config_for("tiny").to_dict(), **RUN_MODEL}
  data = data or {"kind": "prepared", "path": "", "spm_model": "/data/run.model", "do_lower_case": True}
  (path / "config.json").write_text(json.dumps({"task": task, "model": model, "data": data}))
  return str(path)


def test_converted_weights_give_their_family_head_tokenizer_and_origin(tmp_path, capsys):
  path = converted(tmp_path / "electra", family=ELECTRA.name, head=HEAD)
  config = glue.get_config("task=rte,size=tiny")
  weights = resolve(path, config, flag="init_checkpoint")
  assert (weights.path, weights.flag, weights.named) == (path, "init_checkpoint", f"init_checkpoint={path}")
  assert (weights.family, weights.head) == (ELECTRA, HEAD)
  assert weights.tokenizer == (f"{path}/spiece.model", False)
  # the "auto" head of an ELECTRA backbone is ELECTRA's, said in one line; the rest of a Python config stays
  assert weights.config.classifier_head == ELECTRA.classifier_head and config.classifier_head == "auto"
  assert capsys.readouterr().out.startswith(f"classifier_head=electra: {path} holds an ELECTRA backbone")
  assert weights.config.model.to_dict() == config.model.to_dict()
  assert "params" not in vars(weights)  # nothing loaded yet
  np.testing.assert_array_equal(weights.params["albert"]["kernel"], PARAMS["albert"]["kernel"])
  assert weights.params is weights.params  # loaded once


def test_weights_without_a_record_are_the_default_family_with_no_head_nor_tokenizer(tmp_path):
  path = converted(tmp_path / "plain", tokenizer=False)
  weights = resolve(path, glue.get_config("task=rte"))
  assert (weights.family, weights.head, weights.tokenizer) == (ALBERT, None, None)


def test_the_overrides_passed_in_stay_and_the_rest_is_taken_from_the_run(tmp_path, capsys):
  path = training_run(tmp_path / "pre")
  config = glue.get_config("task=rte,spm=/mine.model")
  config.model.hidden_size = 256
  weights = resolve(path, config, overrides=("model.hidden_size", "data.spm_model"))
  assert weights.config.model.hidden_size == 256 and weights.config.data.spm_model == "/mine.model"
  assert {k: weights.config.model[k] for k in RUN_MODEL if k != "hidden_size"} == {
      k: v for k, v in RUN_MODEL.items() if k != "hidden_size"}
  assert weights.config.data.max_seq_length == 128  # capped at the run's positions
  assert capsys.readouterr().out == (
      f"model from {path} (config.json): embedding_size=32, num_hidden_layers=4, num_attention_heads=4, "
      "intermediate_size=512, max_position_embeddings=128; data.max_seq_length=128 (capped at the model's "
      "max_position_embeddings)\n")
  assert (weights.family, weights.head, weights.tokenizer) == (ALBERT, None, ("/data/run.model", True))
  taken = resolve(path, glue.get_config("task=rte"), overrides=())
  assert (taken.config.model.hidden_size, taken.config.data.spm_model, taken.config.data.do_lower_case) == (
      128, "/data/run.model", True)
  assert resolve(path, config).config.model.hidden_size == 256  # no overrides: a config built in Python stays


def test_a_fine_tuning_run_gives_the_head_of_its_best_checkpoint(tmp_path):
  path = training_run(tmp_path / "rte", task="rte", data={"spm_model": "/data/rte.model", "do_lower_case": False})
  step = tmp_path / "rte" / BEST_DIR / "step_8"
  store.save_pretrained(str(step), model_config_for("tiny"), PARAMS)
  identity = {"task": "rte", "labels": ["entailment", "not_entailment"]}
  (tmp_path / "rte" / BEST_DIR / "best.json").write_text(json.dumps(
      {"step": 8, "metric": "accuracy", "value": 0.5, "weights": str(step), "head": identity}))
  for source in (path, str(step)):
    weights = resolve(source, glue.get_config("task=rte"), flag="--workdir")
    assert (weights.family, weights.tokenizer) == (ALBERT, ("/data/rte.model", False))
  assert resolve(path, glue.get_config("task=rte")).head == identity


@pytest.mark.hf
def test_a_hugging_face_folder_is_read_through_its_conversion(tmp_path, monkeypatch):
  hf = importlib.import_module("tests.hf_models")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  folder = hf.saved(hf.hf_model(), tmp_path / "albert_hf")
  weights = resolve(folder, glue.get_config("task=rte"))
  assert weights.path.startswith(str(tmp_path / "cache" / "albert_jax" / "hf" / "folders" / "albert_hf-"))
  assert store.is_pretrained_dir(weights.path) and (weights.family, weights.head) == (ALBERT, None)
  assert resolve(folder, glue.get_config("task=rte")).path == weights.path  # converted once, read after


@pytest.mark.hf
def test_init_checkpoint_names_the_conversion_in_the_config_the_run_records(tmp_path, monkeypatch):
  """What a run records as init_checkpoint is the folder it read: a Hugging Face folder's conversion; a folder of
  ours stays as given, the config itself."""
  hf = importlib.import_module("tests.hf_models")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  config = glue.get_config("task=rte")
  config.init_checkpoint = hf.saved(hf.hf_model(), tmp_path / "albert_hf")
  weights = resolve_init_checkpoint(config)
  assert (weights.config.init_checkpoint, weights.config.init_checkpoint_revision) == (weights.path, "")
  assert config.init_checkpoint == str(tmp_path / "albert_hf")  # the caller's config is left as it was
  config.init_checkpoint = weights.path
  assert resolve_init_checkpoint(config).config is config


def test_a_revision_of_no_init_checkpoint_is_refused_and_no_init_checkpoint_is_no_weights():
  config = glue.get_config("task=rte")
  assert resolve_init_checkpoint(config) is None
  config.init_checkpoint_revision = "v2"
  with pytest.raises(InputError, match=r"^init_checkpoint_revision=v2 pins a revision of nothing: set "
                                       r"--config.init_checkpoint=NAME \(a Hugging Face Hub model\) too, or drop it\.$"):
    resolve_init_checkpoint(config)


def test_a_missing_source_is_refused_in_one_line(tmp_path):
  with pytest.raises(MissingFileError, match=r"^init_checkpoint='/nowhere/run' is neither a pretrained-weights "
                                             r"directory .* nor a training workdir \(checkpoints/\)\.$"):
    resolve("/nowhere/run", glue.get_config("task=rte"))


def test_a_damaged_model_record_is_refused_in_one_line(tmp_path):
  path = converted(tmp_path / "cut", tokenizer=False)
  (tmp_path / "cut" / "model_config.json").write_text('{"hidden_size": 12')
  with pytest.raises(InputError, match=r"^\S+model_config.json is not a model config \(a JSON object\); convert the "
                                       r"weights again \(python -m albert_jax.convert\)\.$"):
    resolve(path, glue.get_config("task=rte"))


def test_a_tf1_checkpoint_is_read_through_its_conversion(tmp_path, monkeypatch, capsys):
  """A TF1 release folder, or its checkpoint prefix, as init_checkpoint: converted once into the cache (the params
  those `convert --from=tf1` reads), then read from there; its model taken from albert_config.json."""
  import jax
  from albert_jax.formats import tf1
  from tests.test_tf1 import FIXTURES
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  release = str(FIXTURES / "release")
  weights = resolve(release, glue.get_config("task=rte"), overrides=())
  assert weights.path.startswith(str(tmp_path / "cache" / "albert_jax" / "tf1" / "release-"))
  assert capsys.readouterr().out.startswith(f"init_checkpoint={release}: converted {release} into {weights.path} (")
  expected_config, expected = tf1.load_tf1(release)
  assert weights.config.model.hidden_size == expected_config.hidden_size and (weights.family, weights.head) == (
      ALBERT, None)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, weights.params), expected)
  assert resolve(release, glue.get_config("task=rte")).path == weights.path  # converted once, read after
  assert capsys.readouterr().out == f"init_checkpoint={release}: reading its conversion in {weights.path}\n"
  prefix = tf1.find_checkpoint(release)
  assert resolve(prefix, glue.get_config("task=rte")).path != weights.path  # a prefix is its own source


@pytest.mark.hf
def test_a_resume_of_a_run_warm_started_from_a_hugging_face_folder_sees_no_changed_setting(tmp_path, monkeypatch,
                                                                                          capsys):
  """The run records init_checkpoint as the folder's conversion; the same command again, naming the Hugging Face
  folder, resumes with the same config: nothing is said changed."""
  from albert_jax import pretrain
  from albert_jax.cli import experiment_config
  from albert_jax.run import Run
  hf = importlib.import_module("tests.hf_models")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  folder = hf.saved(hf.hf_model(), tmp_path / "albert_hf")
  config = experiment_config(["main", "--config=experiments/pretrain_tiny.py:synthetic",
                              "--config.data.max_seq_length=16",
                              "--config.data.max_predictions_per_seq=2", "--config.train.global_batch_size=8",
                              "--config.train.num_train_steps=1", "--config.train.warmup_steps=0",
                              "--config.train.eval_every=0",
                              "--config.checkpoint.async_save=false", f"--config.init_checkpoint={folder}"])
  config = resolve_init_checkpoint(config, overrides=()).config  # the folder's model, as its own command would
  config.init_checkpoint = folder
  run = Run(str(tmp_path / "run"))
  pretrain.train(config, run)
  recorded = json.loads((tmp_path / "run" / "config.json").read_text())["init_checkpoint"]
  assert recorded.startswith(str(tmp_path / "cache" / "albert_jax" / "hf" / "folders" / "albert_hf-"))
  capsys.readouterr()
  pretrain.train(config, run)
  said = capsys.readouterr().out
  assert "Nothing to train" in said and "changed settings" not in said, said
  assert json.loads((tmp_path / "run" / "config.json").read_text())["init_checkpoint"] == recorded
