"""Hugging Face interop: logits parity with transformers' PyTorch ALBERT, bit-exact round trips, the convert CLI."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import pytest

from tests.helpers import REPO, SMALL_RUN, final_params, pretrain_cli, require_module, small_tmpfs

torch = require_module("torch", extra="hf")
transformers = require_module("transformers", extra="hf")

from albert_jax import convert  # noqa: E402
from albert_jax import model as model_lib  # noqa: E402
from albert_jax.formats import hf_albert, hf_files  # noqa: E402
from albert_jax.model_config import ModelConfig  # noqa: E402
from albert_jax.tasks.heads import PooledClassifier, SpanExtractor, TokenClassifier  # noqa: E402
from albert_jax.weights import store
from experiments import glue, race, squad_v1, token_classification  # noqa: E402
from tests.hf_models import (SMALL, assert_same_tensors, batch, hf_forward, hf_model, read,  # noqa: E402
                             saved)

pytestmark = pytest.mark.hf


def random_params(config: ModelConfig, seed=0):
  """Boxed (nn.Partitioned) params as training holds them, every leaf noise (biases and LN too); no compile."""
  rng = np.random.RandomState(seed)
  abstract = model_lib.abstract_params(model_lib.AlbertForPreTraining(config))
  params = jax.tree.map(lambda x: (rng.standard_normal(x.shape) * 0.05).astype(np.float32), abstract)
  assert isinstance(params["albert"]["pooler"]["kernel"], nn.Partitioned)
  return params


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  return saved(hf_model(num_hidden_layers=4, num_hidden_groups=2), tmp_path_factory.mktemp("hf"))


PARITY = {
    "e_ne_h": {},
    "groups2_l4": dict(num_hidden_layers=4, num_hidden_groups=2),
    "inner2_l3": dict(num_hidden_layers=3, inner_group_num=2),
    "e_eq_h_gelu_pytorch_tanh": dict(embedding_size=32, hidden_act="gelu_pytorch_tanh"),
    "erf_gelu": dict(hidden_act="gelu"),
    "relu_groups3": dict(num_hidden_layers=3, num_hidden_groups=3, hidden_act="relu"),
}


@pytest.mark.parametrize("overrides", PARITY.values(), ids=PARITY.keys())
def test_logits_match_transformers(overrides, tmp_path):
  model = hf_model(**overrides)
  config, params = hf_albert.load_hf(saved(model, tmp_path))
  hf_act = overrides.get("hidden_act", "gelu_new")
  assert config.hidden_act == {"gelu_pytorch_tanh": "gelu_new"}.get(hf_act, hf_act)
  assert (config.num_hidden_groups, config.inner_group_num) == (model.config.num_hidden_groups,
                                                                model.config.inner_group_num)
  inputs = batch()
  ours = model_lib.AlbertForPreTraining(config).apply({"params": params}, *inputs)
  theirs = hf_forward(model, *inputs)
  # Every position, padded ones included: both mask keys only.
  np.testing.assert_allclose(ours["mlm_logits"], theirs.prediction_logits.numpy(), rtol=0, atol=1e-4)
  np.testing.assert_allclose(ours["sop_logits"], theirs.sop_logits.numpy(), rtol=0, atol=1e-4)


@pytest.mark.parametrize("overrides", [PARITY["groups2_l4"], dict(embedding_size=32, inner_group_num=2)],
                         ids=["groups2_l4", "e_eq_h_inner2"])
def test_hf_to_ours_to_hf_is_bit_exact(overrides, tmp_path):
  model = hf_model(**overrides)
  config, params = hf_albert.load_hf(saved(model, tmp_path / "hf"))
  hf_albert.save_hf(config, params, tmp_path / "back")
  assert_same_tensors(read(tmp_path / "hf"), read(tmp_path / "back"))
  reloaded, info = transformers.AlbertForPreTraining.from_pretrained(tmp_path / "back", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
  assert torch.equal(hf_forward(reloaded.eval(), *batch()).prediction_logits,
                     hf_forward(model, *batch()).prediction_logits)


def test_ours_to_hf_to_ours_is_bit_exact(tmp_path):
  config = ModelConfig(**{**SMALL, "num_hidden_layers": 4}, num_hidden_groups=2, inner_group_num=2, hidden_act="gelu")
  params = random_params(config)  # boxed, as training holds them
  hf_albert.save_hf(config, params, tmp_path)
  loaded_config, loaded = hf_albert.load_hf(tmp_path)
  assert loaded_config == config.replace(embedding_projection=True)
  expected = jax.tree.map(np.asarray, nn.unbox(params))
  assert jax.tree.structure(loaded) == jax.tree.structure(expected)
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(expected)):
    assert a.dtype == b.dtype and np.array_equal(a, b)


def test_bert_without_projection_exports_as_one_group_per_layer(tmp_path):
  """sharing="none" and E == H with no projection: written as G = L groups and an identity E->H mapping."""
  config = ModelConfig(**{**SMALL, "embedding_size": 32, "num_hidden_layers": 3}, sharing="none",
                       embedding_projection=False)
  params = random_params(config)
  hf_albert.save_hf(config, params, tmp_path)
  loaded_config, loaded = hf_albert.load_hf(tmp_path)
  assert loaded_config == config.replace(num_hidden_groups=3, sharing="all", embedding_projection=True)
  inputs = batch()
  ours = model_lib.AlbertForPreTraining(config).apply({"params": params}, *inputs)
  back = model_lib.AlbertForPreTraining(loaded_config).apply({"params": loaded}, *inputs)
  np.testing.assert_allclose(back["mlm_logits"], ours["mlm_logits"], rtol=0, atol=1e-6)


def test_albert_model_checkpoint_loads_backbone_only(tmp_path):
  model = hf_model(transformers.AlbertModel)
  config, params = hf_albert.load_hf(saved(model, tmp_path / "hf"))
  assert set(params) == {"albert"}
  inputs = batch()
  sequence, pooled = model_lib.AlbertModel(config).apply({"params": params["albert"]}, *inputs)
  theirs = hf_forward(model, *inputs)
  np.testing.assert_allclose(sequence, theirs.last_hidden_state.numpy(), rtol=0, atol=1e-4)
  np.testing.assert_allclose(pooled, theirs.pooler_output.numpy(), rtol=0, atol=1e-4)
  hf_albert.save_hf(config, params, tmp_path / "back")
  assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == ["AlbertModel"]
  _, info = transformers.AlbertModel.from_pretrained(tmp_path / "back", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]


def test_pytorch_bin_checkpoint_loads(tmp_path, hf_dir):
  model = transformers.AlbertForPreTraining.from_pretrained(hf_dir)
  model.config.save_pretrained(tmp_path)
  state = model.state_dict()  # includes the tied predictions.decoder.{weight,bias}, as old .bin files do
  torch.save(state, tmp_path / hf_files.TORCH_FILE)
  config, params = hf_albert.load_hf(tmp_path)
  expected_config, expected = hf_albert.load_hf(hf_dir)
  assert config == expected_config
  jax.tree.map(np.testing.assert_array_equal, params, expected)

  state["predictions.decoder.weight"] = state["predictions.decoder.weight"] + 1.0
  torch.save(state, tmp_path / hf_files.TORCH_FILE)
  with pytest.raises(ValueError, match=r"predictions\.decoder\.weight differs"):
    hf_albert.load_hf(tmp_path)


def _copy_with_config(src, dst, **changes):
  dst.mkdir()
  (dst / hf_files.SAFETENSORS_FILE).write_bytes((Path(src) / hf_files.SAFETENSORS_FILE).read_bytes())
  hf_config = json.loads((Path(src) / "config.json").read_text())
  (dst / "config.json").write_text(json.dumps({**hf_config, **changes}))
  return dst


def test_bad_checkpoints_raise_clear_errors(tmp_path, hf_dir):
  wrong_ffn = _copy_with_config(hf_dir, tmp_path / "ffn", intermediate_size=48)
  with pytest.raises(ValueError, match=r"albert_layers\.0\.ffn\.weight .*shape \[64, 32\].*expects \[48, 32\]"):
    hf_albert.load_hf(wrong_ffn)
  one_group = _copy_with_config(hf_dir, tmp_path / "groups", num_hidden_groups=1)
  with pytest.raises(ValueError, match=r"unexpected parameters .*albert_layer_groups\.1\."):
    hf_albert.load_hf(one_group)
  relative = _copy_with_config(hf_dir, tmp_path / "relative", position_embedding_type="relative_key")
  with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
    hf_albert.load_hf(relative)
  silu = _copy_with_config(hf_dir, tmp_path / "silu", hidden_act="silu")
  with pytest.raises(ValueError, match="hidden_act='silu'"):
    hf_albert.load_hf(silu)
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf_albert.load_hf(tmp_path / "nowhere")


def test_save_hf_rejects_what_hf_cannot_hold(tmp_path, hf_dir):
  config, params = hf_albert.load_hf(hf_dir)
  with pytest.raises(ValueError, match=r"albert\.pooler\.weight .*shape \[32, 48\].*expects \[32, 32\]"):
    bad = jax.tree.map(lambda x: x, params)
    bad["albert"]["pooler"]["kernel"] = np.zeros((32, 48), np.float32)
    hf_albert.save_hf(config, bad, tmp_path / "a")
  with pytest.raises(ValueError, match="sharing='attention'"):
    hf_albert.save_hf(ModelConfig(**SMALL, sharing="attention"), params, tmp_path / "b")
  with pytest.raises(ValueError, match="num_hidden_groups=14"):  # HF's float group rounding differs here
    hf_albert.config_to_hf(ModelConfig(**SMALL | dict(num_hidden_layers=18, num_hidden_groups=14)))


def test_convert_cli_round_trip(tmp_path, hf_dir):
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  run = lambda *args: subprocess.run([sys.executable, "-m", "albert_jax.convert", *args], cwd=REPO, env=env,
                                     capture_output=True, text=True, timeout=120)
  ours, back = tmp_path / "ours", tmp_path / "back"
  result = run("--from=hf", f"--src={hf_dir}", f"--dst={ours}")
  assert result.returncode == 0, result.stderr
  config, params = store.load_pretrained(ours)
  assert config == hf_albert.load_hf(hf_dir)[0]
  result = run("--to=hf", "--spm_model=none", f"--src={ours}", f"--dst={back}")
  assert result.returncode == 0, result.stderr
  assert_same_tensors(read(hf_dir), read(back))
  result = run("--to=hf", "--spm_model=none", f"--src={ours}", f"--dst={back}")
  assert result.returncode == 1 and "--dst" in result.stderr and "--overwrite" in result.stderr


# `convert` killed (SIGKILL) as it is about to write model_config.json, params/ already written.
KILLED_BEFORE_MODEL_CONFIG = """
import os, signal
from absl import app
from albert_jax import convert, storage
from albert_jax.weights import store
write_atomic = storage.write_atomic
def killed_at_model_config(path, data):
  if os.path.basename(path) == store.CONFIG_FILE:
    os.kill(os.getpid(), signal.SIGKILL)
  write_atomic(path, data)
storage.write_atomic = killed_at_model_config
app.run(convert.main)
"""


def test_a_convert_overwrite_killed_before_its_model_config_leaves_nothing_that_loads(tmp_path, hf_dir):
  """kill -9 of `convert --overwrite` between params/ and model_config.json leaves nothing that loads: not the new
  params under the old conversion's model_config.json, silently read as that model (here: another head count,
  which no weight shape shows)."""
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  ours = tmp_path / "ours"
  other = saved(hf_model(num_hidden_layers=4, num_hidden_groups=2, num_attention_heads=2), tmp_path / "other")
  convert.convert("hf", None, other, str(ours))
  args = ["--from=hf", f"--src={hf_dir}", f"--dst={ours}", "--overwrite"]
  killed = subprocess.run([sys.executable, "-c", KILLED_BEFORE_MODEL_CONFIG, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
  assert killed.returncode == -signal.SIGKILL and (ours / "params").is_dir(), killed.stderr
  with pytest.raises(FileNotFoundError, match="not a pretrained-weights directory"):
    store.load_pretrained(ours)
  rerun = subprocess.run([sys.executable, "-m", "albert_jax.convert", *args], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
  assert rerun.returncode == 0, rerun.stderr
  assert store.load_pretrained(ours)[0] == hf_albert.load_hf(hf_dir)[0]


def test_a_failed_conversions_leftovers_are_removed_without_overwrite(tmp_path, hf_dir, capsys):
  """A full disk left orbax's temporary folder in --dst, which then had to be forced with --overwrite (issue #48)."""
  ours = tmp_path / "ours"
  (ours / "params.orbax-checkpoint-tmp-1700000000").mkdir(parents=True)
  (ours / "params.orbax-checkpoint-tmp-1700000000" / "part").write_bytes(b"\0" * 10)
  (ours / "model_config.json.tmp").write_text("{")
  convert.convert("hf", None, str(hf_dir), str(ours))
  assert sorted(p.name for p in ours.iterdir()) == ["model_config.json", "params"]
  assert (f"Removed from --dst={ours} what this conversion does not write: model_config.json.tmp, "
          "params.orbax-checkpoint-tmp-1700000000.") in capsys.readouterr().out
  assert store.load_pretrained(ours)[0] == hf_albert.load_hf(hf_dir)[0]


def test_a_full_disk_is_one_line_and_the_rerun_needs_no_overwrite(tmp_path, hf_dir):
  """A 40 KiB disk for 90 KB of weights: orbax's 113-line traceback, and a leftover that forced --overwrite (issue
  #48)."""
  from albert_jax.errors import EnvironmentUserError
  with small_tmpfs(tmp_path / "disk", "40k") as disk:
    with pytest.raises(EnvironmentUserError) as full:
      convert.convert("hf", None, str(hf_dir), str(disk / "ours"))
    message = str(full.value)
    assert message.startswith(f"Writing --dst={disk / 'ours'} failed: no space left on device (") and \
        message.endswith("); free space and run again, which removes what this one left.") and "\n" not in message
    subprocess.run(["mount", "-o", "remount,size=2m", str(disk)], check=True)
    convert.convert("hf", None, str(hf_dir), str(disk / "ours"))
    assert sorted(p.name for p in (disk / "ours").iterdir()) == ["model_config.json", "params"]


def test_convert_cli_exports_a_pretraining_workdir(tmp_path):
  """--src takes a pretraining workdir, not only a `convert` output: its newest checkpoint goes to Hugging Face as
  it is."""
  trained = pretrain_cli(tmp_path / "run", *SMALL_RUN, "--config.train.num_train_steps=2")
  assert trained.returncode == 0, trained.stderr
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-m", "albert_jax.convert", "--to=hf", "--spm_model=none",
                           f"--src={tmp_path / 'run'}", f"--dst={tmp_path / 'hf'}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert f"--src={tmp_path / 'run'}: loading its newest checkpoint (step 2)" in result.stdout
  step, params = final_params(tmp_path / "run")
  config, exported = hf_albert.load_hf(tmp_path / "hf")
  assert (config.hidden_size, config.vocab_size) == (64, 300)
  for (path, a), (_, b) in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                               jax.tree_util.tree_flatten_with_path(exported)[0], strict=True):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


def test_convert_argument_errors(tmp_path, hf_dir):
  with pytest.raises(ValueError, match="exactly one of --from=hf"):
    convert.convert("hf", "hf", hf_dir, str(tmp_path / "x"))
  with pytest.raises(ValueError, match="exactly one of --from=hf"):
    convert.convert(None, None, hf_dir, str(tmp_path / "x"))
  with pytest.raises(ValueError, match="--src"):
    convert.convert("hf", None, None, str(tmp_path / "x"))
  with pytest.raises(FileNotFoundError, match="--src=.*missing is not a directory"):
    convert.convert("hf", None, str(tmp_path / "missing"), str(tmp_path / "x"))
  with pytest.raises(FileNotFoundError, match=r"--src=.* is neither a pretrained-weights directory .* nor a training "
                                              r"workdir"):
    convert.convert(None, "hf", hf_dir, str(tmp_path / "x"))


def test_group_assignment_matches_hf_wherever_we_export():
  """Every (L, G) that hf_albert accepts assigns layers to groups as transformers does, and G = L is one per layer."""
  for layers in range(1, 49):
    assert model_lib.layers_per_group(layers, layers) == [1] * layers
    for groups in range(1, layers + 1):
      config = ModelConfig(**{**SMALL, "num_hidden_layers": layers}, num_hidden_groups=groups)
      try:
        hf_albert.config_to_hf(config)
      except ValueError:
        continue
      hf_groups = [int(layer / (layers / groups)) for layer in range(layers)]
      assert model_lib.layers_per_group(layers, groups) == [hf_groups.count(g) for g in range(groups)]


# ------------------------------------------------------------------------------------------------ fine-tuned heads

FINETUNED = {  # task -> (experiment config, HF class, our model)
    "rte": (lambda: glue.get_config("task=rte,size=tiny"), "AlbertForSequenceClassification",
            lambda c: PooledClassifier(c, 2)),
    "sts-b": (lambda: glue.get_config("task=sts-b,size=tiny"), "AlbertForSequenceClassification",
              lambda c: PooledClassifier(c, 1)),
    "squad": (lambda: squad_v1.get_config("size=tiny"), "AlbertForQuestionAnswering", SpanExtractor),
    "race": (lambda: race.get_config("size=tiny"), "AlbertForMultipleChoice", lambda c: PooledClassifier(c, 1)),
    "ner": (lambda: token_classification.get_config("size=tiny,labels=B-X|I-X|O"), "AlbertForTokenClassification",
            lambda c: TokenClassifier(c, 3)),
}


def finetuned_workdir(tmp_path, task, config: ModelConfig, params) -> Path:
  """A fine-tuning workdir as training leaves it: config.json naming the task, the best weights in best/step_3."""
  run = FINETUNED[task][0]()
  run.model.update({k: getattr(config, k) for k in SMALL})
  run.data.update(max_seq_length=12, **({"max_query_length": 4} if task == "squad" else
                                        {"max_qa_length": 4} if task == "race" else {}))
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(run.to_json_best_effort())
  store.save_pretrained(str(workdir / "best" / "step_3"), config, params)
  return workdir / "best" / "step_3"


def task_inputs(task):
  ids, mask, types = batch()
  if task != "race":
    return ids, mask, types
  return tuple(np.stack([np.roll(x, k, axis=0) for k in range(4)], axis=1) for x in (ids, mask, types))  # [3, 4, S]


def task_logits(task, model, params, inputs) -> np.ndarray:
  out = model.apply({"params": params}, *inputs)
  return np.stack(out, -1) if task == "squad" else np.asarray(out).reshape(len(inputs[0]), -1)


def hf_task_logits(task, model, inputs) -> np.ndarray:
  out = hf_forward(model, *inputs)
  if task == "squad":
    return np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1)
  return out.logits.numpy().reshape(len(inputs[0]), -1)


@pytest.mark.parametrize("task", sorted(FINETUNED))
def test_finetuned_best_checkpoint_exports_to_its_hf_class_and_back(task, tmp_path):
  config = ModelConfig(**SMALL)
  model = FINETUNED[task][2](config)
  rng = np.random.RandomState(0)
  params = jax.tree.map(lambda x: (rng.standard_normal(x.shape) * 0.3).astype(np.float32),  # logits of order 1
                        nn.unbox(model_lib.abstract_params(model)))
  convert.convert(None, "hf", str(finetuned_workdir(tmp_path, task, config, params)), str(tmp_path / "hf"),
                  spm_model=convert.NO_TOKENIZER)  # its 97 pieces are no SentencePiece model's
  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert hf_config["architectures"] == [FINETUNED[task][1]]
  if task == "rte":
    assert hf_config["id2label"] == {"0": "entailment", "1": "not_entailment"}
  if task == "sts-b":
    assert hf_config["problem_type"] == "regression"
  if task == "ner":
    assert hf_config["id2label"] == {"0": "B-X", "1": "I-X", "2": "O"}
  hf, info = getattr(transformers, FINETUNED[task][1]).from_pretrained(tmp_path / "hf", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  inputs = task_inputs(task)
  theirs, ours = hf_task_logits(task, hf.eval(), inputs), task_logits(task, model, params, inputs)
  print(f"{task}: ours -> HF max |logit difference| {np.abs(theirs - ours).max():.2e} "
        f"(max |logit| {np.abs(ours).max():.2f})")
  np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)

  loaded_config, loaded = hf_albert.load_hf(tmp_path / "hf")  # and back: HF's head is ours again
  assert loaded_config == config.replace(embedding_projection=True)  # HF always has the E->H projection
  if task in ("squad", "ner"):  # HF's QA and token models have no pooler; their heads do not use it
    assert not np.any(loaded["albert"]["pooler"]["kernel"])
    loaded["albert"]["pooler"] = params["albert"]["pooler"]
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_one_output_classifier_outside_its_workdir_is_refused(tmp_path):
  config = ModelConfig(**SMALL)
  params = nn.unbox(model_lib.abstract_params(PooledClassifier(config, 1)))
  params = jax.tree.map(lambda x: np.zeros(x.shape, np.float32), params)
  with pytest.raises(ValueError, match="regression .* or a multiple-choice scorer"):
    hf_albert.save_hf(config, params, tmp_path / "hf")
