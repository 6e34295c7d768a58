"""Continued pretraining of a released RoBERTa or BERT (`pretrain.train` with init_checkpoint): a transformers
RobertaForMaskedLM / BertForPreTraining folder with its own tokenizer (a byte-level BPE, a WordPiece vocab.txt,
trained here) warm-starts `pretrain_roberta.py` / `bert_base.py` on a corpus prepared with that tokenizer, the model
taken from the weights and every head of theirs loaded. The first step's losses are transformers' on the same batch,
training lowers the MLM loss, the run resumes exactly, data of another tokenizer is refused in one line, and
transformers' fill-mask pipeline on the exported run gives our model's probabilities. A BertForMaskedLM folder gives
its MLM head the same way."""
import json
import shutil
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax import convert, pretrain
from albert_jax.cli import experiment_config
from albert_jax.errors import InputError
from albert_jax.job_kinds import RunArgs
from albert_jax.model import AlbertForPreTraining
from albert_jax.model_config import ModelConfig
from albert_jax.run import Run
from albert_jax.weights import loading
from albert_jax.weights.resolve import resolve_init_checkpoint
from data_pipeline import train_spm
from data_pipeline.loader import make_pretraining_iterator
from data_pipeline.prepare import PrepareConfig, prepare
from data_pipeline.sources import Source
from data_pipeline.wordpiece import load_tokenizer
from tests.helpers import assert_trees_equal, final_params, logged, quietly
from tests.test_data_tokenizer_kinds import _text_corpus

pytestmark = pytest.mark.hf
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40)


class Family(NamedTuple):
  hf_class: str         # the released folder's transformers class
  tokenizer_kind: str   # train_spm's --model_type of its tokenizer
  tokenizer_file: str   # the file of it that the corpus is prepared with
  experiment: str
  released: dict        # the released config's fields beyond SIZES
  flags: tuple = ()     # the run's own flags


FAMILIES = {
    "roberta": Family("RobertaForMaskedLM", "bpe", "tokenizer.json", "pretrain_roberta.py:size=base",
                      dict(max_position_embeddings=34, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1)),
    "bert": Family("BertForPreTraining", "wordpiece", "vocab.txt", "bert_base.py", dict(max_position_embeddings=32),
                   ("--config.data.sentence_task=nsp",)),
}
FLAGS = ["--config.data.max_seq_length=32", "--config.train.global_batch_size=8", "--config.train.num_train_steps=4",
         "--config.train.warmup_steps=1", "--config.train.learning_rate=0.01", "--config.train.eval_every=0",
         "--config.checkpoint.every=2", "--config.checkpoint.keep=4", "--config.checkpoint.async_save=False",
         "--config.log.every=1", "--config.model.dtype=float32", "--config.model.hidden_dropout_prob=0",
         "--config.model.attention_probs_dropout_prob=0"]


def train(folder, family, run, data):
  """`main --config=experiments/<family's> --config.init_checkpoint=folder ...` in this process: what it printed."""
  flags = [f"--config.init_checkpoint={folder}", f"--config.data.path={data}", *FLAGS, *FAMILIES[family].flags]
  config = experiment_config(["main", f"--config=experiments/{FAMILIES[family].experiment}", *flags])
  overrides = tuple(flag.split("=")[0].removeprefix("--config.") for flag in flags)  # as main passes them
  return quietly(pretrain.train, config, Run(str(run)), RunArgs(overrides=overrides))


def trained_tokenizer(corpus, folder, vocab_size, kind):
  quietly(lambda: train_spm.train(Source(str(corpus)), str(folder), vocab_size=vocab_size, model_type=kind))


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def released(request, tmp_path_factory):
  """A released-style folder of the family (random weights, its tokenizer beside them), a corpus prepared with
  that tokenizer and a 4-step run continuing it: (family, folder, prepared data, run, the run's output)."""
  from tests.hf_models import hf_model, transformers
  family = request.param
  spec, tmp = FAMILIES[family], tmp_path_factory.mktemp(family)
  corpus, _ = _text_corpus(tmp)
  trained_tokenizer(corpus, tmp / "tokenizer", 300, spec.tokenizer_kind)
  folder, tokenizer_file = tmp / "released", spec.tokenizer_file
  vocab_size = load_tokenizer(str(tmp / "tokenizer" / tokenizer_file)).vocab_size
  hf_model(getattr(transformers, spec.hf_class), sizes={**SIZES, **spec.released, "vocab_size": vocab_size}
           ).save_pretrained(folder)
  for path in (tmp / "tokenizer").iterdir():
    shutil.copy(path, folder / path.name)
  quietly(prepare, PrepareConfig(str(corpus), str(folder / tokenizer_file), str(tmp / "prepared"), num_shards=1,
                                 eval_fraction=0.0))
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("XDG_CACHE_HOME", str(tmp / "cache"))  # where the transformers folder is converted
    said = train(folder, family, tmp / "run", tmp / "prepared")
    yield family, folder, tmp / "prepared", tmp / "run", said


def first_batch(run):
  """The run's first batch, read again with the data settings its config.json records."""
  config = json.loads((run / "config.json").read_text())
  return next(make_pretraining_iterator(config["data"], "train", config["train"]["global_batch_size"],
                                        config["seed"], 0, 1, config["model"]["vocab_size"]))


def our_outputs(run, params, batch):
  model = AlbertForPreTraining(ModelConfig.from_mapping(json.loads((run / "config.json").read_text())["model"]))
  return model.apply({"params": params}, *(jnp.asarray(batch[k]) for k in (
      "input_ids", "attention_mask", "token_type_ids", "masked_lm_positions")), deterministic=True)


def test_the_first_steps_losses_are_transformers_on_the_same_batch_with_every_head_loaded(released):
  """The model comes from the weights, the tokenizer from their folder; the MLM head (and BERT's NSP head) is
  theirs: step 1's MLM (and NSP) loss is what transformers computes for the batch with the released model."""
  from tests.hf_models import torch, transformers
  family, folder, _, run, said = released
  assert "model and tokenizer from " in said and "vocab_size=" in said and "hidden_size=32" in said
  # RoBERTa has no sentence head; our model's, unused without a sentence task, is the one left fresh.
  assert ("freshly initialised: ['sop_classifier/bias', 'sop_classifier/kernel']" if family == "roberta" else
          "freshly initialised: none") in said
  batch = first_batch(run)
  labels = np.full(batch["input_ids"].shape, -100)
  rows, slots = np.nonzero(batch["masked_lm_weights"])
  labels[rows, batch["masked_lm_positions"][rows, slots]] = batch["masked_lm_ids"][rows, slots]
  model = getattr(transformers, FAMILIES[family].hf_class).from_pretrained(folder).eval()
  with torch.no_grad():
    out = model(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["attention_mask"]),
                token_type_ids=torch.tensor(batch["token_type_ids"]))
  logits = out.logits if family == "roberta" else out.prediction_logits
  mlm = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(labels).reshape(-1))
  assert logged(run, "mlm_loss")[1] == pytest.approx(float(mlm), rel=1e-5)
  if family == "bert":
    next_or_random = torch.tensor(batch["sentence_order_label"].astype(np.int64))
    nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits, next_or_random)
    assert logged(run, "nsp_loss")[1] == pytest.approx(float(nsp), rel=1e-5)


@pytest.mark.slow  # a resumed run per family: about a minute on 2 busy cores
def test_training_lowers_the_loss_and_a_stopped_run_resumes_exactly(released, tmp_path):
  """The loss of the first batch, after 4 steps; the same command again after a stop at step 2 ends where the run
  did, bit for bit."""
  family, folder, data, run, _ = released
  batch = first_batch(run)
  sums = pretrain.mlm_sums(our_outputs(run, final_params(run)[1], batch)["mlm_logits"], batch)
  assert float(sums["mlm_loss_sum"] / sums["mlm_weight"]) < logged(run, "mlm_loss")[1] - 0.1

  stopped = tmp_path / "stopped"
  shutil.copytree(run, stopped)  # the run as a stop after step 2's checkpoint leaves it
  shutil.rmtree(stopped / "checkpoints" / "4")
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("XDG_CACHE_HOME", str(run.parent / "cache"))
    assert "Resumed from step 2" in train(folder, family, stopped, data)
  (step_a, params_a), (step_b, params_b) = final_params(run), final_params(stopped)
  assert step_a == step_b == 4
  assert_trees_equal(params_a, params_b)
  assert logged(run, "mlm_loss")[4] == logged(stopped, "mlm_loss")[4]


def test_a_corpus_prepared_with_another_tokenizer_is_refused_before_the_run_starts(released, tmp_path):
  """The other family's kind of tokenizer, trained on the same corpus: refused naming the folder given and the
  tokenizer of its conversion, which the data is to be prepared with."""
  family, folder, _, _, _ = released
  tokenizer_file = FAMILIES[family].tokenizer_file
  other = next(spec for name, spec in FAMILIES.items() if name != family)
  other_file = other.tokenizer_file
  corpus, _ = _text_corpus(tmp_path)
  trained_tokenizer(corpus, tmp_path / "other", 300, other.tokenizer_kind)
  quietly(prepare, PrepareConfig(str(corpus), str(tmp_path / "other" / other_file), str(tmp_path / "prepared"),
                                 num_shards=1, eval_fraction=0.0))
  with pytest.MonkeyPatch.context() as patch, pytest.raises(InputError) as refused:
    patch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    train(folder, family, tmp_path / "run", tmp_path / "prepared")
  converted = next((tmp_path / "cache" / "albert_jax" / "hf" / "folders").iterdir())
  assert str(refused.value) == (
      f"init_checkpoint={folder} was trained with the tokenizer {converted / tokenizer_file}, but the data at "
      f"{tmp_path / 'prepared'} was prepared with another (its copy: {other_file}); prepare the corpus with the "
      f"model's own: python -m data_pipeline.prepare --spm_model={converted / tokenizer_file} ...")
  assert not (tmp_path / "run").exists()


def test_the_fill_mask_pipeline_on_the_exported_run_gives_our_probabilities(released, tmp_path):
  """`convert --to=hf` of the run, then transformers' `pipeline("fill-mask")`: its input ids are our tokenizer's,
  its top scores a softmax over our logits at the mask, its tokens decode to the pieces they name."""
  from tests.hf_models import transformers
  family, _, _, run, _ = released
  quietly(convert.convert, None, "hf", str(run), str(tmp_path / "hf"))
  fill = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"))
  mask = fill.tokenizer.mask_token
  text = f"The cat sat on a {mask}."
  ids = fill.tokenizer(text)["input_ids"]
  ours = load_tokenizer(json.loads((run / "config.json").read_text())["data"]["spm_model"])
  before, after = text.split(f" {mask}")
  expected = [ours.cls_id, *ours.encode(before), ours.mask_id, *ours.encode(after), ours.sep_id]
  assert ids == expected
  position = ids.index(ours.mask_id)
  batch = {"input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), np.int32),
           "token_type_ids": np.zeros((1, len(ids)), np.int32), "masked_lm_positions": np.array([[position]])}
  logits = np.asarray(our_outputs(run, final_params(run)[1], batch)["mlm_logits"])[0, 0]
  probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
  top = np.argsort(-probabilities)[:5]
  results = fill(text, top_k=5)
  assert [r["token"] for r in results] == top.tolist()
  np.testing.assert_allclose([r["score"] for r in results], probabilities[top], atol=1e-5, rtol=0)
  for r in results:
    assert r["token_str"] == fill.tokenizer.decode([r["token"]]) and r["token_str"].strip()
    filled = [r["token"] if t == ours.mask_id else t for t in ids]
    assert r["sequence"] == fill.tokenizer.decode(filled, skip_special_tokens=True)


def test_a_bert_masked_lm_folder_gives_its_mlm_head_leaving_only_the_sentence_head_fresh(tmp_path, monkeypatch):
  """BertForMaskedLM, which has no NSP head: the warm start takes its MLM head as it was released."""
  from tests.hf_models import hf_model, transformers
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  released = hf_model(transformers.BertForMaskedLM, sizes={**SIZES, "vocab_size": 61, "max_position_embeddings": 32})
  released.save_pretrained(tmp_path / "released")
  config = experiment_config(["main", "--config=experiments/bert_base.py",
                              f"--config.init_checkpoint={tmp_path / 'released'}"])
  weights = resolve_init_checkpoint(config, overrides=("init_checkpoint",))
  target = jax.device_get(nn.unbox(pretrain.make_job(weights.config).init_params(jax.random.key(0))))
  params, fresh = loading.merge_init_params(target, weights.params)
  assert fresh == ["sop_classifier/bias", "sop_classifier/kernel"]
  head = released.cls.predictions
  np.testing.assert_array_equal(params["predictions"]["bias"], head.bias.detach().numpy())
  np.testing.assert_array_equal(params["predictions"]["dense"]["kernel"],
                                head.transform.dense.weight.detach().numpy().T)
