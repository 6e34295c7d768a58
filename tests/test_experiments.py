"""Every experiment file loads and builds a valid model; the paper's recipe is in the pretraining files; the
large config runs a few steps on CPU through the same code path as a TPU pod."""
import functools
import importlib
import json
import pathlib
import subprocess
import sys

import ml_collections
import pytest

from albert_jax.cli import experiment_config
from albert_jax.model_config import model_config_from
from tests.helpers import logged, pretrain_cli as cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in ROOT.joinpath("experiments").glob("*.py") if p.stem not in ("__init__", "common"))


def parsed_config(name: str, *overrides: str) -> ml_collections.ConfigDict:
  """The config `python -m albert_jax.main --config=experiments/<name>.py <overrides>` runs."""
  return experiment_config(["main", f"--config={ROOT / 'experiments' / name}.py", "--mode=describe", *overrides])


def leaves(config: ml_collections.ConfigDict, prefix: str = ""):
  """(dotted field, value, the type its overrides parse as) of every field."""
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value, config.get_type(key)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_file_loads_and_builds_a_valid_model(name):
  config = importlib.import_module(f"experiments.{name}").get_config(None)
  model_config_from(config)  # validates every model field
  assert config.train.global_batch_size > 0 and config.task


@pytest.mark.parametrize("size", ["base", "large", "xlarge", "xxlarge"])
def test_pretraining_files_carry_the_paper_recipe(size):
  c = importlib.import_module(f"experiments.pretrain_{size}").get_config(None)
  t = c.train
  assert (t.global_batch_size, t.learning_rate, t.num_train_steps, t.warmup_steps, t.weight_decay,
          t.clip_grad_norm, t.optimizer) == (4096, 0.00176, 125_000, 3125, 0.01, 1.0, "lamb")
  assert (c.data.max_seq_length, c.data.max_predictions_per_seq, c.data.sentence_task) == (512, 20, "sop")
  v1 = importlib.import_module(f"experiments.pretrain_{size}").get_config("version=v1")
  assert v1.model.hidden_dropout_prob == (0.0 if size == "xxlarge" else 0.1)


@pytest.mark.parametrize("override, projection_params", [((), 0), (("--config.model.embedding_projection=True",),
                                                                      128 * 128 + 128)])
def test_a_model_field_that_defaults_to_none_takes_a_command_line_bool(override, projection_params):
  """embedding_projection is None (a projection only when E != H) until set; --config parses a bool for it (not
  "Type NoneType ... is not supported for overriding")."""
  out = subprocess.run([sys.executable, "-m", "albert_jax.main", "--config=experiments/pretrain_tiny.py",
                        "--mode=describe", "--config.model.embedding_size=128", *override],
                       capture_output=True, text=True, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  assert json.loads(out.stdout.strip().splitlines()[-1])["params_embedding_projection"] == projection_params


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_config_field_takes_a_command_line_override(name):
  """`--config.<field>=<value>` parses for every field of every experiment file and gives that value back; a
  field left at None (decided at run time) takes values of its type: True and False, or 1 and 3."""
  fields = list(leaves(parsed_config(name)))
  assert len(fields) > 50
  undecided = {bool: (True, False), int: (1, 3)}
  for field, default, kind in fields:
    for value in undecided[kind] if default is None else (default,):
      text = repr(value) if isinstance(value, tuple) else str(value)
      config = parsed_config(name, f"--config.{field}={text}")
      assert functools.reduce(getattr, field.split("."), config) == value, field


@pytest.mark.parametrize("override, message", [
    ("--config.train.lerning_rate=1", "--config.train.lerning_rate: experiments/pretrain_tiny.py has no field "
                                      "train.lerning_rate; did you mean --config.train.learning_rate?"),
    ("--config.trian.learning_rate=1", "has no field trian.learning_rate; did you mean --config.train.learning_rate?"),
    ("--config.train.learning_rate.x=1", "has no field train.learning_rate.x; train.learning_rate is a value, not "
                                         "a section"),
    ("--noconfig.train.clip_grd_norm", "did you mean --config.train.clip_grad_norm?"),
    ("--config.train.zzzz=1", "has no field train.zzzz\n")])
def test_a_misspelled_config_field_is_named_in_one_line(override, message):
  """One line naming the field, not a page of ml_collections' KeyError traceback."""
  out = subprocess.run([sys.executable, "-m", "albert_jax.main", "--config", "experiments/pretrain_tiny.py",
                        "--mode=describe", override], capture_output=True, text=True, cwd=ROOT)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
  assert "FATAL Flags parsing error: " in out.stderr and message in out.stderr, out.stderr[-2000:]


def test_ablation_arguments_reach_the_config():
  c = importlib.import_module("experiments.ablation").get_config("embedding_size=64,sharing=ffn,sentence_task=nsp")
  assert (c.model.embedding_size, c.model.sharing, c.data.sentence_task) == (64, "ffn", "nsp")
  with pytest.raises(ValueError, match="Unknown config argument"):
    importlib.import_module("experiments.ablation").get_config("embeding_size=64")


@pytest.mark.slow
def test_pretrain_large_runs_tiny_steps_on_cpu(tmp_path):
  """Compiled fast (XLA's -O0): the steps run, their values are not compared."""
  result = cli(tmp_path, "--config.data.kind=synthetic", "--config.train.global_batch_size=2",
               "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=4",
               "--config.train.num_train_steps=2", "--config.train.warmup_steps=1", "--config.log.every=1",
               "--config.train.eval_every=0", "--config.checkpoint.every=2", config="experiments/pretrain_large.py",
               fast_compile=True)
  assert result.returncode == 0, result.stderr
  assert sorted(logged(tmp_path)) == [1, 2]
