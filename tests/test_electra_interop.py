"""Hugging Face ELECTRA interop (albert_jax/formats/hf_electra.py): logits parity with transformers' ElectraForPreTraining,
ElectraForMaskedLM and ElectraModel both ways, exact round trips, refusals, and convert on an ELECTRA run."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from tests.helpers import final_params, pretrain_cli, require_module

torch = require_module("torch", extra="hf")
transformers = require_module("transformers", extra="hf")

from albert_jax import convert  # noqa: E402
from albert_jax.errors import InputError  # noqa: E402
from albert_jax.families.electra_model import ElectraForPreTraining, generator_config  # noqa: E402
from albert_jax.formats import hf_electra  # noqa: E402
from albert_jax.model import (AlbertForPreTraining, AlbertModel, MaskedLMHead, abstract_params,  # noqa: E402
                              dummy_inputs)
from albert_jax.model_config import ModelConfig  # noqa: E402
from albert_jax.weights import loading
from tests.test_electra import CONFIG, RUN  # noqa: E402

pytestmark = pytest.mark.hf
# Sizes no other test uses: V=53, P=19, E=24; the discriminator H=32 (E != H), the generator H=24 (E == H, no
# projection) or H=16.
HF = dict(vocab_size=53, embedding_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
          intermediate_size=40, max_position_embeddings=19, type_vocab_size=2, hidden_act="gelu",
          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
IDS = np.array([[2, 17, 5, 44, 9, 3, 0], [2, 8, 52, 3, 11, 3, 0]])
MASK = np.array([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]])
TYPES = np.array([[0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1]])


def noisy(model):
  """Every weight (LayerNorms and biases too) random, so a misplaced tensor shows in the logits."""
  torch.manual_seed(0)
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn_like(p) * 0.1)
  return model.eval()


def hf_logits(model):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(IDS), attention_mask=torch.tensor(MASK), token_type_ids=torch.tensor(TYPES))
  return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


def our_logits(c: ModelConfig, params, architecture: str):
  """Our model's logits for the HF class `architecture` on the shared batch: replaced-token logits [B, S], MLM
  logits [B, S, V], or the sequence output."""
  inputs = (jnp.asarray(IDS), jnp.asarray(MASK), jnp.asarray(TYPES))
  if architecture == hf_electra.PRETRAINING:
    return np.asarray(ElectraForPreTraining(c).apply({"params": params}, *inputs,
                                                     method=ElectraForPreTraining.discriminator_logits))
  sequence, _ = AlbertModel(c).apply({"params": params["albert"]}, *inputs)
  if architecture == hf_electra.BACKBONE:
    return np.asarray(sequence)
  word = params["albert"]["embeddings"]["word_embeddings"]["embedding"]
  return np.asarray(MaskedLMHead(c).apply({"params": params["generator_predictions"]}, sequence, lambda x: x @ word.T))


def read_tensors(folder):
  return safetensors.numpy.load_file(str(folder / "model.safetensors"))


CLASSES = {"discriminator_e_ne_h": (transformers.ElectraForPreTraining, {}),
           "generator_e_eq_h": (transformers.ElectraForMaskedLM, dict(hidden_size=24, intermediate_size=20,
                                                                     num_attention_heads=2)),
           "backbone_gelu_new": (transformers.ElectraModel, dict(hidden_act="gelu_new"))}


@pytest.mark.parametrize("cls, overrides", CLASSES.values(), ids=CLASSES.keys())
def test_hf_to_ours_matches_logits_and_round_trips_exactly(cls, overrides, tmp_path):
  model = noisy(cls(transformers.ElectraConfig(**{**HF, **overrides})))
  model.save_pretrained(tmp_path / "hf")
  c, params = hf_electra.load_hf(tmp_path / "hf")
  assert c.sharing == "none" and c.has_embedding_projection == (c.embedding_size != c.hidden_size)
  np.testing.assert_allclose(our_logits(c, params, cls.__name__), hf_logits(model), atol=1e-4, rtol=0)
  assert hf_electra.save_hf(c, params, str(tmp_path / "back")) == [str(tmp_path / "back")]
  original, back = read_tensors(tmp_path / "hf"), read_tensors(tmp_path / "back")
  assert sorted(back) == sorted(k for k in original if k != "generator_lm_head.weight")  # tied: not stored
  for key, value in back.items():
    np.testing.assert_array_equal(value, original[key], err_msg=key)
  assert json.load(open(tmp_path / "back" / "config.json"))["architectures"] == [cls.__name__]


def random_pair(c: ModelConfig, fraction: float):
  """Boxed params of an ELECTRA pair, every leaf noise."""
  rng = np.random.RandomState(1)
  return jax.tree.map(lambda x: (rng.standard_normal(x.shape) * 0.1).astype(np.float32),
                      abstract_params(ElectraForPreTraining(c, fraction)))


def test_an_electra_pair_exports_both_towers_that_transformers_loads_with_our_logits(tmp_path):
  c = ModelConfig(**HF, sharing="none")
  params = random_pair(c, 0.5)
  folders = hf_electra.save_hf(c, params, str(tmp_path / "hf"), generator_fraction=0.5)
  assert folders == [str(tmp_path / "hf"), str(tmp_path / "hf" / "generator")]
  unboxed = nn.unbox(params)
  discriminator = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "hf").eval()
  np.testing.assert_allclose(hf_logits(discriminator), our_logits(c, unboxed, hf_electra.PRETRAINING),
                             atol=1e-4, rtol=0)
  generator = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "hf" / "generator").eval()
  g = generator_config(c, 0.5)
  assert (generator.config.hidden_size, generator.config.embedding_size) == (16, 24)
  positions = jnp.tile(jnp.arange(IDS.shape[1]), (2, 1))
  ours = ElectraForPreTraining(c, 0.5).apply({"params": unboxed}, jnp.asarray(IDS), jnp.asarray(MASK),
                                             jnp.asarray(TYPES), positions,
                                             method=ElectraForPreTraining.generator_logits)
  np.testing.assert_allclose(hf_logits(generator), ours, atol=1e-4, rtol=0)
  # Back: both towers' weights exactly, over one copy of the embeddings; the pooler is not exported.
  dc, disc = hf_electra.load_hf(tmp_path / "hf")
  gc, gen = hf_electra.load_hf(tmp_path / "hf" / "generator")
  assert dc.hidden_size == 32 and gc.hidden_size == g.hidden_size == 16
  same = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
  same({k: disc["albert"][k] for k in ("embeddings", "encoder")},
       {k: unboxed["albert"][k] for k in ("embeddings", "encoder")})
  same(disc["discriminator_predictions"], unboxed["discriminator_predictions"])
  same(gen["albert"]["encoder"], unboxed["generator"])
  same(gen["generator_predictions"], unboxed["generator_predictions"])
  same(gen["albert"]["embeddings"], unboxed["albert"]["embeddings"])


def test_what_hf_electra_cannot_hold_is_refused_in_one_line(tmp_path):
  shared = ModelConfig(**HF, sharing="all")
  with pytest.raises(InputError, match="one weight set per layer"):
    hf_electra.save_hf(shared, random_pair(shared, 0.5), str(tmp_path / "a"), generator_fraction=0.5)
  tanh = ModelConfig(**{**HF, "hidden_act": "gelu_new"}, sharing="none")
  with pytest.raises(InputError, match="always applies exact GELU"):
    hf_electra.save_hf(tanh, random_pair(tanh, 0.5), str(tmp_path / "b"), generator_fraction=0.5)
  with pytest.raises(InputError, match="no generator fraction"):
    hf_electra.save_hf(tanh, random_pair(tanh, 0.5), str(tmp_path / "c"))
  # The generator (H=16 != E) fits, the discriminator (E == H, projection asked for) does not: nothing is written.
  projected = ModelConfig(**{**HF, "embedding_size": 32}, sharing="none", embedding_projection=True)
  with pytest.raises(InputError, match="projects embeddings only where E != H"):
    hf_electra.save_hf(projected, random_pair(projected, 0.5), str(tmp_path / "d"), generator_fraction=0.5)
  assert not any((tmp_path / name).exists() for name in "abcd")
  model = transformers.ElectraForCausalLM(transformers.ElectraConfig(**HF, is_decoder=True))
  model.save_pretrained(tmp_path / "causal")
  with pytest.raises(InputError, match="names ElectraForCausalLM; the ELECTRA classes read here are "
                                       "ElectraForPreTraining, ElectraModel, ElectraForSequenceClassification, "
                                       "ElectraForMaskedLM, ElectraForQuestionAnswering"):
    hf_electra.load_hf(tmp_path / "causal")


@pytest.mark.slow  # a pretraining run in a subprocess: about 30 s on a busy 2-core machine
def test_convert_exports_an_electra_run_and_its_import_warm_starts_fine_tuning(tmp_path, capsys):
  """An ELECTRA run --to=hf: the discriminator and generator folders transformers loads; --from=hf of the
  discriminator gives weights fine-tuning takes (`load_init_params`, `merge_init_params`)."""
  run = tmp_path / "run"
  trained = pretrain_cli(run, *RUN, "--config.train.num_train_steps=2",
                         config=CONFIG, fast_compile=True)
  assert trained.returncode == 0, trained.stdout + trained.stderr
  convert.convert(None, "hf", str(run), str(tmp_path / "hf"), spm_model="none")
  said = capsys.readouterr().out
  assert f"The generator went to {tmp_path / 'hf' / 'generator'} (ElectraForMaskedLM)." in said
  assert "albert/pooler is not written" in said
  _, saved = final_params(run)
  hf = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "hf")
  np.testing.assert_array_equal(hf.electra.embeddings.word_embeddings.weight.detach().numpy(),
                                saved["albert"]["embeddings"]["word_embeddings"]["embedding"])
  generator = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "hf" / "generator")
  assert generator.config.hidden_size * 4 == hf.config.hidden_size
  convert.convert("hf", None, str(tmp_path / "hf"), str(tmp_path / "ours"))
  loaded = loading.load_init_params(str(tmp_path / "ours"))
  config = ModelConfig.from_mapping(json.load(open(run / "config.json"))["model"])
  target = jax.eval_shape(lambda: nn.unbox(AlbertForPreTraining(config).init(jax.random.key(0),
                                                                           **dummy_inputs(1, 8))["params"]))
  merged, fresh = loading.merge_init_params(target, loaded)
  assert sorted({path.split("/")[0] for path in fresh}) == ["predictions", "sop_classifier"]
  jax.tree.map(np.testing.assert_array_equal, merged["albert"]["encoder"], saved["albert"]["encoder"])
