"""Hugging Face BERT and RoBERTa interop (albert_jax/formats/hf_bert.py): every class of both families read with
transformers' logits, written back with the very tensors it was read from and read by transformers with ours;
RoBERTa's positions; the refusals; convert both ways and the family of a run."""
import importlib
import json
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import final_params, pretrain_cli
from tests.hf_models import assert_same_tensors, hf_model, read, torch, transformers

from albert_jax import convert, families  # noqa: E402
from albert_jax.errors import InputError  # noqa: E402
from albert_jax.formats import hf, hf_bert  # noqa: E402
from albert_jax.model import AlbertForPreTraining, AlbertModel  # noqa: E402
from albert_jax.model_config import ModelConfig, model_config_from  # noqa: E402
from albert_jax.tasks.heads import PooledClassifier, SpanExtractor, TokenClassifier  # noqa: E402
from albert_jax.weights import store  # noqa: E402
from albert_jax.weights.resolve import resolve_init_checkpoint  # noqa: E402
from experiments import glue  # noqa: E402
from tests.test_electra_classifier import VOCAB, fine_tuned_from_a_wordpiece_folder  # noqa: E402

pytestmark = pytest.mark.hf
BERT_SIZES = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
                  max_position_embeddings=20, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# As released: one token type, LayerNorm eps 1e-5, positions from pad_token_id + 1 = 2 (so 2 more than the length).
ROBERTA_SIZES = {**BERT_SIZES, "max_position_embeddings": 22, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
                 "pad_token_id": 1}
LAYOUTS = {"bert": (hf_bert.BERT_LAYOUT, BERT_SIZES), "roberta": (hf_bert.ROBERTA_LAYOUT, ROBERTA_SIZES)}
LENGTHS = np.array([7, 5])


def inputs(layout, choices=None):
  """Right-padded ids (no pad id among the tokens, as RoBERTa counts positions over the others), mask, types."""
  ids = np.random.RandomState(0).randint(3, BERT_SIZES["vocab_size"], (2, 7))
  mask = (np.arange(7)[None] < LENGTHS[:, None]).astype(np.int64)
  types = np.zeros_like(ids) if layout is hf_bert.ROBERTA_LAYOUT else (np.arange(7)[None] >= 3) * mask
  ids = np.where(mask > 0, ids, layout.pad_token_id)
  if choices:  # [B, choices, S]: the same rows, shifted per choice
    ids, mask, types = (np.stack([np.roll(x, k, axis=0) for k in range(choices)], 1) for x in (ids, mask, types))
  return ids, mask, types


def hf_outputs(model, batch):
  with torch.no_grad():
    out = model(**{k: torch.tensor(v) for k, v in zip(("input_ids", "attention_mask", "token_type_ids"), batch)})
  if hasattr(out, "start_logits"):
    return [out.start_logits.numpy(), out.end_logits.numpy()]
  if hasattr(out, "seq_relationship_logits"):
    return [out.prediction_logits.numpy(), out.seq_relationship_logits.numpy()]
  return [(out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()]


def our_outputs(layout, role, c: ModelConfig, params, batch, outputs):
  """Our logits for the class of `role`, in transformers' order."""
  batch = tuple(jnp.asarray(x) for x in batch)
  if role == families.PRETRAINING:
    out = AlbertForPreTraining(c).apply({"params": params}, *batch)
    return [out["mlm_logits"], out["sop_logits"]]
  if role == families.MASKED_LM:
    model = AlbertForPreTraining(c)
    return [model.apply({"params": params}, *batch, method=lambda m, *x: m.predictions(m.albert(*x)[0],
                                                                                      m.albert.attend))]
  if role == families.BACKBONE:
    return [AlbertModel(c).apply({"params": params["albert"]}, *batch)[0]]
  head = {families.QUESTION_ANSWERING: lambda: SpanExtractor(c),
          families.TOKEN_CLASSIFICATION: lambda: TokenClassifier(c, outputs),
          families.MULTIPLE_CHOICE: lambda: PooledClassifier(c, 1),
          families.SEQUENCE_CLASSIFICATION: lambda: layout.family.classifier()(c, outputs)}[role]()
  out = head.apply({"params": params}, *batch)
  return list(out) if role == families.QUESTION_ANSWERING else [out[..., 0] if role == families.MULTIPLE_CHOICE
                                                                 else out]


def assert_close(ours, theirs, role):
  """Within 1e-5; per-token outputs on the real tokens only (transformers embeds RoBERTa's pads at the padding
  row, ours at the next positions: either is masked out of every real token's attention)."""
  per_token = role in (families.BACKBONE, families.MASKED_LM, families.TOKEN_CLASSIFICATION,
                       families.QUESTION_ANSWERING, families.PRETRAINING)
  real = np.arange(7)[None] < LENGTHS[:, None]
  for k, (a, b) in enumerate(zip(ours, theirs)):
    a, b = np.asarray(a), np.asarray(b)
    if per_token and not (role == families.PRETRAINING and k == 1):
      a, b = a[real], b[real]
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


CASES = [(name, role) for name, (layout, _) in LAYOUTS.items() for role in layout.family.roles]


@pytest.mark.parametrize("name, role", CASES, ids=[f"{n}-{r}" for n, r in CASES])
def test_every_class_reads_with_transformers_logits_and_writes_back_exactly(name, role, tmp_path):
  layout, sizes = LAYOUTS[name]
  cls = getattr(transformers, layout.family.hf_class(role))
  labels = {families.MULTIPLE_CHOICE: 1, families.QUESTION_ANSWERING: 2}.get(role, 3)
  model = hf_model(cls, sizes=sizes, num_labels=labels)
  model.save_pretrained(tmp_path / "hf")
  c, params = layout.load_hf(str(tmp_path / "hf"))
  assert (c.sharing, c.embedding_size, c.position_offset) == ("none", 32, 2 if name == "roberta" else 0)
  batch = inputs(layout, 3 if role == families.MULTIPLE_CHOICE else None)
  assert_close(our_outputs(layout, role, c, params, batch, labels), hf_outputs(model, batch), role)
  head = hf.read_head(str(tmp_path / "hf"))
  assert layout.save_hf(c, params, str(tmp_path / "back"), head) == [str(tmp_path / "back")]
  assert_same_tensors(read(tmp_path / "back"), read(tmp_path / "hf"))
  written = json.loads((tmp_path / "back" / "config.json").read_text())
  assert (written["architectures"], written["model_type"]) == ([cls.__name__], name)
  back = cls.from_pretrained(tmp_path / "back").eval()
  assert_close(our_outputs(layout, role, c, params, batch, labels), hf_outputs(back, batch), role)


def test_roberta_positions_start_past_the_padding_row_and_bound_the_length():
  c = ModelConfig(**{k: v for k, v in ROBERTA_SIZES.items() if k != "pad_token_id"}, embedding_size=32,
                  sharing="none", position_offset=2)
  assert c.positions == 20
  c.check_seq_length(20)
  with pytest.raises(InputError, match="data.max_seq_length=21 exceeds model.max_position_embeddings=22 - "
                                       "position_offset=2 = 20; lower"):
    c.check_seq_length(21)
  with pytest.raises(InputError, match="model.position_offset=22 must be an integer from 0 to"):
    c.replace(position_offset=22)
  # Row 2 of the table embeds the first token: rows 0 and 1 change nothing, row 2 does.
  model = AlbertModel(c)
  params = nn.unbox(model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"])
  ids = jnp.asarray([[5, 6, 7, 8]])
  with_rows = lambda rows: {**params, "embeddings": {**params["embeddings"], "position_embeddings": {
      "embedding": params["embeddings"]["position_embeddings"]["embedding"].at[rows].set(7.0)}}}
  output = lambda p: np.asarray(model.apply({"params": p}, ids)[0])
  np.testing.assert_array_equal(output(with_rows(slice(0, 2))), output(params))
  assert not np.allclose(output(with_rows(2)), output(params))
  assert output(params).shape == (1, 4, 32) and model.apply({"params": params}, jnp.ones((1, 20), jnp.int32))
  with pytest.raises(InputError, match="Sequence length 21 exceeds model.max_position_embeddings=22 - position_offset=2 = 20"):
    model.apply({"params": params}, jnp.ones((1, 21), jnp.int32))


@pytest.mark.parametrize("cls, sizes, labels", [
    (transformers.RobertaForSequenceClassification, ROBERTA_SIZES, ("contradiction", "entailment", "neutral")),
    (transformers.BertForTokenClassification, BERT_SIZES, ("O", "B-PER", "I-PER"))])
def test_convert_carries_a_fine_tuned_head_and_its_classes_both_ways(cls, sizes, labels, tmp_path):
  model = hf_model(cls, sizes=sizes, id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
  model.save_pretrained(tmp_path / "hf")
  convert.convert("hf", None, str(tmp_path / "hf"), str(tmp_path / "ours"))
  family = json.loads((tmp_path / "ours" / "backbone.json").read_text())["family"]
  assert family == cls.config_class.model_type
  assert json.loads((tmp_path / "ours" / "head.json").read_text())["labels"] == list(labels)
  convert.convert(None, "hf", str(tmp_path / "ours"), str(tmp_path / "back"), spm_model="none")
  assert_same_tensors(read(tmp_path / "back"), read(tmp_path / "hf"))
  written = json.loads((tmp_path / "back" / "config.json").read_text())
  assert written["architectures"] == [cls.__name__]
  assert written["id2label"] == {str(i): name for i, name in enumerate(labels)}


def test_a_folder_of_another_model_type_is_refused_in_one_line(tmp_path):
  transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=11)).save_pretrained(
      tmp_path / "gpt2")
  with pytest.raises(InputError) as refused:
    convert.convert("hf", None, str(tmp_path / "gpt2"), str(tmp_path / "ours"))
  assert str(refused.value) == (f"{tmp_path / 'gpt2' / 'config.json'} has model_type='gpt2'; the model types read "
                                "here are albert, bert, electra, roberta.")


def test_what_bert_and_roberta_classes_cannot_hold_is_refused_before_writing(tmp_path):
  c = ModelConfig(**BERT_SIZES, embedding_size=32, sharing="none")
  params = nn.unbox(AlbertForPreTraining(c).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"])
  cases = [(hf_bert.BERT_LAYOUT, c.replace(sharing="all"), "has one weight set per layer"),
           (hf_bert.BERT_LAYOUT, c.replace(embedding_size=16), "has H-wide embeddings and no projection"),
           (hf_bert.BERT_LAYOUT, c.replace(position_offset=2), "counts positions from 0"),
           (hf_bert.ROBERTA_LAYOUT, c, "counts positions from its padding index"),
           (hf_bert.ROBERTA_LAYOUT, c.replace(position_offset=2, hidden_act="gelu_new"),
            "RobertaForMaskedLM head always applies gelu")]
  for k, (layout, config, message) in enumerate(cases):
    with pytest.raises(InputError, match=message):
      layout.save_hf(config, {"albert": params["albert"], "predictions": params["predictions"]}, str(tmp_path / f"{k}"))
  pooled = {"albert": params["albert"], "classifier": {"kernel": np.zeros((32, 3)), "bias": np.zeros(3)}}
  with pytest.raises(InputError, match="fine-tune with --config.classifier_head=roberta"):
    hf_bert.ROBERTA_LAYOUT.save_hf(c.replace(position_offset=2), pooled, str(tmp_path / "pooled"))
  assert not list(tmp_path.iterdir())
  hf_model(transformers.RobertaModel, sizes=ROBERTA_SIZES).save_pretrained(tmp_path / "causal")
  config = json.loads((tmp_path / "causal" / "config.json").read_text())
  (tmp_path / "causal" / "config.json").write_text(json.dumps({**config, "architectures": ["RobertaForCausalLM"]}))
  with pytest.raises(InputError, match="names RobertaForCausalLM; the RoBERTa classes read here are RobertaModel, "):
    hf_bert.ROBERTA_LAYOUT.load_hf(str(tmp_path / "causal"))


def test_bert_and_roberta_experiments_record_their_family():
  for experiment, family in (("bert_base", "bert"), ("bert_large", "bert"), ("pretrain_roberta", "roberta")):
    config = importlib.import_module(f"experiments.{experiment}").get_config()
    assert families.of_run(config.to_dict()).name == family
  assert families.of_run(importlib.import_module("experiments.pretrain_base").get_config().to_dict()).name == "albert"


@pytest.mark.slow  # two pretraining runs in a subprocess
@pytest.mark.parametrize("family, architecture", [("roberta", "RobertaForMaskedLM"), ("bert", "BertForPreTraining")])
def test_a_run_of_the_family_exports_as_its_class_with_our_logits(family, architecture, tmp_path):
  """pretrain_roberta's tiny run (and the same run told it is BERT, positions from 0) --to=hf: transformers loads
  the class of the run's family and gives the run's MLM logits."""
  bert = ["--config.model_family=bert", "--config.model.position_offset=0"] if family == "bert" else []
  trained = pretrain_cli(tmp_path / "run", "--config.data.kind=synthetic", "--config.train.num_train_steps=2",
                         "--config.data.max_seq_length=16", "--config.train.global_batch_size=4", *bert,
                         config="experiments/pretrain_roberta.py:size=tiny", fast_compile=True)
  assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
  convert.convert(None, "hf", str(tmp_path / "run"), str(tmp_path / "hf"), spm_model="none")
  model = getattr(transformers, architecture).from_pretrained(tmp_path / "hf").eval()
  c = ModelConfig.from_mapping(json.loads((tmp_path / "run" / "config.json").read_text())["model"])
  _, saved = final_params(tmp_path / "run")
  batch = inputs(hf_bert.BERT_LAYOUT if family == "bert" else hf_bert.ROBERTA_LAYOUT)
  batch = (np.where(batch[1] > 0, batch[0], c.position_offset - 1 if c.position_offset else 0), *batch[1:])
  ours = AlbertForPreTraining(c).apply({"params": saved}, *(jnp.asarray(x) for x in batch))
  theirs = hf_outputs(model, batch)
  real = np.asarray(batch[1]) > 0
  np.testing.assert_allclose(np.asarray(ours["mlm_logits"])[real], theirs[0][real], atol=1e-5, rtol=0)
  if family == "bert":
    np.testing.assert_allclose(ours["sop_logits"], theirs[1], atol=1e-5, rtol=0)


def test_a_roberta_folder_as_init_checkpoint_gives_its_layout_and_its_head(tmp_path, monkeypatch):
  """As ALBERT's: converted once into the cache; fine-tuning takes its model (positions from row 2, LayerNorm eps
  1e-5, one token type) and, for classifier_head=auto, RoBERTa's head."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  hf_model(transformers.RobertaForMaskedLM, sizes=ROBERTA_SIZES).save_pretrained(tmp_path / "roberta")
  config = glue.get_config("task=rte,size=tiny")
  config.init_checkpoint = str(tmp_path / "roberta")
  weights = resolve_init_checkpoint(config, overrides=())
  assert weights.path.startswith(str(tmp_path / "cache")) and weights.config.init_checkpoint == weights.path
  assert weights.family.name == "roberta"
  taken = weights.config
  assert (taken.model.position_offset, taken.model.layer_norm_eps, taken.model.type_vocab_size,
          taken.model.max_position_embeddings) == (2, 1e-5, 1, 22)
  assert taken.data.max_seq_length == 20  # the positions the table holds past the offset
  assert taken.classifier_head == "roberta"


def test_a_refusal_names_a_folder_as_given_not_its_conversion(tmp_path, monkeypatch):
  """Weights read through their conversion are named as the flag gave them: an override that misfits a BERT
  folder's weights is refused naming the folder, not the cache."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  hf_model(transformers.BertForMaskedLM, sizes=BERT_SIZES).save_pretrained(tmp_path / "bert")
  config = glue.get_config("task=rte,size=tiny")
  config.init_checkpoint, config.model.num_attention_heads = str(tmp_path / "bert"), 2
  weights = resolve_init_checkpoint(config, overrides=("model.num_attention_heads",))
  assert weights.path.startswith(str(tmp_path / "cache")) and weights.named == f"init_checkpoint={tmp_path / 'bert'}"
  with pytest.raises(InputError, match=rf"^init_checkpoint={re.escape(str(tmp_path / 'bert'))} was saved with "
                                       r"model.num_attention_heads=4 but this run has 2; "):
    weights.params


@pytest.mark.slow  # a fine-tuning run and two conversions checked through transformers
def test_fine_tuning_from_a_bert_folder_takes_its_head_and_vocab_and_exports_as_bert(tmp_path):
  """A BertForPreTraining folder with a WordPiece vocab.txt, as released: fine-tuning from it picks BERT's head
  (the pooled classifier) and tokenizes with its vocabulary; --to=hf of the run is a BertForSequenceClassification
  with the run's classes and logits."""
  sizes = {**BERT_SIZES, "vocab_size": len(VOCAB), "max_position_embeddings": 24}
  _, config, said, best = fine_tuned_from_a_wordpiece_folder(
      tmp_path, sizes, hf_model(transformers.BertForPreTraining, sizes=sizes).save_pretrained, embedding_size=32,
      hidden_act="gelu")
  assert "classifier_head=bert: " in said
  assert json.loads((tmp_path / "run" / "config.json").read_text())["classifier_head"] == "bert"
  exported = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "export").eval()
  assert exported.config.id2label == {0: "neg", 1: "pos"}
  batch = inputs(hf_bert.BERT_LAYOUT)
  batch = (np.minimum(batch[0], len(VOCAB) - 1), *batch[1:])
  ours = PooledClassifier(model_config_from(config), 2).apply({"params": store.load_pretrained(best)[1]},
                                                             *(jnp.asarray(x) for x in batch))
  np.testing.assert_allclose(ours, hf_outputs(exported, batch)[0], atol=1e-5, rtol=0)
