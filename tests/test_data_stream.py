"""The loader's document stream against the grain pipeline it replaces: same order, same batches, same state."""
import functools
import hashlib
import json
import os
import pickle
import random

import grain
import numpy as np
import pytest
from grain._src.python.experimental.index_shuffle.python import index_shuffle_module

from data_pipeline import records, shuffle, tiny
from data_pipeline.examples import BatchBuilder, ExampleConfig
from data_pipeline.loader import (DocumentSource, PretrainingBatches, document_pairs, document_stream,
                                  make_pretraining_iterator)
from data_pipeline.tokenization import Tokenizer


@pytest.mark.parametrize("count", [1, 2, 3, 17, 108, 1000, 3066, 16384, 16385, 65537])
def test_permutation_is_grains_index_shuffle(count):
  # 65537 elements: grain's 16-bit cipher cannot hold index 65536 and maps it like 0; kept, since that is the order.
  r = random.Random(count)
  for seed in (0, 2**32 - 1, r.randrange(2**32)):
    indices = range(count) if count <= 3066 else r.sample(range(count), 500) + [count - 1]
    expected = [index_shuffle_module.index_shuffle(i, max_index=count - 1, seed=seed, rounds=4) for i in indices]
    assert shuffle.permutation(count, seed)[list(indices)].tolist() == expected


class _WithEpoch:
  """The grain pipeline's element i -> (document index, epoch, document)."""

  def __init__(self, count):
    self.count = count

  def __call__(self, index, doc):
    return index % self.count, index // self.count, doc


def _grain_stream(documents, seed, process_index, process_count):
  """The document stream as this loader built it on grain's MapDataset before (its order defines the data)."""
  ds = grain.MapDataset.source(documents).map_with_index(_WithEpoch(len(documents)))
  return ds[process_index::process_count].shuffle(seed=seed % 2**32).repeat(None)


@pytest.mark.parametrize("count,seed,process_index,process_count",
                         [(40, 0, 0, 1), (41, 7, 2, 3), (64, 2**40 + 3, 1, 2)])
def test_order_is_the_grain_pipelines_for_hosts_epochs_and_workers(count, seed, process_index, process_count):
  host_docs = len(range(process_index, count, process_count))
  positions = range(3 * host_docs + 5)                      # three epochs and a bit
  reference = _grain_stream(range(count), seed, process_index, process_count)
  stream = document_stream(range(count), seed, process_index, process_count)
  assert stream.order(positions) == [reference[i][:2] for i in positions]
  for worker in range(3):                                   # mp_prefetch: worker i of 3 takes slice(i, None, 3)
    stream = document_stream(range(count), seed, process_index, process_count)
    stream.set_slice(slice(worker, None, 3))
    assert stream.order(positions) == [reference.slice(slice(worker, None, 3))[i][:2] for i in positions]


def _digests(iterator, count):
  out = []
  for _ in range(count):
    batch = next(iterator)
    out.append(hashlib.sha256(b"".join(k.encode() + batch[k].tobytes() for k in sorted(batch))).hexdigest())
  return out


@pytest.mark.parametrize("scope,in_memory_bytes", [("document", DocumentSource.IN_MEMORY_BYTES), ("chunk", 0)])
def test_batches_and_states_equal_the_grain_pipeline_fed_from_memory(tiny_prepared, scope, in_memory_bytes):
  # The tiny split is read into memory by default; in_memory_bytes=0 reads every document from the shards.
  config = {"kind": "prepared", "path": tiny_prepared, "max_seq_length": 512, "max_predictions_per_seq": 20,
            "short_seq_scope": scope, "num_workers": 0, "prefetch": 0, "shuffle_buffer": 64}
  manifest = records.read_manifest(tiny_prepared)
  source = DocumentSource(records.split_files(tiny_prepared, manifest, "train"), manifest["token_dtype"])
  decoded = [source[i] for i in range(len(source))]

  class Decoded:
    def other(self, r, doc_index):
      return decoded[DocumentSource.pick_other(r, doc_index, len(decoded))]

  tokenizer = Tokenizer(f"{tiny_prepared}/{manifest['tokenizer']['model']}", manifest["tokenizer"]["do_lower_case"])
  builder = BatchBuilder(tokenizer, ExampleConfig.from_config(config))
  stream = _grain_stream(decoded, 3, 1, 2).to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  reference = iter(PretrainingBatches(stream, functools.partial(document_pairs, Decoded(), builder, 3), builder, 8))
  loader = make_pretraining_iterator(config, "train", 16, 3, 1, 2, vocab_size=tiny.VOCAB_SIZE,
                                     in_memory_bytes=in_memory_bytes)
  for _ in range(3):                                        # windows of 64 instances: batches cross them
    assert _digests(loader, 7) == _digests(reference, 7)
    assert loader.get_state() == reference.get_state()
  state = json.loads(json.dumps(reference.get_state()))     # a checkpoint of the grain pipeline resumes exactly
  expected = _digests(reference, 10)
  resumed = make_pretraining_iterator(config, "train", 16, 3, 1, 2, vocab_size=tiny.VOCAB_SIZE,
                                      in_memory_bytes=in_memory_bytes)
  resumed.set_state(state)
  assert _digests(resumed, 10) == expected


def test_stream_reads_documents_as_views_of_their_records(tiny_prepared):
  manifest = records.read_manifest(tiny_prepared)
  source = DocumentSource(records.split_files(tiny_prepared, manifest, "train"), manifest["token_dtype"],
                          in_memory_bytes=0)
  stream = iter(document_stream(source, 0, 0, 1))
  for _ in range(len(source) + 3):                          # into the second epoch
    index, epoch, (ids, offsets) = next(stream)
    decoded_ids, decoded_offsets = source[index]
    assert ids.dtype == np.uint16 and not ids.flags.owndata
    assert np.array_equal(ids, decoded_ids) and np.array_equal(offsets, decoded_offsets)
  assert epoch == 1 and stream.get_state() == {"next_index": len(source) + 3}
  with pytest.raises(IndexError):
    source.view(len(source))


def test_a_small_split_is_read_once_into_memory_and_serves_the_same_documents(tiny_prepared):
  manifest = records.read_manifest(tiny_prepared)
  files = records.split_files(tiny_prepared, manifest, "train")
  size = sum(os.path.getsize(f) for f in files)
  in_memory = DocumentSource(files, manifest["token_dtype"])
  at_limit, from_disk = (DocumentSource(files, manifest["token_dtype"], limit) for limit in (size, size - 1))
  assert size <= DocumentSource.IN_MEMORY_BYTES and in_memory.in_memory and at_limit.in_memory
  assert not from_disk.in_memory
  for index in range(len(from_disk)):
    (ids, offsets), (disk_ids, disk_offsets) = in_memory.view(index), from_disk.view(index)
    assert ids.dtype == np.int32 and disk_ids.dtype == np.uint16        # decoded once / a view of the record
    assert np.array_equal(ids, disk_ids) and np.array_equal(offsets, disk_offsets)
    assert not any(a.flags.writeable for a in (ids, offsets, disk_ids, disk_offsets))   # shared: read-only
    assert all(np.array_equal(a, b) for a, b in zip(in_memory[index], from_disk[index]))
    assert in_memory[index][0].dtype == from_disk[index][0].dtype == np.int32
  for source in (in_memory, from_disk):                     # grain's worker processes get the same mode
    assert pickle.loads(pickle.dumps(source)).in_memory == source.in_memory
    with pytest.raises(IndexError):
      source.view(len(source))
