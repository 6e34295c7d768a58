"""Tokenizers as Hugging Face folders keep them: a transformers-5 folder whose only tokenizer file is tokenizer.json
is converted, and fine-tuned from, with transformers' own ids."""
import json
from pathlib import Path

import pytest

from albert_jax import convert, finetune
from albert_jax.cli import experiment_config
from albert_jax.run import Run
from albert_jax.tasks import get_task, make_tokenizer
from albert_jax.weights import record
from tests.helpers import glue_data, quietly, rte_pairs

pytestmark = [pytest.mark.shared_data, pytest.mark.hf]

ALBERT = dict(vocab_size=30000, embedding_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
              intermediate_size=64, max_position_embeddings=128)
STEPS = ["--config.train.num_train_steps=2", "--config.train.eval_every=2", "--config.checkpoint.every=2",
         "--config.checkpoint.async_save=False", "--config.train.global_batch_size=8", "--config.train.warmup_steps=1",
         "--config.data.max_seq_length=128"]


@pytest.fixture(scope="module")
def albert_folder(shared_data, tmp_path_factory):
  """A random ALBERT saved by transformers 5 with the tokenizer it builds from our spiece.model: tokenizer.json and
  tokenizer_config.json, no spiece.model."""
  from tests.hf_models import hf_model, saved, transformers
  folder = saved(hf_model(**ALBERT), tmp_path_factory.mktemp("albert") / "hf")
  transformers.AlbertTokenizer.from_pretrained(shared_data / "albert_spm").save_pretrained(folder)
  return folder


def test_a_folder_with_tokenizer_json_alone_is_converted_and_fine_tuned_with_transformers_ids(
    albert_folder, shared_data, tmp_path):
  from tests.hf_models import transformers
  assert not (Path(albert_folder) / "spiece.model").exists()
  ours = str(tmp_path / "ours")
  said = quietly(convert.convert, "hf", None, albert_folder, ours)
  assert said.rstrip().endswith("its tokenizer tokenizer.json, do_lower_case=True)."), said
  assert record.recorded_tokenizer(ours) == (f"{ours}/tokenizer.json", True)

  root = glue_data(shared_data, "rte", tmp_path / "glue")
  argv = ["main", f"--config=experiments/glue.py:task=rte,size=tiny,data={root}", f"--config.init_checkpoint={ours}",
          *STEPS]
  config, taken = record.take_recorded(experiment_config(argv), ours, explicit=("data.max_seq_length",))
  assert config.data.spm_model == f"{ours}/tokenizer.json", taken
  theirs = transformers.AutoTokenizer.from_pretrained(albert_folder)
  task = get_task(config)
  features, _ = task.featurize(task.read_examples(f"{root}/RTE/dev.tsv", True), make_tokenizer(config))
  compared = 0
  for row, (first, second, _) in enumerate(rte_pairs(shared_data, len(features["input_ids"]))):
    expected = theirs(first, second, return_token_type_ids=True)
    length = len(expected["input_ids"])
    if length <= 128:  # no truncation to tell apart
      assert features["input_ids"][row][:length].tolist() == expected["input_ids"], first
      assert features["token_type_ids"][row][:length].tolist() == expected["token_type_ids"], first
      assert features["attention_mask"][row].sum() == length
      compared += 1
  assert compared >= 15

  finetune.train(config, Run(str(tmp_path / "run")))
  best = json.loads((tmp_path / "run" / "best" / "best.json").read_text())
  assert best["step"] == 2
  recorded = json.loads((tmp_path / "run" / "config.json").read_text())["data"]["spm_model"]
  assert recorded == f"{ours}/tokenizer.json"
