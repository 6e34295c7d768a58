"""Hugging Face Hub names and folders as pretrained weights, offline: a cache laid out as huggingface_hub lays it out
(HF_HOME/hub/models--org--name/snapshots/<commit>, refs/main) holding a tiny random ALBERT saved by transformers,
HF_HUB_OFFLINE=1. Fine-tuning runs from the name alone (model and tokenizer converted once, then read from the
conversion), `convert --src` takes the name, and an unknown name, an unknown revision (a Hub on 127.0.0.1) and a
name the cache lacks are each refused in one line naming the fix. Nothing here touches the network."""
import http.server
import json
import os
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest
from huggingface_hub import constants

from albert_jax import convert
from albert_jax.errors import InputError, MissingFileError
from albert_jax.formats import hf, hf_hub
from albert_jax.weights import store
from tests.helpers import REPO, cpu_env, glue_data, quietly, spm

NAME = "albert-test/tiny-random"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
MODEL = dict(vocab_size=30000, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=64)


@pytest.fixture(scope="module")
def hub(shared_data, tmp_path_factory):
  """HF_HOME with NAME at COMMIT (refs/main) cached: weights, spiece.model and a cased tokenizer_config.json."""
  from tests.hf_models import hf_model, transformers
  home = tmp_path_factory.mktemp("hf_home")
  repo = home / "hub" / "models--albert-test--tiny-random"
  snapshot = repo / "snapshots" / COMMIT
  hf_model(**MODEL).save_pretrained(snapshot)
  (snapshot / "spiece.model").write_bytes(spm(shared_data).read_bytes())
  transformers.AlbertTokenizer.from_pretrained(str(snapshot), do_lower_case=False).save_pretrained(snapshot)
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(COMMIT)
  return home


@pytest.fixture
def offline(hub, tmp_path, monkeypatch):
  """This process reads `hub` offline (huggingface_hub's settings are read at its import: set here as they would
  be) and converts into a cache of its own."""
  monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub / "hub"))
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  return tmp_path / "cache" / "albert_jax" / "hf"


@pytest.mark.slow
def test_fine_tuning_from_a_hub_name_converts_it_once_with_its_tokenizer(hub, shared_data, tmp_path):
  data, workdir, cache = tmp_path / "glue", tmp_path / "rte", tmp_path / "cache"
  glue_data(shared_data, "rte", data)
  env = {**cpu_env(fast_compile=True), "HF_HOME": str(hub), "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(cache)}
  result = subprocess.run(
      [sys.executable, "-m", "albert_jax.main", f"--config=experiments/glue.py:task=rte,size=tiny,data={data}",
       f"--workdir={workdir}", f"--config.init_checkpoint={NAME}", "--config.train.num_train_steps=2",
       "--config.train.global_batch_size=8", "--config.train.warmup_steps=1", "--config.train.eval_every=2",
       "--config.checkpoint.every=2", "--config.log.every=1"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  converted = cache / "albert_jax" / "hf" / "models--albert-test--tiny-random" / COMMIT
  assert (f"init_checkpoint={NAME}: converted {NAME} at commit {COMMIT[:12]} into {converted} (albert, predictions, "
          "sop_classifier; its tokenizer spiece.model, do_lower_case=False); later runs read it from there"
          in result.stdout), result.stdout
  config = json.loads((workdir / "config.json").read_text())
  assert (config["init_checkpoint"], config["init_checkpoint_revision"]) == (str(converted), "")
  assert (config["data"]["spm_model"], config["data"]["do_lower_case"]) == (f"{converted}/spiece.model", False)
  assert config["model"]["hidden_size"] == MODEL["hidden_size"] and config["data"]["max_seq_length"] == 64
  assert json.loads((workdir / "best" / "best.json").read_text())["step"] == 2


def test_convert_takes_a_hub_name_and_init_checkpoint_reuses_its_conversion(offline, tmp_path):
  said = quietly(convert.convert, "hf", None, NAME, str(tmp_path / "ours"), False, False, None, COMMIT)
  snapshot = f"{constants.HF_HUB_CACHE}/models--albert-test--tiny-random/snapshots/{COMMIT}"
  assert said.startswith(f"Wrote {tmp_path / 'ours'} from {snapshot} (albert, predictions, sop_classifier; its "
                         "tokenizer spiece.model, do_lower_case=False)."), said
  target = str(offline / "models--albert-test--tiny-random" / COMMIT)
  assert quietly(hf.converted, NAME).startswith(f"init_checkpoint={NAME}: converted {NAME} at commit")
  assert os.listdir(offline / "models--albert-test--tiny-random") == [COMMIT]  # no partial conversion left
  assert quietly(hf.converted, NAME) == f"init_checkpoint={NAME}: reading its conversion in {target}\n"
  (ours_model, ours), (cached_model, cached) = (store.load_pretrained(p) for p in (str(tmp_path / "ours"), target))
  assert ours_model == cached_model and jax.tree.structure(ours) == jax.tree.structure(cached)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(cached)))


def test_a_local_hugging_face_folder_is_converted_again_once_saved_again(hub, offline, tmp_path):
  folder = tmp_path / "folder"
  folder.mkdir()
  snapshot = hub / "hub" / "models--albert-test--tiny-random" / "snapshots" / COMMIT
  for file in ("config.json", "model.safetensors"):
    (folder / file).write_bytes((snapshot / file).read_bytes())
  first = hf.converted(str(folder))
  assert os.path.dirname(first) == str(offline / "folders") and "no tokenizer" not in first
  assert quietly(hf.converted, str(folder)).startswith("init_checkpoint=")
  assert hf.converted(str(folder)) == first
  os.utime(folder / "model.safetensors", ns=(0, 0))
  assert hf.converted(str(folder)) != first


@pytest.mark.parametrize("value, is_name", [(NAME, True), ("albert-base-v2", True), ("/tmp/x/y", False),
                                            ("./run", False), ("~/run", False), ("a/b/c", False),
                                            ("gs://bucket/run", False), ("two--dashes/x", False)])
def test_what_is_taken_for_a_hub_name(value, is_name):
  assert hf_hub.is_hub_name(value) == is_name


def test_an_existing_folder_is_never_taken_for_a_hub_name(tmp_path, monkeypatch):
  (tmp_path / "org" / "name").mkdir(parents=True)
  monkeypatch.chdir(tmp_path)
  assert not hf_hub.is_hub_name("org/name") and hf.converted("org/name") is None


def test_a_name_or_revision_the_offline_cache_lacks_is_one_line_naming_the_fix(offline):
  with pytest.raises(MissingFileError) as error:
    hf.converted("albert-test/not-cached")
  assert str(error.value) == (
      f"init_checkpoint=albert-test/not-cached: HF_HUB_OFFLINE=1 and the Hugging Face cache ({constants.HF_HUB_CACHE}) "
      "does not hold it; fetch it once with `hf download albert-test/not-cached`, or unset HF_HUB_OFFLINE.")
  with pytest.raises(MissingFileError) as error:
    hf.converted(NAME, "v2")  # the name is cached, at main only
  assert str(error.value) == (
      f"init_checkpoint={NAME} (revision v2): HF_HUB_OFFLINE=1 and the Hugging Face cache ({constants.HF_HUB_CACHE}) "
      f"does not hold it; fetch it once with `hf download {NAME} --revision v2`, or unset HF_HUB_OFFLINE.")


class _Hub(http.server.BaseHTTPRequestHandler):
  """The Hub's answers for a model it does not have, and for a revision a model does not have."""

  def do_GET(self):  # noqa: N802 - http.server's name
    code = "RevisionNotFound" if "/revision/" in self.path and NAME in self.path else "RepoNotFound"
    self.send_response(404)
    self.send_header("X-Error-Code", code)
    self.send_header("Content-Length", "0")
    self.end_headers()

  def log_message(self, *args):
    pass


def test_an_unknown_name_or_revision_on_the_hub_is_one_line(offline, monkeypatch):
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
  monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
  try:
    with pytest.raises(MissingFileError) as error:
      hf.converted("albert-test/no-such-model")
    assert str(error.value) == (
        "init_checkpoint=albert-test/no-such-model: no folder of that name here and no model of that name on the "
        "Hugging Face Hub (a private or gated one needs `hf auth login`); check the name on "
        "https://huggingface.co/albert-test/no-such-model.")
    with pytest.raises(MissingFileError) as error:
      hf.converted(NAME, "v9")
    assert str(error.value) == (
        f"init_checkpoint={NAME} (revision v9): the Hub model has no such revision; pass one of its branches, tags "
        "or commits as init_checkpoint_revision, or drop it for main.")
  finally:
    server.shutdown()


def test_a_revision_of_anything_but_a_hub_name_is_refused(tmp_path):
  with pytest.raises(InputError, match=r"^init_checkpoint_revision=v2 pins a revision of a Hugging Face Hub name, "
                     rf"and init_checkpoint={tmp_path} is not one; drop init_checkpoint_revision\.$"):
    hf.converted(str(tmp_path), "v2")
