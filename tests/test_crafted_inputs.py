"""Crafted or absurd inputs refused by name in one line, before anything is opened, traced, compiled or written:
a transformers directory whose shard index points elsewhere, whose pytorch_model.bin is not plain tensors or whose
config.json is garbled, a garbled model_config.json or best/best.json, model sizes beyond an int32 index or this
host's memory, and step counts, batches and seeds that the step counter, the host or the random number generators
cannot take."""
import json
import os
import pickle
import subprocess
import sys
import time

import pytest

from albert_jax import engine, pretrain
from albert_jax import model_config as model_config_lib
from albert_jax.errors import InputError, UserError
from albert_jax.formats import hf_albert, hf_files
from albert_jax.model import AlbertForPreTraining, abstract_params, count_params
from albert_jax.model_config import model_config_for
from albert_jax.run import Run
from albert_jax.run.best import read_best
from albert_jax.run.layout import BEST_DIR, BEST_FILE
from albert_jax.weights import record, store
from experiments import pretrain_tiny
from tests.helpers import REPO, SMALL_RUN, TINY_RUN, finetune_cli, glue_data, pretrain_cli, require_module, spm

GIB = 2**30
HF_CONFIG = {"model_type": "albert", "vocab_size": 99, "embedding_size": 16, "hidden_size": 32,
             "num_attention_heads": 4, "intermediate_size": 64, "num_hidden_layers": 2,
             "max_position_embeddings": 32}


def one_line(error: pytest.ExceptionInfo) -> str:
  assert isinstance(error.value, UserError) and "\n" not in str(error.value), error.value
  return str(error.value)


def hf_dir(path, **files: bytes):
  path.mkdir()
  (path / hf_files.CONFIG_FILE).write_text(json.dumps(HF_CONFIG))
  for name, data in files.items():
    (path / name).write_bytes(data)
  return path


@pytest.fixture
def small_host(monkeypatch):
  """A host with 16 GiB, whatever this one has, so that the limits are the same everywhere."""
  monkeypatch.setattr(model_config_lib, "host_memory", lambda: 16 * GIB)


# ------------------------------------------------------------------------------------ transformers directories

@pytest.mark.parametrize("index", [
    {"weight_map": {"a": "../../etc/passwd"}},
    {"weight_map": {"a": "model-1.safetensors", "b": "/etc/passwd"}},
    ["not", "an", "index"],
], ids=["parent", "absolute", "not-an-object"])
def test_a_shard_index_is_refused_before_any_shard_is_opened(tmp_path, monkeypatch, index):
  def no_open(name):
    raise AssertionError(f"opened {name}")
  monkeypatch.setattr(hf_files.safetensors.numpy, "load_file", no_open)
  path = hf_dir(tmp_path / "hf", **{hf_files.SAFETENSORS_INDEX: json.dumps(index).encode()})
  with pytest.raises(InputError) as error:
    hf_albert.load_hf(path)
  assert one_line(error).startswith(f"{path / hf_files.SAFETENSORS_INDEX}")


class Runs:
  """Pickled, it runs `touch <marker>` when unpickled by anything but a tensors-only loader."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("kind", ["pickle-running-code", "torch-zip-running-code", "not-a-pickle", "empty",
                                  "not-a-state-dict"])
def test_a_pytorch_bin_that_is_not_plain_tensors_is_refused_without_running_it(tmp_path, kind):
  torch = require_module("torch", extra="hf")
  marker, file = tmp_path / "ran", tmp_path / "weights.bin"
  if kind == "pickle-running-code":
    file.write_bytes(pickle.dumps({"albert.embeddings.word_embeddings.weight": Runs(marker)}, protocol=2))
  elif kind == "torch-zip-running-code":
    torch.save({"albert.embeddings.word_embeddings.weight": Runs(marker)}, file)
  elif kind == "not-a-state-dict":
    torch.save([torch.zeros(2)], file)
  else:
    file.write_bytes(b"" if kind == "empty" else b"<html>404 Not Found</html>")
  path = hf_dir(tmp_path / "hf", **{hf_files.TORCH_FILE: file.read_bytes()})
  with pytest.raises(InputError) as error:
    hf_albert.load_hf(path)
  assert one_line(error).startswith(f"{path / hf_files.TORCH_FILE} is not a PyTorch state dict")
  assert not marker.exists()


@pytest.mark.parametrize("text, message", [
    (json.dumps({**HF_CONFIG, "num_hidden_layers": 1e12}), "model.num_hidden_layers=1000000000000.0 must be an "
                                                           "integer"),
    ("{\"model_type\": \"albert\",", f"{hf_files.CONFIG_FILE} is not a transformers config"),
], ids=["layers-a-float", "cut-short"])
def test_a_garbled_config_json_is_refused(tmp_path, text, message):
  path = hf_dir(tmp_path / "hf")
  (path / hf_files.CONFIG_FILE).write_text(text)
  with pytest.raises(InputError) as error:
    hf_albert.load_hf(path)
  assert message in one_line(error)


@pytest.mark.parametrize("text", ["{\"vocab_size\": 30000,", "[]"], ids=["cut-short", "a-list"])
def test_a_garbled_model_config_json_of_converted_weights_is_refused(tmp_path, text):
  (tmp_path / store.PARAMS_DIR).mkdir()
  (tmp_path / store.CONFIG_FILE).write_text(text)
  for load in (store.load_pretrained, lambda path: record.check_same_function(path, {})):
    with pytest.raises(InputError) as error:
      load(str(tmp_path))
    assert one_line(error).startswith(f"{tmp_path / store.CONFIG_FILE} is not a model config")


# ------------------------------------------------------------------------------------------ best/best.json

@pytest.mark.parametrize("text", ["{\"step\": 30, \"metric\": \"accuracy\"", "[30, 0.8]",
                                  json.dumps({"step": 30, "metric": "accuracy", "value": 0.8}),
                                  json.dumps({"step": "30", "metric": "accuracy", "value": 0.8, "weights": "x"})],
                         ids=["cut-short", "a-list", "no-weights", "step-a-string"])
def test_a_garbled_best_record_names_the_file_and_the_fix(tmp_path, text):
  best = tmp_path / BEST_DIR / BEST_FILE
  best.parent.mkdir()
  best.write_text(text)
  with pytest.raises(InputError) as error:
    read_best(Run(str(tmp_path)))
  line = one_line(error)
  assert line.startswith(f"{best} is not") and "remove it" in line


# ----------------------------------------------------------------------------------------------- model sizes

@pytest.mark.parametrize("field, value, limit", [
    ("num_hidden_layers", 10**12, "2,147,483,647"),
    ("num_attention_heads", 2**40, "2,147,483,647"),
    ("num_hidden_layers", 10**9, "at most"),
    ("hidden_size", 2**20, "at most"),
    ("vocab_size", 10**9, "at most"),
    ("embedding_size", 10**8, "at most"),
    ("intermediate_size", 10**9, "at most"),
    ("max_position_embeddings", 10**9, "at most"),
])
def test_model_sizes_beyond_an_int32_index_or_the_host_memory_are_refused(small_host, field, value, limit):
  with pytest.raises(InputError) as error:
    model_config_for("tiny", **{field: value})
  line = one_line(error)
  assert line.startswith(f"model.{field}={value} ") and limit in line


@pytest.mark.parametrize("size, overrides", [
    ("xxlarge", {}), ("xxlarge", dict(vocab_size=250_000)), ("bert_large", {}), ("bert_xlarge", {}),
    ("base", dict(max_position_embeddings=4096, sharing="none")), ("large", dict(num_hidden_layers=96)),
])
def test_released_and_realistic_sizes_pass_on_a_16_gib_host(small_host, size, overrides):
  model_config_for(size, **overrides)


@pytest.mark.parametrize("overrides", [
    {}, dict(num_hidden_layers=6, num_hidden_groups=3, inner_group_num=2), dict(sharing="attention"),
    dict(sharing="ffn"), dict(sharing="none"), dict(embedding_size=64),
    dict(embedding_size=64, embedding_projection=True),
])
def test_the_parameter_count_from_the_sizes_matches_the_model(overrides):
  config = model_config_for("tiny", type_vocab_size=3, **overrides)
  assert model_config_lib.parameter_count(config) == count_params(abstract_params(AlbertForPreTraining(config)))


def test_describe_refuses_a_trillion_layers_at_once():
  """It hung: the layers were assigned to groups one by one before anything was printed."""
  cmd = [sys.executable, "-m", "albert_jax.main", "--config=experiments/pretrain_tiny.py:synthetic",
         "--mode=describe", "--config.model.num_hidden_layers=1000000000000"]
  result = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith(
      "error: model.num_hidden_layers=1000000000000 must be an integer from 1 to 2,147,483,647")


# ------------------------------------------------------------------------------ training counters and seeds

@pytest.mark.parametrize("field, value, message", [
    ("train.num_train_steps", 3_000_000_000, "train.num_train_steps=3000000000 exceeds 2,147,483,647"),
    ("train.warmup_steps", 2**31, "train.warmup_steps=2147483648 exceeds 2,147,483,647"),
    ("train.global_batch_size", 2**40, "train.global_batch_size=1099511627776 rows of 64 tokens need 786,432.0 GiB "
                                       "of this host's 16.0 GiB"),
    ("seed", -1, "seed=-1 must be from 0 to 4,294,967,295"),
    ("seed", 2**32, "seed=4294967296 must be from 0 to 4,294,967,295"),
])
def test_training_counters_batches_and_seeds_beyond_their_types_are_refused(small_host, field, value, message):
  config = pretrain_tiny.get_config()
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(InputError) as error:
    engine.check_training_config(config)
  assert message in one_line(error)


def test_a_batch_beyond_the_host_is_refused_from_shapes_naming_the_largest_that_fits(small_host, tmp_path):
  """The step's state, gradients, layer inputs and batch (twice: the loader's and the device batch, both host memory
  on a CPU backend) counted before anything is allocated; `pretrain_tiny.py:synthetic` passed the 12-bytes-a-token
  check and was killed by the kernel (issue #48). The largest batch named is the boundary: it passes, the next
  multiple of the devices does not."""
  config = pretrain_tiny.get_config("synthetic")
  config.train.global_batch_size = 16777216
  job = pretrain.make_job(config, Run(str(tmp_path)))
  example, made = job.example_batch, []
  job.example_batch = lambda rows: made.append(rows) or example(rows)
  start = time.perf_counter()
  with pytest.raises(InputError) as error:
    engine.setup(config, job)
  message = one_line(error)
  assert time.perf_counter() - start < 10 and made == [1]  # shapes from one row: no batch of that size is made
  # a row: 64 tokens of ids, mask and types and 10 masked positions, ids and weights (int32), one SOP label: 892
  # bytes, twice; 4 layers' 64x128 float32 inputs: 128 KiB
  assert message.startswith("train.global_batch_size=16777216 needs at least 2,075.9 GiB of this host's 16.0 GiB of "
                            "memory (its 16,777,216 rows on this host 27.9 GiB; parameters, optimizer state and "
                            "gradients on 8 CPU device(s) "), message
  fits = int(message.split("at most ")[1].split(" rows fit")[0].replace(",", ""))
  per_row = 2 * 892 + 4 * 64 * 128 * 4
  assert 16 * GIB // per_row - 400 < fits <= 16 * GIB // per_row and fits % 8 == 0  # less the 46 MB of the state
  for rows, ok in ((fits, True), (fits + 8, False)):
    config.train.global_batch_size = rows
    if ok:
      engine.setup(config, job)
    else:
      with pytest.raises(InputError, match=f"^train.global_batch_size={rows} needs at least"):
        engine.setup(config, job)


def test_an_absurd_batch_is_one_line_in_seconds(tmp_path):
  start = time.perf_counter()
  result = pretrain_cli(tmp_path / "run", "--config.train.global_batch_size=16777216", fast_compile=True)
  assert result.returncode == 1 and time.perf_counter() - start < 60, result.stderr
  assert result.stderr.startswith("error: train.global_batch_size=16777216 ") and " rows fit" in result.stderr and \
      result.stderr.count("\n") == 1, result.stderr


def test_a_batch_refused_when_the_step_is_set_up_leaves_no_workdir(shared_data, tmp_path):
  """4,000,000 rows of 128 tokens: their arrays may fit, their layer inputs (about 500 GiB) do not; refused once
  fine-tuning wrote its head.json and the compilation cache was set up, which are removed with the new workdir. A
  workdir that existed keeps what it held."""
  root = glue_data(shared_data, "rte", tmp_path / "glue")
  batch = ["--config.train.global_batch_size=4000000", "--config.data.max_seq_length=128"]
  kept = tmp_path / "kept"
  kept.mkdir()
  (kept / "notes.txt").write_text("mine")
  for workdir in (tmp_path / "run", kept):
    result = finetune_cli(f"experiments/glue.py:task=rte,size=tiny,data={root},spm={spm(shared_data)}", workdir,
                          *TINY_RUN, *batch)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: train.global_batch_size=4000000 "), result.stderr
  assert not (tmp_path / "run").exists()
  assert (kept / "notes.txt").read_text() == "mine"


def test_a_negative_seed_leaves_the_workdir_untouched(shared_data, tmp_path):
  """Pretraining, and fine-tuning, which writes its head.json before the training loop starts."""
  root = glue_data(shared_data, "rte", tmp_path / "glue")
  for result in (pretrain_cli(tmp_path / "run", *SMALL_RUN, "--config.train.num_train_steps=1", "--config.seed=-1"),
                 finetune_cli(f"experiments/glue.py:task=rte,size=tiny,data={root},spm={spm(shared_data)}",
                              tmp_path / "run", *TINY_RUN, "--config.seed=-1")):
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: seed=-1 must be from 0 to 4,294,967,295")
    assert not (tmp_path / "run").exists()
