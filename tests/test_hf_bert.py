"""Hugging Face BERT and RoBERTa interop (albert_jax/formats/hf_bert.py): every class of both families read with
transformers' logits, written back with the very tensors it was read from and read by transformers with ours;
RoBERTa's positions; the refusals; convert both ways and the family of a run."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.hf_models import assert_same_tensors, hf_model, read, torch, transformers

from albert_jax import families  # noqa: E402
from albert_jax.errors import InputError  # noqa: E402
from albert_jax.formats import hf, hf_bert  # noqa: E402
from albert_jax.model import AlbertForPreTraining, AlbertModel  # noqa: E402
from albert_jax.model_config import ModelConfig  # noqa: E402
from albert_jax.tasks.heads import PooledClassifier, SpanExtractor, TokenClassifier  # noqa: E402

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
  with pytest.raises(InputError, match="data.max_seq_length=21 exceeds the 20 positions of "
                                       "model.max_position_embeddings=22 \\(position_offset=2\\)"):
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
  with pytest.raises(InputError, match="Sequence length 21 exceeds the 20 positions"):
    model.apply({"params": params}, jnp.ones((1, 21), jnp.int32))
