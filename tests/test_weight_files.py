"""Every user-supplied weights file is read through one checked path: a file cut short or damaged (a single
model.safetensors, a shard of a sharded one, a pytorch_model.bin), given as `init_checkpoint` or to
`convert --from=hf --src`, is one line naming the file and the fix."""
import json
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy

from albert_jax.formats import hf_albert, hf_files, weight_files
from albert_jax.errors import InputError, MissingFileError, UserError
from tests.helpers import REPO, TINY_RUN, cpu_env, finetune_cli, glue_data, require_module, spm

TENSORS = {"a": np.arange(4000, dtype=np.float32).reshape(40, 100), "b": np.ones(3, np.float32)}


def saved_bytes(tmp_path) -> bytes:
  file = tmp_path / "whole.safetensors"
  safetensors.numpy.save_file(TENSORS, str(file))
  return file.read_bytes()


DAMAGES = {
    "empty": lambda data: b"",
    "header-cut": lambda data: data[:20],
    "data-cut": lambda data: data[:len(data) // 2],
    "last-byte-missing": lambda data: data[:-1],
    "garbled-header": lambda data: data[:8] + b"\xff" * 40 + data[48:],
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_safetensors_file_is_one_line_naming_it_and_the_fix(tmp_path, damage):
  file = tmp_path / "model.safetensors"
  file.write_bytes(DAMAGES[damage](saved_bytes(tmp_path)))
  with pytest.raises(InputError) as error:
    weight_files.read_safetensors(str(file))
  message = str(error.value)
  assert "\n" not in message and message.startswith(f"{file} is damaged or cut short (safetensors: ")
  assert message.endswith(f": {weight_files.FETCH_AGAIN}.")


def test_a_missing_or_folder_safetensors_file_is_one_line_and_a_whole_one_reads(tmp_path):
  with pytest.raises(MissingFileError, match=f"^{tmp_path / 'none.safetensors'} not found: fetch the checkpoint"):
    weight_files.read_safetensors(str(tmp_path / "none.safetensors"))
  (tmp_path / "folder.safetensors").mkdir()
  with pytest.raises(InputError, match="folder.safetensors is a folder, not a safetensors file: fetch the"):
    weight_files.read_safetensors(str(tmp_path / "folder.safetensors"))
  (tmp_path / "whole.safetensors").write_bytes(saved_bytes(tmp_path))
  read = weight_files.read_safetensors(str(tmp_path / "whole.safetensors"))
  assert sorted(read) == ["a", "b"] and all(np.array_equal(read[k], TENSORS[k]) for k in TENSORS)


def hf_folder(tmp_path, name="hf") -> str:
  hf = pytest.importorskip("tests.hf_models")
  vocab = dict(vocab_size=30000, max_position_embeddings=64)
  return hf.saved(hf.hf_model(hf.transformers.AlbertForSequenceClassification, **vocab), tmp_path / name)


def cut_short(file):
  data = file.read_bytes()
  file.write_bytes(data[:len(data) // 2])


def sharded(folder):
  """`folder`'s model.safetensors split into two shards with their index, the second one cut short."""
  whole = folder / hf_files.SAFETENSORS_FILE
  tensors = safetensors.numpy.load_file(str(whole))
  whole.unlink()
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
  for shard, keys in shards.items():
    safetensors.numpy.save_file({k: tensors[k] for k in keys}, str(folder / shard))
  (folder / hf_files.SAFETENSORS_INDEX).write_text(json.dumps(
      {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
  cut_short(folder / "model-00002-of-00002.safetensors")
  return folder / "model-00002-of-00002.safetensors"


def damaged(kind, tmp_path):
  """An HF folder whose weights file of `kind` is cut short: (folder, the damaged file)."""
  folder = tmp_path / kind
  hf_folder(tmp_path, kind)
  if kind == "sharded":
    return folder, sharded(folder)
  if kind == "torch":
    torch = require_module("torch", extra="hf")
    tensors = safetensors.numpy.load_file(str(folder / hf_files.SAFETENSORS_FILE))
    (folder / hf_files.SAFETENSORS_FILE).unlink()
    torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, folder / hf_files.TORCH_FILE)
    cut_short(folder / hf_files.TORCH_FILE)
    return folder, folder / hf_files.TORCH_FILE
  cut_short(folder / hf_files.SAFETENSORS_FILE)
  return folder, folder / hf_files.SAFETENSORS_FILE


@pytest.mark.parametrize("kind", ["single", "sharded", "torch"])
def test_every_weights_file_of_a_transformers_folder_is_read_through_the_check(tmp_path, kind):
  folder, file = damaged(kind, tmp_path)
  with pytest.raises(UserError) as error:
    hf_albert.load_hf(str(folder))
  assert "\n" not in str(error.value) and str(error.value).startswith(f"{file} is ")
  assert "fetch the checkpoint again" in str(error.value)


def test_a_damaged_model_safetensors_as_init_checkpoint_or_convert_src_is_one_line(shared_data, tmp_path):
  folder, file = damaged("single", tmp_path)
  data = glue_data(shared_data, "sst-2", tmp_path / "glue")
  config = f"experiments/glue.py:task=sst-2,size=tiny,data={data},spm={spm(shared_data)}"
  overrides = [o for o in TINY_RUN if "allow_random_init" not in o and "max_seq_length" not in o]
  warm = finetune_cli(config, tmp_path / "run", *overrides, f"--config.init_checkpoint={folder}",
                      "--config.model.max_position_embeddings=64", "--config.data.max_seq_length=64")
  converted = subprocess.run([sys.executable, "-m", "albert_jax.convert", "--from=hf", f"--src={folder}",
                              f"--dst={tmp_path / 'out'}"], cwd=REPO, env=cpu_env(1), capture_output=True, text=True,
                             timeout=600)
  for result in (warm, converted):
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(("error: ", "convert: error: ")) and f"error: {file} is damaged or cut short" in last
  assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("holds", [[], ["notes.txt"], ["config.json"], ["config.json", "spiece.model"]],
                         ids=["empty", "other-files", "hf-config-only", "hf-config-and-tokenizer"])
def test_a_folder_of_no_weights_as_init_checkpoint_is_named_as_such(shared_data, tmp_path, holds):
  """`init_checkpoint=../../etc` was blamed on an empty data.spm_model; a Hugging Face folder without its weights on
  the vocabulary; with data.spm_model given or not, the folder is named."""
  folder = tmp_path / "weights"
  folder.mkdir()
  for name in holds:
    (folder / name).write_text('{"model_type": "albert", "vocab_size": 30000}' if name == "config.json" else "x")
  for spm_model in ([], [f"--config.data.spm_model={spm(shared_data)}"]):
    result = subprocess.run([sys.executable, "-m", "albert_jax.main", "--config=experiments/glue.py:task=rte,size=tiny",
                             f"--workdir={tmp_path / 'run'}", f"--config.init_checkpoint={folder}", *spm_model],
                            cwd=REPO, env=cpu_env(1), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and result.stderr == (
        f"error: init_checkpoint={folder} holds no weights: pass an albert_jax.convert output (model_config.json), a "
        "training workdir (checkpoints/ or best/) or a Hugging Face folder (config.json with model.safetensors or "
        "pytorch_model.bin).\n"), result.stderr
    assert not (tmp_path / "run").exists()
  weight_files.check_holds_weights(str(tmp_path / "absent"), "init_checkpoint")  # named by the tokenizer's message
  weight_files.check_holds_weights("", "init_checkpoint")


def test_convert_from_hf_refuses_a_tokenizer_larger_than_the_embeddings_and_writes_nothing(shared_data, tmp_path):
  """ALBERT's 30,000 pieces beside embeddings of 97 rows: ids beyond them would have no embedding. The same
  tokenizer beside 30,000 rows converts."""
  from albert_jax import convert
  hf = pytest.importorskip("tests.hf_models")
  small = hf.saved(hf.hf_model(), tmp_path / "small")
  (tmp_path / "small" / "spiece.model").write_bytes(spm(shared_data).read_bytes())
  with pytest.raises(InputError) as refused:
    convert.convert("hf", None, small, str(tmp_path / "out"))
  assert str(refused.value) == (f"{tmp_path / 'small' / 'spiece.model'} has 30,000 pieces but the weights' embeddings "
                                "have 97 rows (config.json vocab_size): ids beyond them have no embedding; put the "
                                "tokenizer the model was trained with in the folder.")
  assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
  fitting = hf_folder(tmp_path, "fitting")
  (tmp_path / "fitting" / "spiece.model").write_bytes(spm(shared_data).read_bytes())
  convert.convert("hf", None, fitting, str(tmp_path / "ours"))
  assert (tmp_path / "ours" / "spiece.model").read_bytes() == spm(shared_data).read_bytes()
