"""experiments/pretrain_roberta.py: RoBERTa's recipe per size, its exact model counts, and the tiny run on the
bundled corpus through the command line."""
import json
import pathlib

import pytest

from albert_jax import flops, job_kinds
from albert_jax.errors import InputError
from albert_jax.cli import experiment_config
from albert_jax.model_config import model_config_for
from experiments import pretrain_roberta
from tests.helpers import logged, pretrain_cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def roberta(size, *overrides):
  return experiment_config(["main", f"--config={ROOT}/experiments/pretrain_roberta.py:size={size}", *overrides])


def flat(config, prefix=""):
  out = {}
  for key, value in config.items():
    out.update(flat(value, f"{prefix}{key}.") if hasattr(value, "items") else {f"{prefix}{key}": value})
  return out


# RoBERTa's settings that are the same for every size (Liu et al. 2019: MLM alone, FULL-SENTENCES, dynamic
# masking of 15% of the tokens).
INPUTS = {"data.packing": "full_sentences", "data.sentence_task": "none", "data.masking": "dynamic",
          "data.max_predictions_per_seq": 0, "data.ngram": 1, "data.short_seq_prob": 0.0}


@pytest.mark.parametrize("size, model, learning_rate, warmup", [("base", "bert_base", 6e-4, 24_000),
                                                                ("large", "bert_large", 4e-4, 30_000)])
def test_base_and_large_carry_the_papers_table_9(size, model, learning_rate, warmup):
  c = flat(roberta(size))
  assert {k: c[k] for k in INPUTS} == INPUTS
  assert {k: v for k, v in c.items() if k.startswith("train.") and k not in ("train.eval_every", "train.eval_batches",
                                                                             "train.micro_batch_size",
                                                                             "train.max_micro_batch_size")} == {
      "train.global_batch_size": 8192, "train.num_train_steps": 500_000, "train.optimizer": "adamw",
      "train.learning_rate": learning_rate, "train.warmup_steps": warmup, "train.poly_power": 1.0,
      "train.weight_decay": 0.01, "train.b1": 0.9, "train.b2": 0.98, "train.eps": 1e-6, "train.clip_grad_norm": 0.0,
      "train.adam_bias_correction": False}
  assert c["data.max_seq_length"] == 512 and c["data.kind"] == "prepared"
  assert (c["model_family"], c["model.position_offset"], c["model.max_position_embeddings"],
          c["model.layer_norm_eps"]) == ("roberta", 2, 514, 1e-5)  # RoBERTa's layout: 512 positions from row 2
  expected = model_config_for(model).to_dict()
  assert {k: c[f"model.{k}"] for k in ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                       "intermediate_size", "sharing", "hidden_act", "hidden_dropout_prob")} == {
      k: expected[k] for k in ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size", "sharing", "hidden_act", "hidden_dropout_prob")}


def test_tiny_is_pretrain_tiny_with_bert_shape_and_robertas_inputs():
  tiny, albert_tiny = flat(roberta("tiny")), flat(experiment_config(["main", f"--config={ROOT}/experiments/"
                                                                            "pretrain_tiny.py"]))
  changed = {k: (albert_tiny.get(k), v) for k, v in tiny.items() if albert_tiny.get(k) != v}
  assert changed == {"model.embedding_size": (32, 128), "model.sharing": ("all", "none"),
                     "model_family": (None, "roberta"), "model.hidden_act": ("gelu_new", "gelu"),
                     "model.layer_norm_eps": (1e-12, 1e-5), "model.position_offset": (0, 1),
                     "data.packing": ("segment_pairs", "full_sentences"), "data.sentence_task": ("sop", "none"),
                     "data.max_predictions_per_seq": (10, 0), "data.ngram": (3, 1), "data.short_seq_prob": (0.1, 0.0)}


def test_an_unknown_size_is_refused():
  with pytest.raises(InputError, match=r"^Config argument size='huge'; choose one of \['tiny', 'base', 'large'\]\.$"):
    pretrain_roberta.get_config("size=huge")


# V=30000, P=514 (RoBERTa's 512 positions from row 2), T=2, by hand. Backbone: embeddings V·H + P·H + 2H + 2H (LayerNorm), L layers of
# 4(H² + H) + 2(H·4H) + 4H + H + 4H (attention, FFN, two LayerNorms), the pooler H² + H. Heads: the MLM transform
# H² + H, its LayerNorm 2H, the output bias V (the decoder is the tied embedding), the sentence head 2H + 2 (kept,
# unused without a sentence task). transformers' BertModel at V=30522, P=512 has 109,482,240 = base + 522·768 - 2·768.
COUNTS = {"base": (109_082_880, 109_082_880 + 768 * 768 + 768 + 2 * 768 + 30000 + 2 * 768 + 2),
          "large": (334_609_408, 334_609_408 + 1024 * 1024 + 1024 + 2 * 1024 + 30000 + 2 * 1024 + 2)}


@pytest.mark.parametrize("size", sorted(COUNTS))
def test_describe_counts_base_and_large_exactly(size, capsys):
  config = roberta(size)
  job_kinds.kind_for(config).describe()
  info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert (info["params_backbone"], info["params_total"]) == COUNTS[size]
  assert info["max_predictions_per_seq"] == 77                      # round(0.15 * 512): no cap
  L, H = (12, 768) if size == "base" else (24, 1024)
  assert info["train_flops_per_token"] == pytest.approx(
      72 * L * H ** 2 + 12 * L * 512 * H + 77 / 512 * 6 * (H * H + H * 30000))   # E = H: no projection
  assert info["train_flops_per_token"] == pytest.approx(
      flops.train_flops_per_token(model_config_for(f"bert_{size}"), 512, 77))


@pytest.mark.slow
def test_the_tiny_run_trains_on_the_bundled_corpus(tmp_path, tiny_prepared):
  """The command line of the docs, shortened: packed batches of the bundled corpus, MLM alone, held-out eval."""
  result = pretrain_cli(tmp_path / "run", f"--config.data.path={pathlib.Path(tiny_prepared).parent}",
                        "--config.train.num_train_steps=4", "--config.train.warmup_steps=1",
                        "--config.train.global_batch_size=8", "--config.data.max_seq_length=32",
                        "--config.train.eval_every=4", "--config.train.eval_batches=1", "--config.log.every=2",
                        "--config.checkpoint.every=4", config="experiments/pretrain_roberta.py:size=tiny",
                        fast_compile=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert sorted(logged(tmp_path / "run", "mlm_accuracy")) == [2, 4]
  assert "held-out eval at step 4: mlm_loss" in result.stdout and "sop" not in result.stdout
