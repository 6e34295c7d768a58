"""Transcriptions of google-research/albert `create_pretraining_data.py` (per-token Python loops), as test oracles.

Kept line for line with the original (FLAGS become arguments; tokens are ids, `is_start` says which ids open a
word; `np.random.choice` uses the passed NumPy generator instead of the global one).
"""
import collections

import numpy as np

MaskedLmInstance = collections.namedtuple("MaskedLmInstance", ["index", "label"])


def create_masked_lm_predictions(tokens, masked_lm_prob, max_predictions_per_seq, vocab_size, rng, np_rng,
                                 is_start, cls_id, sep_id, mask_id, ngram=3, favor_shorter_ngram=True):
  """Returns (output_tokens, positions, labels, accepted n-gram lengths in words)."""
  cand_indexes = []
  for (i, token) in enumerate(tokens):
    if token == cls_id or token == sep_id:
      continue
    if len(cand_indexes) >= 1 and not is_start[token]:
      cand_indexes[-1].append(i)
    else:
      cand_indexes.append([i])
  output_tokens = list(tokens)
  num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
  ngrams = np.arange(1, ngram + 1, dtype=np.int64)
  pvals = 1. / np.arange(1, ngram + 1)
  pvals /= pvals.sum(keepdims=True)
  if not favor_shorter_ngram:
    pvals = pvals[::-1]
  ngram_indexes = []
  for idx in range(len(cand_indexes)):
    ngram_index = []
    for n in ngrams:
      ngram_index.append(cand_indexes[idx:idx + n])
    ngram_indexes.append(ngram_index)
  rng.shuffle(ngram_indexes)
  masked_lms, accepted = [], []
  covered_indexes = set()
  for cand_index_set in ngram_indexes:
    if len(masked_lms) >= num_to_predict:
      break
    if not cand_index_set:
      continue
    n = np_rng.choice(ngrams[:len(cand_index_set)],
                      p=pvals[:len(cand_index_set)] / pvals[:len(cand_index_set)].sum(keepdims=True))
    index_set = sum(cand_index_set[n - 1], [])
    n -= 1
    while len(masked_lms) + len(index_set) > num_to_predict:
      if n == 0:
        break
      index_set = sum(cand_index_set[n - 1], [])
      n -= 1
    if len(masked_lms) + len(index_set) > num_to_predict:
      continue
    is_any_index_covered = False
    for index in index_set:
      if index in covered_indexes:
        is_any_index_covered = True
        break
    if is_any_index_covered:
      continue
    accepted.append(len(cand_index_set[n]))
    for index in index_set:
      covered_indexes.add(index)
      if rng.random() < 0.8:
        masked_token = mask_id
      else:
        if rng.random() < 0.5:
          masked_token = tokens[index]
        else:
          masked_token = rng.randint(0, vocab_size - 1)
      output_tokens[index] = masked_token
      masked_lms.append(MaskedLmInstance(index=index, label=tokens[index]))
  masked_lms = sorted(masked_lms, key=lambda x: x.index)
  return output_tokens, [p.index for p in masked_lms], [p.label for p in masked_lms], accepted


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
  while True:
    total_length = len(tokens_a) + len(tokens_b)
    if total_length <= max_num_tokens:
      break
    trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    assert len(trunc_tokens) >= 1
    if rng.random() < 0.5:
      del trunc_tokens[0]
    else:
      trunc_tokens.pop()


def create_instances_from_document(all_documents, document_index, max_seq_length, short_seq_prob, rng,
                                   random_next_sentence=False):
  """Returns [(tokens_a, tokens_b, is_random_next)] (masking left out; documents are lists of id lists)."""
  document = all_documents[document_index]
  max_num_tokens = max_seq_length - 3
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  instances = []
  current_chunk = []
  current_length = 0
  i = 0
  while i < len(document):
    segment = document[i]
    current_chunk.append(segment)
    current_length += len(segment)
    if i == len(document) - 1 or current_length >= target_seq_length:
      if current_chunk:
        a_end = 1
        if len(current_chunk) >= 2:
          a_end = rng.randint(1, len(current_chunk) - 1)
        tokens_a = []
        for j in range(a_end):
          tokens_a.extend(current_chunk[j])
        tokens_b = []
        if len(current_chunk) == 1 or (random_next_sentence and rng.random() < 0.5):
          is_random_next = True
          target_b_length = target_seq_length - len(tokens_a)
          for _ in range(10):
            random_document_index = rng.randint(0, len(all_documents) - 1)
            if random_document_index != document_index:
              break
          random_document = all_documents[random_document_index]
          random_start = rng.randint(0, len(random_document) - 1)
          for j in range(random_start, len(random_document)):
            tokens_b.extend(random_document[j])
            if len(tokens_b) >= target_b_length:
              break
          num_unused_segments = len(current_chunk) - a_end
          i -= num_unused_segments
        elif not random_next_sentence and rng.random() < 0.5:
          is_random_next = True
          for j in range(a_end, len(current_chunk)):
            tokens_b.extend(current_chunk[j])
          tokens_a, tokens_b = tokens_b, tokens_a
        else:
          is_random_next = False
          for j in range(a_end, len(current_chunk)):
            tokens_b.extend(current_chunk[j])
        truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
        assert len(tokens_a) >= 1
        assert len(tokens_b) >= 1
        instances.append((tokens_a, tokens_b, is_random_next))
      current_chunk = []
      current_length = 0
    i += 1
  return instances
