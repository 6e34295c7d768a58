"""Real-text inputs shared by the data tests: ALBERT's tokenizer and unmasked example batches from the corpus."""
import functools
import random

import numpy as np

from data_pipeline import rng
from data_pipeline.instances import PairConfig, assemble, document_instances
from data_pipeline.tokenization import Tokenizer

BOOKS = ("gutenberg_00011_alice_in_wonderland.txt", "gutenberg_01342_pride_and_prejudice.txt",
         "gutenberg_00084_frankenstein.txt")


@functools.lru_cache(maxsize=None)
def albert_tokenizer(shared_data) -> Tokenizer:
  return Tokenizer(shared_data / "albert_spm" / "spiece.model")


@functools.lru_cache(maxsize=None)
def corpus_documents(shared_data) -> tuple:
  """Documents (ids, sentence offsets) of three books, cut into sections as the `paragraphs` source does."""
  from data_pipeline.sentences import split_sentences
  from data_pipeline.sources import Source
  tokenizer = albert_tokenizer(shared_data)
  docs = []
  source = Source(",".join(str(shared_data / "corpus" / b) for b in BOOKS), format="paragraphs")
  for doc in source.documents():
    sentences = [s for s in tokenizer.encode_batch([x for p in doc.units for x in split_sentences(p)]) if s]
    if sentences:
      ids = np.concatenate([np.asarray(s, np.int32) for s in sentences])
      docs.append((ids, np.concatenate([[0], np.cumsum([len(s) for s in sentences])])))
  return tuple(docs)


def unmasked_batches(shared_data, max_seq_length: int, count: int, seed: int = 0, **pair_kwargs):
  """`count` examples built from the corpus, as unmasked arrays plus their keys."""
  tokenizer = albert_tokenizer(shared_data)
  docs = corpus_documents(shared_data)
  config = PairConfig(max_seq_length, **pair_kwargs)
  other = lambda r, i: docs[(i + 1 + r.randrange(len(docs) - 1)) % len(docs)]
  instances = []
  order = list(range(len(docs)))
  random.Random(seed).shuffle(order)
  for i in order:
    instances.extend(document_instances(docs[i], i, rng.mix(seed, i), config, other))
    if len(instances) >= count:
      break
  assert len(instances) >= count, f"the corpus sample gives only {len(instances)} examples"
  batch = assemble(instances[:count], max_seq_length, tokenizer.cls_id, tokenizer.sep_id)
  batch["keys"] = np.array([x.key for x in instances[:count]], np.uint64)
  return batch, instances[:count]
