"""Masking on real text against a transcription of the original per-token loop (tests/albert_reference.py), n-grams
and single words (data.ngram=1), and data.ngram below 1 refused."""
import random

import numpy as np
import pytest

from data_pipeline import rng
from data_pipeline.examples import ExampleConfig
from data_pipeline.masking import Masker, is_start_piece, num_prediction_slots, start_piece_table, word_order
from tests import albert_reference
from tests.data_fixtures import albert_tokenizer, unmasked_batches

pytestmark = pytest.mark.shared_data


def _masker(tokenizer, max_seq_length, max_predictions, **kwargs):
  table = start_piece_table([tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)])
  return Masker(table, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, max_seq_length, max_predictions,
                **kwargs)


def _reference(batch, tokenizer, masker, max_predictions, seed=0):
  """Per-example results of the original algorithm on the same unmasked examples."""
  r, np_r = random.Random(seed), np.random.default_rng(seed)
  out = []
  for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
    tokens = ids[:mask.sum()].tolist()
    out.append(albert_reference.create_masked_lm_predictions(
        tokens, 0.15, max_predictions or 10**9, tokenizer.vocab_size, r, np_r, masker.start_table, tokenizer.cls_id,
        tokenizer.sep_id, tokenizer.mask_id))
  return out


def test_start_piece_rule_matches_the_original():
  assert is_start_piece("\u2581the") and is_start_piece("<unk>") and is_start_piece(",") and is_start_piece("1999")
  assert is_start_piece("é") and is_start_piece("x1")           # any character outside a-z/punctuation
  assert not is_start_piece("ing") and not is_start_piece("xy") and not is_start_piece("s.")


def test_slots_fit_the_budget_without_a_cap():
  assert num_prediction_slots(512, 20, 0.15) == 20
  assert num_prediction_slots(512, 0, 0.15) == 77 and num_prediction_slots(128, 0, 0.15) == 19


@pytest.mark.parametrize("seq,max_predictions", [(512, 20), (512, 0), (128, 20)])
def test_statistics_match_the_original(shared_data, seq, max_predictions):
  tokenizer = albert_tokenizer(shared_data)
  batch, _ = unmasked_batches(shared_data, seq, 500)
  masker = _masker(tokenizer, seq, max_predictions)
  masked, spans = masker.select(batch["input_ids"], batch["attention_mask"], batch["keys"])
  ref = _reference(batch, tokenizer, masker, max_predictions)
  ours_count = masked.sum(1)
  ref_count = np.array([len(r[1]) for r in ref])
  # Budget: min(cap, max(1, round(0.15 * tokens))) -- the original almost always fills it exactly.
  budget = np.maximum(1, np.round(batch["attention_mask"].sum(1) * 0.15))
  if max_predictions:
    budget = np.minimum(budget, max_predictions)
  assert np.all(ours_count <= budget)
  assert abs(ours_count.mean() - ref_count.mean()) < 0.01 * budget.mean()
  assert np.mean(ours_count == budget) > 0.97 and np.mean(ref_count == budget) > 0.97
  # n-gram lengths (in words) of accepted spans: same histogram as the original, near the sampling law 6:3:2.
  ours_hist = np.bincount(spans[spans > 0], minlength=4)[1:] / (spans > 0).sum()
  ref_spans = np.concatenate([r[3] for r in ref])
  ref_hist = np.bincount(ref_spans, minlength=4)[1:] / len(ref_spans)
  n = min(len(ref_spans), (spans > 0).sum())
  assert np.abs(ours_hist - ref_hist).max() < 4 / np.sqrt(n), (ours_hist, ref_hist)
  assert np.abs(ours_hist - np.array([6, 3, 2]) / 11).max() < 0.06, ours_hist


def test_whole_words_and_no_special_token_is_masked(shared_data):
  tokenizer = albert_tokenizer(shared_data)
  batch, _ = unmasked_batches(shared_data, 512, 600)
  masker = _masker(tokenizer, 512, 20)
  masked, _ = masker.select(batch["input_ids"], batch["attention_mask"], batch["keys"])
  ids = batch["input_ids"]
  special = (ids == tokenizer.cls_id) | (ids == tokenizer.sep_id) | (batch["attention_mask"] == 0)
  assert not (masked & special).any()
  # A masked non-start piece has its word's previous piece masked too (words never split).
  cont = masked & ~masker.start_table[ids]
  cont[:, 1] = False
  prev = np.roll(masked, 1, axis=1) | np.roll(special, 1, axis=1)
  assert np.all(prev[cont])


def test_replacement_is_80_10_10_per_token_and_outputs_are_consistent(shared_data):
  tokenizer = albert_tokenizer(shared_data)
  batch, _ = unmasked_batches(shared_data, 512, 500)
  masker = _masker(tokenizer, 512, 0)
  out = masker(batch["input_ids"], batch["attention_mask"], batch["keys"])
  pos, w, labels = out["masked_lm_positions"], out["masked_lm_weights"], out["masked_lm_ids"]
  assert pos.shape == (500, 77) and pos.dtype == np.int32 and w.dtype == np.float32
  rows = np.arange(len(pos))[:, None]
  real = w > 0
  assert np.all(np.diff(np.where(real, pos, 10**6 + np.arange(pos.shape[1])), axis=1) > 0)   # ascending, pad after
  assert np.all(pos[~real] == 0) and np.all(labels[~real] == 0)
  assert np.array_equal(labels[real], batch["input_ids"][rows, pos][real])
  new = out["input_ids"][rows, pos][real]
  n = real.sum()
  is_mask = new == tokenizer.mask_id
  same = new == labels[real]
  frac_mask, frac_same = is_mask.mean(), (same & ~is_mask).mean()
  # [MASK] 0.8; unchanged 0.1 (+ random draws of the same id, ~1/30000); random 0.1. 4 sigma bounds.
  assert abs(frac_mask - 0.8) < 4 * np.sqrt(0.16 / n) and abs(frac_same - 0.1) < 4 * np.sqrt(0.09 / n) + 1e-4
  unmasked = np.ones_like(batch["input_ids"], bool)
  unmasked[np.nonzero(real)[0], pos[real]] = False
  assert np.array_equal(out["input_ids"][unmasked], batch["input_ids"][unmasked])
  # Masked fraction of all tokens in the budget-free mode: 15% (of tokens incl. specials).
  assert abs(n / batch["attention_mask"].sum() - 0.15) < 0.005


def test_masks_are_a_function_of_the_example_key(shared_data):
  tokenizer = albert_tokenizer(shared_data)
  batch, _ = unmasked_batches(shared_data, 128, 64)
  masker = _masker(tokenizer, 128, 20)
  full = masker(batch["input_ids"], batch["attention_mask"], batch["keys"])
  part = masker(batch["input_ids"][10:20], batch["attention_mask"][10:20], batch["keys"][10:20])
  for name in full:
    assert np.array_equal(full[name][10:20], part[name])
  other = masker(batch["input_ids"], batch["attention_mask"], batch["keys"] + np.uint64(1))
  assert not np.array_equal(full["masked_lm_positions"], other["masked_lm_positions"])


class _OurWordOrder(random.Random):
  """The original's `rng`, its shuffle of the words replaced by the order the masker draws for `key`: the two
  algorithms then visit the same words in the same order."""

  def __init__(self, key: np.uint64):
    super().__init__(0)
    self.key = key

  def shuffle(self, words: list) -> None:
    z = rng.bits(np.array([self.key], np.uint64), 1, len(words))   # the masker's stream for its word order
    words[:] = [words[i] for i in word_order(z, np.array([len(words)]))[0]]


@pytest.mark.parametrize("seq,max_predictions", [(128, 20), (512, 0)])
def test_single_word_masking_is_the_originals_given_the_same_word_order(shared_data, seq, max_predictions):
  tokenizer = albert_tokenizer(shared_data)
  batch, _ = unmasked_batches(shared_data, seq, 100)
  table = start_piece_table([tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)])
  masker = Masker(table, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, seq, max_predictions, ngram=1)
  for ids, mask, key in zip(batch["input_ids"], batch["attention_mask"], batch["keys"]):
    masked, spans = masker.select(ids[None], mask[None], key[None])   # one example: its own width, as the original
    _, positions, _, accepted = albert_reference.create_masked_lm_predictions(
        ids[:mask.sum()].tolist(), 0.15, max_predictions or 10**9, tokenizer.vocab_size, _OurWordOrder(key),
        np.random.default_rng(0), table, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, ngram=1)
    assert np.nonzero(masked[0])[0].tolist() == positions
    assert set(accepted) == {1} and sorted(spans[spans > 0].tolist()) == accepted


@pytest.mark.parametrize("ngram", [0, -1])
def test_ngram_below_one_is_refused_naming_the_setting(ngram):
  with pytest.raises(ValueError, match=rf"^data\.ngram={ngram} must be at least 1 .*--config\.data\.ngram"):
    ExampleConfig(ngram=ngram)
