"""TF1 checkpoints without TensorFlow: fixtures written by TensorFlow itself (tests/fixtures/tf1/make_fixtures.py),
read by `albert_jax.formats.tf1`; logits equal the same weights through transformers' own TF converter (the *_hf dirs)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from albert_jax import model as model_lib
from albert_jax.formats import tf1
from albert_jax.weights import store
from tests.helpers import require_module

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "tf1"


def batch():
  ids = np.random.RandomState(0).randint(0, 50, (3, 12))
  mask = (np.arange(12)[None] < np.array([[12], [7], [3]])).astype(np.int64)
  return ids * mask, mask, (np.arange(12)[None] >= np.array([[6], [4], [2]])).astype(np.int64) * mask


def ours(config, params):
  """(MLM logits, SOP logits or None); a checkpoint without SOP head runs with a zero one, its logits unused."""
  has_sop = "sop_classifier" in params
  zero_sop = {"kernel": np.zeros((config.hidden_size, 2), np.float32), "bias": np.zeros(2, np.float32)}
  out = model_lib.AlbertForPreTraining(config).apply({"params": {"sop_classifier": zero_sop, **params}}, *batch())
  return np.asarray(out["mlm_logits"]), np.asarray(out["sop_logits"]) if has_sop else None


@pytest.mark.hf
@pytest.mark.parametrize("layout", ["release", "hub"])
def test_logits_equal_transformers_on_the_same_tensorflow_checkpoint(layout):
  torch = require_module("torch", extra="hf")
  transformers = require_module("transformers", extra="hf")
  config, params = tf1.load_tf1(str(FIXTURES / layout))
  assert set(params) == ({"albert", "predictions", "sop_classifier"} if layout == "release" else
                         {"albert", "predictions"})
  hf = transformers.AlbertForPreTraining.from_pretrained(FIXTURES / f"{layout}_hf").eval()
  assert config.num_attention_heads == hf.config.num_attention_heads == (8 if layout == "release" else 4)
  with torch.no_grad():
    expected = hf(**{k: torch.tensor(v) for k, v in zip(("input_ids", "attention_mask", "token_type_ids"),
                                                          batch())})
  mlm, sop = ours(config, params)
  mask = batch()[1].astype(bool)  # padded positions are not compared: HF and we mask keys differently there
  mlm_diff = np.abs(mlm - expected.prediction_logits.numpy())[mask].max()
  print(f"{layout}: max |MLM logit difference| {mlm_diff:.2e}")
  assert mlm_diff <= 1e-5
  if sop is not None:
    sop_diff = np.abs(sop - expected.sop_logits.numpy()).max()
    print(f"{layout}: max |SOP logit difference| {sop_diff:.2e}")
    assert sop_diff <= 1e-5


def test_bundle_reads_every_tensor_with_its_dtype_shape_and_checksum():
  bundle = tf1.TensorBundle(str(FIXTURES / "release" / "model.ckpt-7"))
  assert bundle.read("global_step").dtype == np.int64 and int(bundle.read("global_step")) == 7
  assert bundle.read("bert/pooler/dense/kernel/adam_m").shape == (32, 32)
  assert all(bundle.read(name).shape == entry["shape"] for name, entry in bundle.entries.items())
  assert tf1.find_checkpoint(str(FIXTURES / "hub")).endswith("variables/variables")


def test_corrupt_bytes_missing_config_and_unknown_variables_are_named(tmp_path):
  copy = shutil.copytree(FIXTURES / "release", tmp_path / "release")
  data = copy / "model.ckpt-7.data-00000-of-00001"
  entry = tf1.TensorBundle(str(copy / "model.ckpt-7")).entries["bert/pooler/dense/kernel"]
  raw = bytearray(data.read_bytes())
  raw[entry["offset"]] ^= 1
  data.write_bytes(bytes(raw))
  with pytest.raises(ValueError, match="variable bert/pooler/dense/kernel are truncated or corrupt"):
    tf1.load_tf1(str(copy))
  shutil.copy(FIXTURES / "release" / data.name, data)
  (copy / "albert_config.json").unlink()
  with pytest.raises(FileNotFoundError, match="head count included"):
    tf1.load_tf1(str(copy))
  config = json.loads((FIXTURES / "release" / "albert_config.json").read_text())
  (copy / "albert_config.json").write_text(json.dumps({**config, "num_hidden_groups": 1}))
  with pytest.raises(ValueError, match="have no place in the model"):
    tf1.load_tf1(str(copy))


def test_convert_cli_without_tensorflow(tmp_path):
  """`--from=tf1` with any import of tensorflow made to fail."""
  code = ("import sys, runpy; sys.modules['tensorflow'] = None; sys.argv = sys.argv[1:]; "
          "runpy.run_module('albert_jax.convert', run_name='__main__')")
  result = subprocess.run([sys.executable, "-c", code, "convert", "--from=tf1", f"--src={FIXTURES / 'hub'}",
                           f"--dst={tmp_path / 'out'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  config, params = store.load_pretrained(str(tmp_path / "out"))
  expected_config, expected = tf1.load_tf1(str(FIXTURES / "hub"))
  assert config == expected_config
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, params), expected)
