"""Sentence-pair construction on real text against the original's loop (tests/albert_reference.py)."""
import random

import numpy as np
import pytest

from data_pipeline import rng
from data_pipeline.instances import PairConfig, _trim, assemble, document_instances, truncate_pair
from tests import albert_reference
from tests.data_fixtures import albert_tokenizer, corpus_documents, unmasked_batches


def test_truncate_pair_lengths_equal_the_original_loop():
  r = random.Random(0)
  for len_a in range(1, 25):
    for len_b in range(1, 25):
      for max_tokens in range(2, 50):
        a, b = list(range(len_a)), list(range(len_b))
        albert_reference.truncate_seq_pair(a, b, max_tokens, r)
        assert truncate_pair(len_a, len_b, max_tokens) == (len(a), len(b))


def test_truncation_drops_from_a_random_end_like_the_original():
  r_ours, r_ref = random.Random(1), random.Random(2)
  ids = np.arange(40)
  ours = [_trim(ids, 10, r_ours)[0] for _ in range(4000)]          # first kept token = tokens dropped in front
  ref = []
  for _ in range(4000):
    a = list(range(40))
    albert_reference.truncate_seq_pair(a, [], 10, r_ref)
    ref.append(a[0])
  # Binomial(30, 1/2): mean 15, variance 7.5.
  for sample in (ours, ref):
    assert abs(np.mean(sample) - 15) < 4 * np.sqrt(7.5 / 4000) and abs(np.var(sample) - 7.5) < 0.8


def _own(instance, doc):
  return np.shares_memory(instance.b, doc[0]) and np.shares_memory(instance.a, doc[0])


pytestmark = pytest.mark.shared_data


def test_pairs_match_the_original_statistics(shared_data):
  """Per-document short target, SOP swaps and random-document B for one-sentence chunks, as the original."""
  docs = corpus_documents(shared_data)
  config = PairConfig(512, short_seq_scope="document")
  ours, ref = [], []
  for seed in range(3):
    other = lambda r, i: docs[(i + 1 + r.randrange(len(docs) - 1)) % len(docs)]
    for i, doc in enumerate(docs):
      ours.extend((len(x.a), len(x.b), x.label) for x in document_instances(doc, i, rng.mix(seed, i), config, other))
    r = random.Random(seed)
    lists = [[doc[0][s:e].tolist() for s, e in zip(doc[1][:-1], doc[1][1:])] for doc in docs]
    for i in range(len(docs)):
      ref.extend((len(a), len(b), int(rn)) for a, b, rn in albert_reference.create_instances_from_document(
          lists, i, 512, 0.1, r))
  ours, ref = np.array(ours), np.array(ref)
  assert abs(len(ours) - len(ref)) < 0.1 * len(ref)            # instance counts depend on the short targets drawn
  total_ours, total_ref = ours[:, 0] + ours[:, 1], ref[:, 0] + ref[:, 1]
  assert total_ours.max() <= 509 and ours[:, :2].min() >= 1
  assert abs(total_ours.mean() - total_ref.mean()) < 0.05 * total_ref.mean()
  assert abs(ours[:, 2].mean() - ref[:, 2].mean()) < 0.03
  assert abs(np.mean(total_ours == 509) - np.mean(total_ref == 509)) < 0.05


def test_sop_labels_are_balanced_and_one_sentence_chunks_take_a_random_document(shared_data):
  docs = corpus_documents(shared_data)
  config = PairConfig(512, short_seq_scope="chunk")
  other = lambda r, i: docs[(i + 1 + r.randrange(len(docs) - 1)) % len(docs)]
  own, foreign = [], []
  for seed in range(3):
    for i, doc in enumerate(docs):
      for x in document_instances(doc, i, rng.mix(seed, i), config, other):
        (own if _own(x, doc) else foreign).append(x.label)
  assert len(own) > 1000 and len(foreign) > 20
  assert abs(np.mean(own) - 0.5) < 4 * np.sqrt(0.25 / len(own))
  assert all(foreign)                                            # random B is always label 1


def test_short_targets_in_chunk_scope_are_ten_percent(shared_data):
  """Chunks with the full target fill all 509 tokens, so short chunks are the short targets (~0.1 x 0.96).

  The three books are one long document here, so that document ends (always short) do not count.
  """
  docs = corpus_documents(shared_data)
  ids = np.concatenate([d[0] for d in docs])
  offsets = np.concatenate([[0]] + [d[1][1:] + sum(len(e[0]) for e in docs[:k]) for k, d in enumerate(docs)])
  book = (ids, offsets)
  config = PairConfig(512, short_seq_scope="chunk")
  lengths = np.array([len(x.a) + len(x.b) for seed in range(16)
                      for x in document_instances(book, 0, seed, config, lambda r, i: docs[0])[:-1] if _own(x, book)])
  assert len(lengths) > 9000
  assert 0.085 < np.mean(lengths < 509) < 0.105, np.mean(lengths < 509)


def test_nsp_and_single_segment_modes(shared_data):
  docs = corpus_documents(shared_data)
  other = lambda r, i: docs[(i + 1 + r.randrange(len(docs) - 1)) % len(docs)]
  nsp = [(x.label, _own(x, doc)) for i, doc in enumerate(docs)
         for x in document_instances(doc, i, rng.mix(3, i), PairConfig(128, sentence_task="nsp"), other)]
  labels, own = np.array(nsp, bool).T
  assert np.all(labels == ~own)                                  # label 1 exactly when B is from another document
  assert 0.5 < labels.mean() < 0.6
  single = document_instances(docs[0], 0, 5, PairConfig(128, sentence_task="none"), other)
  assert all(x.b is None and x.label == 0 and 1 <= len(x.a) <= 126 for x in single)


def test_layout_of_assembled_examples(shared_data):
  tokenizer = albert_tokenizer(shared_data)
  batch, instances = unmasked_batches(shared_data, 128, 300)
  for row, x in enumerate(instances):
    la, lb = len(x.a), len(x.b)
    ids, types, att = batch["input_ids"][row], batch["token_type_ids"][row], batch["attention_mask"][row]
    assert ids[0] == tokenizer.cls_id and ids[1 + la] == tokenizer.sep_id and ids[2 + la + lb] == tokenizer.sep_id
    assert np.array_equal(ids[1:1 + la], x.a) and np.array_equal(ids[2 + la:2 + la + lb], x.b)
    assert np.all(types[:2 + la] == 0) and np.all(types[2 + la:3 + la + lb] == 1) and np.all(types[3 + la + lb:] == 0)
    assert att.sum() == 3 + la + lb and np.all(att[:3 + la + lb] == 1) and np.all(ids[3 + la + lb:] == 0)
  single = assemble([x._replace(b=None) for x in instances[:5]], 128, tokenizer.cls_id, tokenizer.sep_id)
  assert np.all(single["token_type_ids"] == 0)
  assert np.all((single["input_ids"] == tokenizer.sep_id).sum(1) == 1)
