"""Continued pretraining of an ELECTRA pair (albert_jax/families/electra_continued.py): transformers'
ElectraForPreTraining and ElectraForMaskedLM folders, released-style (one embedding block, a WordPiece vocab.txt),
warm-start a run on a corpus prepared with that vocabulary, both towers and their heads taken, and the run resumes
exactly; a generator of another width or of another pair is refused in one line."""
import json
import shutil

import numpy as np
import pytest

from albert_jax.errors import InputError
from albert_jax.families import electra_continued
from albert_jax.weights import store
from data_pipeline.prepare import PrepareConfig, prepare
from experiments import pretrain_electra
from tests.helpers import assert_trees_equal, final_params, logged, pretrain_cli, quietly

pytestmark = pytest.mark.hf
WORDS = ["the", "a", "film", "was", "good", "bad", "dull", "great", "cat", "sat", "on", "mat", "dog", "ran", "far",
         "and", "it", "rained", "sun", "shone"]
VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS]
# The discriminator's sizes; the generator is half as wide (electra.generator_fraction=0.5: H 16, FFN 32, 1 head).
MODEL = dict(vocab_size=len(VOCAB), embedding_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
             intermediate_size=64, max_position_embeddings=16, hidden_act="gelu")
GENERATOR = dict(hidden_size=16, intermediate_size=32, num_attention_heads=1)


@pytest.fixture
def hf():
  from tests import hf_models
  return hf_models


def released_pair(hf, folder, generator_overrides=None, other_embeddings=False):
  """An ElectraForPreTraining and an ElectraForMaskedLM, every weight random, over one embedding block (as google's
  folders are), with BERT's vocab.txt: (discriminator folder, generator folder)."""
  hf.torch.manual_seed(0)
  models = []
  for cls, fields in ((hf.transformers.ElectraForPreTraining, MODEL),
                      (hf.transformers.ElectraForMaskedLM, {**MODEL, **GENERATOR, **(generator_overrides or {})})):
    model = cls(hf.transformers.ElectraConfig(**fields))
    with hf.torch.no_grad():
      for p in model.parameters():
        p.copy_(hf.torch.randn_like(p) * 0.1)
    models.append(model)
  if not other_embeddings:
    models[1].electra.embeddings.load_state_dict(models[0].electra.embeddings.state_dict())
  folders = []
  for model, name in zip(models, ("discriminator", "generator")):
    folders.append(hf.saved(model, folder / name))
    (folder / name / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  return folders


def config(discriminator_folder, generator_folder=""):
  c = pretrain_electra.get_config("size=tiny")
  c.model.update(MODEL)
  c.electra.generator_fraction, c.electra.init_generator = 0.5, generator_folder
  c.init_checkpoint = discriminator_folder
  return c


def test_a_generator_of_another_width_or_pair_is_refused(hf, tmp_path):
  from albert_jax import convert
  ours = {}
  for name, overrides, other in (("pair", None, False), ("wide", dict(hidden_size=32, intermediate_size=64,
                                                                       num_attention_heads=2), False),
                                 ("other", None, True)):
    folders = released_pair(hf, tmp_path / name, overrides, other)
    for tower, folder in zip(("discriminator", "generator"), folders):
      quietly(convert.convert, "hf", None, folder, str(tmp_path / name / f"{tower}_ours"))
    ours[name] = (store.load_pretrained(str(tmp_path / name / "discriminator_ours"))[1],
                  str(tmp_path / name / "generator_ours"))
  discriminator, generator = ours["pair"]
  params = electra_continued.pair_params(config(""), discriminator, generator)
  assert sorted(params) == ["albert", "discriminator_predictions", "generator", "generator_predictions"]
  with pytest.raises(InputError, match=r"generator_ours is a generator with hidden_size=32, intermediate_size=64, "
                                       r"num_attention_heads=2 but this run's \(electra.generator_fraction=0.5 of the "
                                       r"discriminator\) has hidden_size=16, intermediate_size=32, num_attention_"
                                       r"heads=1; pass --config.electra.generator_fraction=1 "):
    electra_continued.pair_params(config(""), discriminator, ours["wide"][1])
  with pytest.raises(InputError, match="its embeddings differ from init_checkpoint's; ELECTRA's pair shares one"):
    electra_continued.pair_params(config(""), discriminator, ours["other"][1])
  # Found inside the discriminator's folder where not named, as --from=tf1 and --to=hf lay a pair out.
  shutil.copytree(generator, tmp_path / "pair" / "discriminator_ours" / "generator")
  assert electra_continued.generator_folder(config(""), str(tmp_path / "pair" / "discriminator_ours")) == str(
      tmp_path / "pair" / "discriminator_ours" / "generator")
  assert electra_continued.generator_folder(config(""), str(tmp_path / "pair" / "generator_ours")) is None
  with pytest.raises(InputError, match=r"electra.init_generator=.*/nothing is not a generator's weights"):
    electra_continued.generator_folder(config("", str(tmp_path / "nothing")), "")


@pytest.mark.slow  # two 4-step runs in subprocesses: about a minute on 2 busy cores
def test_continued_pretraining_from_a_released_pair_on_a_wordpiece_corpus_resumes_exactly(hf, tmp_path):
  discriminator, generator = released_pair(hf, tmp_path)
  rng = np.random.default_rng(0)
  docs = ["\n".join(" ".join(rng.choice(WORDS, rng.integers(3, 7))) + " ." for _ in range(3)) for _ in range(40)]
  (tmp_path / "corpus.txt").write_text("\n\n".join(docs) + "\n")
  vocab = str(tmp_path / "discriminator" / "vocab.txt")
  quietly(prepare, PrepareConfig(str(tmp_path / "corpus.txt"), vocab, str(tmp_path / "prepared"), num_shards=1,
                                 eval_fraction=0.0))
  flags = [f"--config.model.{k}={v}" for k, v in MODEL.items()] + [
      "--config.electra.generator_fraction=0.5", f"--config.init_checkpoint={discriminator}",
      f"--config.electra.init_generator={generator}", "--config.data.kind=prepared",
      f"--config.data.path={tmp_path / 'prepared'}", f"--config.data.spm_model={vocab}",
      "--config.data.max_seq_length=16", "--config.data.max_predictions_per_seq=3", "--config.train.global_batch_size=8",
      "--config.train.num_train_steps=4", "--config.train.warmup_steps=1", "--config.train.eval_every=0",
      "--config.checkpoint.every=2", "--config.checkpoint.keep=4", "--config.checkpoint.async_save=false",
      "--config.log.every=1", "--config.model.scan_unroll=1"]
  converted = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # where the transformers folders are converted
  result = pretrain_cli(tmp_path / "run", *flags, config="experiments/pretrain_electra.py:size=tiny",
                        extra_env=converted, fast_compile=True)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "continuing its pair with the generator of" in result.stdout
  assert "freshly initialised: none" in result.stdout, result.stdout
  manifest = json.loads((tmp_path / "prepared" / "manifest.json").read_text())
  assert manifest["tokenizer"]["kind"] == "wordpiece"

  stopped = tmp_path / "stopped"
  shutil.copytree(tmp_path / "run", stopped)
  shutil.rmtree(stopped / "checkpoints" / "4")
  resumed = pretrain_cli(stopped, *flags, config="experiments/pretrain_electra.py:size=tiny", extra_env=converted,
                         fast_compile=True)
  assert resumed.returncode == 0, resumed.stdout + resumed.stderr
  assert "Resumed from step 2" in resumed.stdout
  (step_a, params_a), (step_b, params_b) = final_params(tmp_path / "run"), final_params(stopped)
  assert step_a == step_b == 4
  assert_trees_equal(params_a, params_b)
  assert logged(tmp_path / "run", "disc_loss")[4] == logged(stopped, "disc_loss")[4]
