"""Start-up refusals that follow the run's tokenizer or family: a text-pair task's shortest length counted in the
tokenizer's pair layout (RoBERTa's `<s> A </s></s> B </s>` takes four special tokens), and a model_family that
names no family refused before pretraining starts."""
import json
import re

import pytest

from albert_jax import finetune, pretrain
from albert_jax.errors import InputError
from albert_jax.tasks import get_task
from albert_jax.tasks.sequence import pack_text
from data_pipeline.pair_layout import ROBERTA
from experiments import glue, pretrain_roberta
from tests.cli_forks import run_each
from tests.helpers import cpu_env

ROBERTA_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "a", "b", "Ġ"]


def roberta_vocab(folder) -> str:
  """A byte-level BPE `vocab.json` (no merges) with RoBERTa's special tokens: a tokenizer of RoBERTa's layout."""
  (folder / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(ROBERTA_TOKENS)}))
  (folder / "merges.txt").write_text("#version: 0.2\n")
  return str(folder / "vocab.json")


def rte_with_roberta_tokenizer(folder, length: int):
  config = glue.get_config(f"task=rte,size=tiny,spm={roberta_vocab(folder)}")
  config.model.update(vocab_size=len(ROBERTA_TOKENS), embedding_size=32)
  config.data.max_seq_length = length
  config.allow_random_init = True
  return config


ROBERTA_TOO_SHORT = ("data.max_seq_length=5 leaves no room for [CLS] A [SEP] [SEP] B [SEP]; give "
                     "--config.data.max_seq_length=6 or more.")


def test_a_pair_task_counts_the_special_tokens_of_the_tokenizers_layout(tmp_path):
  """5 tokens hold BERT's [CLS] A [SEP] B [SEP] (so the config alone passes) but not RoBERTa's pair, which would
  lose a text; 6 hold it, a token of each text."""
  config = rte_with_roberta_tokenizer(tmp_path, 5)
  get_task(config)  # the tokenizer is not read yet: BERT's count, the fewest
  with pytest.raises(InputError, match=f"^{re.escape(ROBERTA_TOO_SHORT)}$"):
    finetune._task_and_model(config)
  config.data.max_seq_length = 6
  _, tokenizer, _, _ = finetune._task_and_model(config)
  assert tokenizer.pair_layout is ROBERTA
  ids, mask, types = pack_text(tokenizer, "aa", "bb", 6)  # each text cut to one token
  assert ids.tolist() == [0, 5, 2, 2, 6, 2] and mask.tolist() == [1] * 6 and types.tolist() == [0] * 6


def test_a_model_family_that_names_none_is_refused_before_pretraining():
  config = pretrain_roberta.get_config("size=tiny")
  config.model_family = "robrta"
  message = ("model_family='robrta' names no model family; set --config.model_family to one of albert, bert, "
             "electra, roberta.")
  with pytest.raises(InputError, match=f"^{re.escape(message)}$"):
    pretrain.checked_model_config(config)
  config.model_family = "roberta"
  assert pretrain.checked_model_config(config).layer_norm_eps == 1e-5


def test_both_refusals_end_the_command_before_its_workdir_is_written(tmp_path):
  rte = tmp_path / "rte_config"
  rte.mkdir()
  roberta_vocab(rte)
  train = ["--mode=train", "--config.train.num_train_steps=2"]
  family, length = run_each([
      ["--config=experiments/pretrain_roberta.py:size=tiny", "--config.model_family=robrta",
       f"--workdir={tmp_path / 'family'}", *train],
      [f"--config=experiments/glue.py:task=rte,size=tiny,spm={rte / 'vocab.json'}",
       f"--config.model.vocab_size={len(ROBERTA_TOKENS)}", "--config.model.embedding_size=32",
       "--config.data.max_seq_length=5", "--config.allow_random_init=True", f"--workdir={tmp_path / 'length'}",
       *train]], cpu_env())
  assert family.stderr.strip().splitlines()[-1] == (
      "error: model_family='robrta' names no model family; set --config.model_family to one of albert, bert, "
      "electra, roberta."), family.stderr
  assert length.stderr.strip().splitlines()[-1] == f"error: {ROBERTA_TOO_SHORT}", length.stderr
  assert family.returncode == length.returncode == 1
  assert not (tmp_path / "family").exists() and not (tmp_path / "length").exists()
