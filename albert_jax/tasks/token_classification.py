"""`token_classification`: a tag per word (named entities, parts of speech) from CoNLL files.

`data.path` holds `train.txt`, `dev.txt` (and optionally `test.txt`): one word per line with its tag in the LAST
column, columns separated by spaces or tabs (CoNLL-2003's `word POS chunk tag` works as it is; other whitespace,
such as a no-break space, is part of the word), a blank line between sentences, `-DOCSTART-` lines skipped.
Words are tokenized one by one and only a word's FIRST sub-token carries its tag (transformers' `run_ner` with
`label_all_tokens=False`); the other sub-tokens, [CLS], [SEP] and padding are ignored by the loss. A sentence
longer than `data.max_seq_length` is cut: its words without a first sub-token in the window are predicted "O"
(outside) with no probabilities.

Loss: each sentence's mean over its tagged tokens, averaged over sentences, so micro batches add up exactly
(see `engine.Job`). Score: for an entity tag set (every tag "O" or B-/I-/E-/S- or BILOU's L-/U- and a type),
seqeval's entity precision/recall/F1 (micro, default mode; F1 selects the checkpoint) and word accuracy, computed
by `metrics.entity_scores`; for any other tag set (parts of speech) entity spans mean nothing, so word accuracy
alone, which selects. Predictions: JSON lines {"id", "tokens", "tags", "probabilities"}.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re

import jax.numpy as jnp
import numpy as np
import optax

from albert_jax import families, storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.head_identity import HFHead
from albert_jax.tasks import metrics
from albert_jax.tasks.base import Split, Task, apply_model, check_outputs, pack, stack_packed
from albert_jax.tasks.input_text import DataFileError
from albert_jax.tasks.classification import label_order
from albert_jax.tasks.heads import TokenClassifier
from albert_jax.tasks.records import Ids, check_name, field, near_miss, optional_id, text_lines, user_records

OUTSIDE = "O"
IGNORED = -1  # label of positions the loss skips
COLUMNS = re.compile(r"[ \t]+")  # CoNLL's separators; str.split() would also cut words at U+00A0, U+3000, ...
ENTITY_TAG = re.compile(r"[BIESLU]-.+")  # a chunk prefix and a type
BILOU = {"L": "E", "U": "S"}  # BILOU's last and unit prefixes are IOBES's E and S


@dataclasses.dataclass
class TaggedSentence:
  sid: str
  words: list[str]
  tags: list[str] | None      # None: unlabelled (test / user input)


@dataclasses.dataclass
class TagPredictions:
  tags: list[list[str]]                           # per sentence, per word
  probabilities: list[list[np.ndarray | None]]    # per word: every tag's probability (None: word cut off)


def read_conll(path: str, labeled: bool) -> list[TaggedSentence]:
  sentences, words, tags = [], [], []
  def close():
    if words:
      sentences.append(TaggedSentence(str(len(sentences)), list(words), list(tags) if labeled else None))
      words.clear()
      tags.clear()
  for number, line in text_lines(path):
    fields = COLUMNS.split(line.strip(" \t")) if line.strip(" \t") else []
    if not fields:
      close()
    elif fields[0] != "-DOCSTART-":
      if labeled and len(fields) < 2:
        raise DataFileError(path, number, f"a word without a tag ({line.strip()!r}); CoNLL lines are `word ... tag` "
                                       "(tag in the last column), with a blank line between sentences.")
      words.append(fields[0])
      tags.append(check_name(fields[-1], "tag", path, number) if labeled else fields[-1])
  close()
  return sentences


def is_entity_tag_set(tags) -> bool:
  """IOB1/IOB2/IOE/IOBES/BILOU tags, what entity scores are defined for: every tag "O" or a chunk prefix and a type
  (and not "O" alone). Anything else (parts of speech: NN, VBZ, ...) is scored by word accuracy."""
  return any(tag != OUTSIDE for tag in tags) and all(tag == OUTSIDE or ENTITY_TAG.fullmatch(tag) for tag in tags)


def _as_iobes(tags: list[str]) -> list[str]:
  return [BILOU[tag[0]] + tag[1:] if ENTITY_TAG.fullmatch(tag) and tag[0] in BILOU else tag for tag in tags]


class TokenClassificationTask(Task):
  length_buckets_apply = False  # outputs per token

  @functools.cached_property
  def labels(self) -> tuple[str, ...]:
    """data.labels, else the sorted tag set of the train file."""
    if self.settings.labels:
      return self.settings.labels
    path = self.split_path("train")
    if not storage.path(path).exists():
      raise MissingFileError(f"{path} not found, and the tag set comes from the train file unless given: set "
                             "--config.data.labels='(\"B-PER\", \"I-PER\", \"O\")' (the tags in output order).")
    return label_order({tag for sentence in read_conll(path, labeled=True) for tag in sentence.tags})

  @property
  def metric_name(self) -> str:
    """Entity F1 for an entity tag set, else word accuracy; a function of the tag set, which the run records
    (head.json), so train, eval and predict agree."""
    return "f1" if is_entity_tag_set(self.labels) else "accuracy"

  # --- data -----------------------------------------------------------------------------------------------
  def split_path(self, split: str) -> str:
    return os.path.join(self.settings.path, f"{split}.txt")

  def read_examples(self, path: str, labeled: bool) -> list[TaggedSentence]:
    sentences = read_conll(path, labeled)
    if labeled:
      unknown = sorted({tag for s in sentences for tag in s.tags} - set(self.labels))
      if unknown:
        raise DataFileError(path, None, f"tags {unknown}{near_miss(unknown[0], self.labels)} are not in the tag set "
                                     f"{list(self.labels)} (data.labels, else the train file's tags): add them there.")
    return sentences

  def read_user_examples(self, path: str) -> list[TaggedSentence]:
    """CoNLL words in the first column (tags, if any, ignored), or JSON lines {"id", "tokens": [words]}."""
    if not path.endswith((".jsonl", ".json")):
      return read_conll(path, labeled=False)
    ids = Ids(path)
    return [TaggedSentence(optional_id(r, path, line, i, ids), [str(w) for w in field(r, "tokens", path, line, list)],
                           None) for i, (line, r) in enumerate(user_records(path))]

  def featurize(self, examples: list[TaggedSentence], tokenizer):
    """Features + info["word_index"]: for each position, the word whose first sub-token it is (else -1)."""
    max_len = self.settings.max_seq_length
    pieces = tokenizer.encode_batch([w for s in examples for w in s.words])
    rows, word_index = [], np.full((len(examples), max_len), -1, np.int32)
    labels = np.full((len(examples), max_len), IGNORED, np.int32)
    position = 0
    for i, sentence in enumerate(examples):
      ids = []
      for w in range(len(sentence.words)):
        word_pieces, position = pieces[position], position + 1
        if word_pieces and len(ids) + 1 < max_len - 1:  # room for its first piece before the final [SEP]
          word_index[i, len(ids) + 1] = w
          if sentence.tags is not None:
            labels[i, len(ids) + 1] = self.labels.index(sentence.tags[w])
        ids.extend(word_pieces)
      rows.append(pack(ids[:max_len - 2], None, tokenizer.cls_id, tokenizer.sep_id, max_len, tokenizer.pair_layout))
    features = stack_packed(rows, (len(examples),))
    if all(s.tags is not None for s in examples):
      features["label"] = labels
    return features, {"word_index": word_index}

  # --- model ----------------------------------------------------------------------------------------------
  def make_model(self, model_config):
    return TokenClassifier(model_config, len(self.labels), self.settings.classifier_dropout_prob)

  @property
  def hf_head(self) -> HFHead:
    return HFHead(self.head_family.hf_class(families.TOKEN_CLASSIFICATION), self.labels)

  def dummy_batch(self, batch_size: int) -> dict[str, np.ndarray]:
    shape = (batch_size, self.settings.max_seq_length)
    return {"input_ids": np.zeros(shape, np.int32), "attention_mask": np.ones(shape, np.int32),
            "token_type_ids": np.zeros(shape, np.int32), "label": np.full(shape, IGNORED, np.int32)}

  def loss_and_metrics(self, model, params, batch, rng, deterministic: bool):
    logits = apply_model(model, params, batch, rng, deterministic)
    labels = batch["label"]
    tagged = labels != IGNORED
    per_token = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(tagged, labels, 0))
    count = tagged.sum(-1)
    loss = (jnp.where(tagged, per_token, 0.0).sum(-1) / jnp.maximum(count, 1)).mean()
    correct = (tagged & (logits.argmax(-1) == labels)).sum()
    return loss, {"loss": loss, "accuracy": correct / jnp.maximum(count.sum(), 1)}

  def predict_step(self, model, params, batch):
    return {"logits": apply_model(model, params, batch)}

  # --- outputs --------------------------------------------------------------------------------------------
  def postprocess(self, split: Split, outputs) -> TagPredictions:
    check_outputs(split, outputs)
    logits = np.asarray(outputs["logits"], np.float64)
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    out = TagPredictions([], [])
    for i, sentence in enumerate(split.examples):
      word_probabilities: list[np.ndarray | None] = [None] * len(sentence.words)
      for position in np.flatnonzero(split.info["word_index"][i] >= 0):
        word_probabilities[split.info["word_index"][i, position]] = probabilities[i, position]
      out.probabilities.append(word_probabilities)
      out.tags.append([OUTSIDE if p is None else self.labels[int(p.argmax())] for p in word_probabilities])
    return out

  def score(self, split: Split, predictions: TagPredictions) -> dict[str, float]:
    gold = [s.tags for s in split.examples]
    if any(tags is None for tags in gold):
      raise InputError(f"split {split.name!r} ({split.path}) has no tags to score against.")
    scores = metrics.entity_scores([_as_iobes(tags) for tags in gold], [_as_iobes(tags) for tags in predictions.tags])
    return scores if self.metric_name == "f1" else {"accuracy": scores["accuracy"]}

  def write_predictions(self, split: Split, predictions: TagPredictions, path: str) -> None:
    with storage.open_atomic(path) as f:
      for sentence, tags, probabilities in zip(split.examples, predictions.tags, predictions.probabilities,
                                               strict=True):
        f.write(json.dumps({"id": sentence.sid, "tokens": sentence.words, "tags": tags, "probabilities": [
            None if p is None else {name: round(float(v), 6) for name, v in zip(self.labels, p)}
            for p in probabilities]}) + "\n")

  def read_predictions(self, path: str, split: Split) -> TagPredictions:
    """Inverse of `write_predictions` in the order of `split`; each sentence's words must match."""
    by_id, ids = {}, Ids(path, "keep one row per sentence")
    for line, r in user_records(path):
      by_id[ids.add(str(field(r, "id", path, line, (str, int))), line)] = (line, r)
    out = TagPredictions([], [])
    for sentence in split.examples:
      if sentence.sid not in by_id:
        raise DataFileError(path, None, f"no prediction for sentence {sentence.sid}")
      line, record = by_id[sentence.sid]
      tags = field(record, "tags", path, line, list)
      if len(tags) != len(sentence.words):
        raise DataFileError(path, line, f"{len(tags)} tags for the {len(sentence.words)} words of sentence "
                                     f"{sentence.sid}; score against the file these predictions are for.")
      out.tags.append(tags)
      out.probabilities.append([None if p is None else np.asarray([p[name] for name in self.labels])
                                for p in field(record, "probabilities", path, line, list)])
    return out
