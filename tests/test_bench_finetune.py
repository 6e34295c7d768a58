"""bench.finetune_step: the released shapes it builds, its batches, and one run at a tiny shape (2 layers, H 64)
whose JSON holds both families' rows, ratios and sanity rows (the same model in both frameworks). No timing
assertions: the machine is shared."""
import numpy as np
import pytest

from albert_jax.model_config import model_config_from
from bench import finetune_step
from tests.test_bench import ROW_FIELDS, bench

TINY = ["--layers", "2", "--hidden-size", "64", "--seq-len", "32", "--batch", "4", "--steps", "2", "--warmup", "1",
        "--block", "1", "--matmul-size", "256"]


@pytest.mark.parametrize("family, head, released", [
    ("bert", "bert", dict(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                          position_offset=0)),
    ("roberta", "roberta", dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
                                layer_norm_eps=1e-5, position_offset=2))])
def test_the_config_is_glue_rte_on_the_released_base_shape_with_the_family_head(family, head, released):
  config = finetune_step.fine_tuning_config(finetune_step.parse_args(["--batch", "16", "--seq-len", "64"]), family)
  c = model_config_from(config)
  assert {k: getattr(c, k) for k in released} == released
  assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (12, 768, 12, 3072)
  assert (c.embedding_size, c.sharing, c.hidden_act, c.hidden_dropout_prob) == (768, "none", "gelu", 0.1)
  assert (config.task, config.task_name, config.classifier_head, config.classifier_dropout_prob) == (
      "glue", "rte", head, 0.1)
  assert (config.train.optimizer, config.train.global_batch_size, config.train.micro_batch_size) == ("adamw", 16, 16)
  assert (config.data.max_seq_length, config.data.length_buckets) == (64, "none")
  tiny = model_config_from(finetune_step.fine_tuning_config(finetune_step.parse_args(TINY), family))
  assert (tiny.num_hidden_layers, tiny.hidden_size, tiny.num_attention_heads, tiny.intermediate_size) == (2, 64, 1, 256)


def test_batches_pad_with_the_family_padding_id_and_keep_it_out_of_the_tokens():
  args = finetune_step.parse_args(["--batch", "6", "--seq-len", "16"])
  for family, pad, types in (("bert", 0, {0, 1}), ("roberta", 1, {0})):
    first, second = finetune_step.host_batches(finetune_step.fine_tuning_config(args, family))
    assert not np.array_equal(first["input_ids"], second["input_ids"])
    mask = first["attention_mask"] > 0
    assert first["input_ids"].shape == (6, 16) and mask.sum(1).min() >= 8
    assert np.all(first["input_ids"][~mask] == pad) and np.all(first["input_ids"][mask] >= 3)
    assert set(np.unique(first["token_type_ids"][mask])) == types and np.all(first["token_type_ids"][~mask] == 0)
    assert set(np.unique(first["label"])) <= {0, 1}


def test_an_unknown_model_is_refused_naming_the_families(capsys):
  with pytest.raises(SystemExit):
    finetune_step.parse_args(["--model", "bert,albert"])
  assert "--model albert: choose from ['bert', 'roberta']" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.hf
def test_both_families_run_against_transformers_from_the_same_weights(tmp_path):
  out, record = bench("finetune_step", *TINY, results=tmp_path)
  rows = {row["name"]: row for row in record["rows"]}
  assert list(rows) == ["ours_bert", "peer_bert", "ours_roberta", "peer_roberta", "matmul_jax", "matmul_torch"]
  for name in ("ours_bert", "peer_bert", "ours_roberta", "peer_roberta"):
    row = rows[name]
    assert ROW_FIELDS - {"compiled_memory_bytes"} <= set(row), row
    assert row["steps"] == 2 and row["examples_per_s"] == pytest.approx(4 / row["median_s"])
    assert row["tokens_per_s"] == pytest.approx(4 * 32 / row["median_s"])
    assert row["mfu"] == pytest.approx(row["fraction_of_matmul"]) and row["mfu"] > 0
  assert record["peak_source"].startswith("measured")
  assert record["peak_flops"] == pytest.approx(rows["matmul_jax"]["tflops_per_s"] * 1e12)
  assert rows["ours_bert"]["compiled_memory_bytes"] > 0
  assert record["ratios"] == {family: pytest.approx(rows[f"peer_{family}"]["median_s"] / rows[f"ours_{family}"]
                                                    ["median_s"]) for family in ("bert", "roberta")}
  assert (record["task"], record["batch"], record["seq_len"]) == ("rte", 4, 32)
  assert record["models"]["roberta"].startswith("roberta: RobertaForSequenceClassification shape L=2 H=64")
  # Both frameworks compute the same model: loss, logits and the encoder's states agree without dropout.
  assert [s["model"] for s in record["sanity"]] == ["bert", "roberta"]
  for sanity in record["sanity"]:
    assert sanity["agree"] and sanity["ours_loss"] > 0, sanity
    assert max(sanity["loss_diff"], sanity["logits_diff"], sanity["hidden_diff"]) <= 1e-4, sanity
    assert sanity["ours_loss"] == pytest.approx(sanity["peer_loss"], abs=1e-4)
  assert "ours_bert: " in out and "of the measured jnp.dot rate" in out
  assert "bert: ours" in out and "x the peer's examples/s" in out and "hidden states max |diff|" in out
