"""From tokenized documents to masked pretraining batches: the settings, and the pair + mask steps joined.

Batch fields (static shapes, S = max_seq_length, P = masking.num_prediction_slots): input_ids, attention_mask,
token_type_ids int32 [B, S]; masked_lm_positions, masked_lm_ids int32 and masked_lm_weights float32 [B, P];
sentence_order_label int32 [B] (1 = swapped/random B). P is max_predictions_per_seq, or when that is 0 (no cap,
exactly masked_lm_prob of each example's tokens) max(1, round(masked_lm_prob * S)), e.g. 77 at S=512.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from data_pipeline import instances as inst
from data_pipeline.masking import Masker, segment_starts_word, start_piece_table
from data_pipeline.tokenization import Tokenizer

from albert_jax.errors import InputError

MASKING_MODES = ("dynamic", "static")
# "segment_pairs": ALBERT's [CLS] A [SEP] B [SEP] examples from one document (instances.py); "full_sentences":
# RoBERTa's sequences packed with whole sentences across documents (packing.py).
PACKINGS = ("segment_pairs", "full_sentences")


@dataclasses.dataclass(frozen=True)
class ExampleConfig:
  """The `config.data` fields that shape examples (experiments/common.py), with the original's defaults."""
  max_seq_length: int = 512
  max_predictions_per_seq: int = 20
  masked_lm_prob: float = 0.15
  short_seq_prob: float = 0.1
  short_seq_scope: str = "chunk"
  ngram: int = 3
  favor_shorter_ngram: bool = True
  sentence_task: str = "sop"
  masking: str = "dynamic"       # "dynamic": new pairs and masks every epoch; "static": they repeat every dupe_factor
  dupe_factor: int = 40
  shuffle_buffer: int = 1024     # instances shuffled together (from whole documents, see loader)
  packing: str = "segment_pairs"

  def __post_init__(self):
    if self.masking not in MASKING_MODES:
      raise InputError(f"masking={self.masking!r}; choose one of {MASKING_MODES}.")
    if self.masking == "static" and self.dupe_factor < 1:
      raise InputError(f"static masking needs dupe_factor >= 1, got {self.dupe_factor}.")
    if not 0 < self.masked_lm_prob < 1:
      raise InputError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}.")
    if self.ngram < 1:
      raise InputError(f"data.ngram={self.ngram} must be at least 1 (1: single words, as BERT masks; ALBERT uses "
                       "3); set --config.data.ngram.")
    self.pair_config()   # validates sentence_task, short_seq_scope, max_seq_length
    if self.packing not in PACKINGS:
      raise InputError(f"data.packing={self.packing!r}; choose one of {PACKINGS}.")
    if self.packing == "full_sentences" and self.sentence_task != "none":
      raise InputError(f"data.packing=full_sentences builds single-segment sequences with no sentence task, but "
                       f"data.sentence_task={self.sentence_task!r}; set --config.data.sentence_task=none (or use "
                       "data.packing=segment_pairs).")
    if self.packing == "full_sentences" and self.masking != "dynamic":
      raise InputError("data.packing=full_sentences packs each epoch's own document order, so data.masking=static "
                       "has no fixed copies to repeat; set --config.data.masking=dynamic (or use "
                       "data.packing=segment_pairs).")

  @classmethod
  def from_config(cls, data_config: Mapping[str, Any]) -> "ExampleConfig":
    return cls(**{f.name: data_config[f.name] for f in dataclasses.fields(cls) if f.name in data_config})

  def pair_config(self) -> inst.PairConfig:
    return inst.PairConfig(self.max_seq_length, self.short_seq_prob, self.short_seq_scope, self.sentence_task)

  def epoch_key(self, epoch: int) -> int:
    """Which variant of the data an epoch sees: a new one each epoch, or one of dupe_factor fixed ones."""
    return epoch % self.dupe_factor if self.masking == "static" else epoch


class BatchBuilder:
  """Assembles instances into padded arrays and masks them."""

  def __init__(self, tokenizer: Tokenizer, config: ExampleConfig):
    self.config = config
    self.pair_config = config.pair_config()
    self.cls_id, self.sep_id = tokenizer.cls_id, tokenizer.sep_id
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    self.masker = Masker(start_piece_table(pieces, tokenizer.kind), tokenizer.cls_id, tokenizer.sep_id,
                         tokenizer.mask_id, config.max_seq_length, config.max_predictions_per_seq,
                         config.masked_lm_prob, config.ngram, config.favor_shorter_ngram,
                         segment_starts_word(tokenizer.kind))

  def __call__(self, instances: list[inst.Instance]) -> dict[str, np.ndarray]:
    batch = inst.assemble(instances, self.config.max_seq_length, self.cls_id, self.sep_id)
    keys = np.fromiter((x.key for x in instances), np.uint64, len(instances))
    batch.update(self.masker(batch["input_ids"], batch["attention_mask"], keys))
    return batch
