"""The grain loader on prepared real text: determinism, resumption, host sharding, epochs, errors."""
import hashlib
import itertools
import json
import random

import numpy as np
import pytest

from data_pipeline import records, tiny
from data_pipeline.loader import DocumentSource, document_stream, make_pretraining_iterator
from data_pipeline.prepare import PrepareConfig, prepare

pytestmark = pytest.mark.shared_data
BOOKS = "gutenberg_00011_alice_in_wonderland.txt,gutenberg_00035_time_machine.txt,gutenberg_01952_yellow_wallpaper.txt"


@pytest.fixture(scope="module")
def prepared(shared_data, tmp_path_factory):
  out = tmp_path_factory.mktemp("prepared")
  files = ",".join(str(shared_data / "corpus" / b) for b in BOOKS.split(","))
  prepare(PrepareConfig(input=files, format="paragraphs", spm_model=str(shared_data / "albert_spm" / "spiece.model"),
                        output_dir=str(out), num_shards=3, eval_fraction=0.1))
  return str(out)


def _config(path, **overrides):
  return {"kind": "prepared", "path": path, "max_seq_length": 128, "max_predictions_per_seq": 20,
          "num_workers": 0, "prefetch": 2, "shuffle_buffer": 256, **overrides}


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def _equal(xs, ys):
  return all(np.array_equal(x[k], y[k]) for x, y in zip(xs, ys) for k in x)


def test_batches_have_static_shapes_and_valid_content(prepared):
  batch = next(make_pretraining_iterator(_config(prepared), "train", 16, 0, 0, 2, vocab_size=30000))
  assert {k: (v.shape, v.dtype.name) for k, v in batch.items()} == {
      "input_ids": ((8, 128), "int32"), "attention_mask": ((8, 128), "int32"), "token_type_ids": ((8, 128), "int32"),
      "masked_lm_positions": ((8, 20), "int32"), "masked_lm_ids": ((8, 20), "int32"),
      "masked_lm_weights": ((8, 20), "float32"), "sentence_order_label": ((8,), "int32")}
  assert np.all(batch["input_ids"][:, 0] == 2) and np.all((batch["input_ids"] == 3).sum(1) == 2)


def test_same_seed_same_batches_and_other_seed_differs(prepared):
  a = _take(make_pretraining_iterator(_config(prepared), "train", 8, 1, 0, 1, vocab_size=30000), 4)
  b = _take(make_pretraining_iterator(_config(prepared), "train", 8, 1, 0, 1, vocab_size=30000), 4)
  c = _take(make_pretraining_iterator(_config(prepared), "train", 8, 2, 0, 1, vocab_size=30000), 4)
  assert _equal(a, b) and not _equal(a, c)
  e1 = _take(make_pretraining_iterator(_config(prepared), "eval", 8, 1, 0, 1, vocab_size=30000), 2)
  e2 = _take(make_pretraining_iterator(_config(prepared), "eval", 8, 1, 0, 1, vocab_size=30000), 2)
  assert _equal(e1, e2)


@pytest.mark.parametrize("workers", [0, 2])
def test_restored_iterator_continues_with_the_next_example(prepared, workers):
  config = _config(prepared, num_workers=workers)
  it = make_pretraining_iterator(config, "train", 8, 3, 0, 1, vocab_size=30000)
  _take(it, 5)
  state = json.loads(json.dumps(it.get_state()))
  expected = _take(it, 40)                        # crosses shuffle windows
  restored = make_pretraining_iterator(config, "train", 8, 3, 0, 1, vocab_size=30000)
  restored.set_state(state)
  assert _equal(expected, _take(restored, 40))
  if workers:
    it.close()
    restored.close()


def test_hosts_read_disjoint_documents_that_cover_the_split(prepared):
  manifest = records.read_manifest(prepared)
  docs = DocumentSource(records.split_files(prepared, manifest, "train"), manifest["token_dtype"])
  per_host = []
  for host in range(3):
    stream = document_stream(docs, 0, host, 3)
    size = len(range(host, len(docs), 3))
    epoch0 = [stream[i][:2] for i in range(size)]
    assert all(epoch == 0 for _, epoch in epoch0)
    assert all(epoch == 1 for _, epoch in (stream[i][:2] for i in range(size, 2 * size)))
    per_host.append({index for index, _ in epoch0})
  assert sum(map(len, per_host)) == len(docs) and set().union(*per_host) == set(range(len(docs)))
  stream = document_stream(docs, 0, 0, 1)
  first, second = [stream[i][0] for i in range(len(docs))], [stream[i][0] for i in range(len(docs), 2 * len(docs))]
  assert sorted(first) == sorted(second) and first != second     # every epoch, a new order


def test_static_masking_repeats_examples_and_dynamic_does_not(prepared):
  def distinct(masking):
    it = make_pretraining_iterator(_config(prepared, masking=masking, dupe_factor=1, shuffle_buffer=16), "eval", 8, 0,
                                   0, 1, vocab_size=30000)
    seen = [b["input_ids"][i].tobytes() for b in _take(it, 60) for i in range(8)]
    return len(set(seen)) / len(seen)
  assert distinct("static") < 0.4 < 0.95 < distinct("dynamic")


def test_reads_the_experiment_config(prepared):
  from experiments import common
  config = common.pretraining_config("base").data
  config.path, config.max_seq_length, config.max_predictions_per_seq = prepared, 128, 0
  batch = next(make_pretraining_iterator(config, "eval", 4, 0, 0, 1, vocab_size=30000))
  assert batch["masked_lm_positions"].shape == (4, 19)


def test_clear_errors(prepared, tmp_path):
  with pytest.raises(FileNotFoundError, match="python -m data_pipeline.prepare"):
    make_pretraining_iterator(_config(str(tmp_path)), "train", 8, 0, 0, 1, vocab_size=30000)
  with pytest.raises(ValueError, match="vocab_size=4000"):
    make_pretraining_iterator(_config(prepared), "train", 8, 0, 0, 1, vocab_size=4000)
  with pytest.raises(ValueError, match="not divisible"):
    make_pretraining_iterator(_config(prepared), "train", 9, 0, 0, 2, vocab_size=30000)
  with pytest.raises(ValueError, match="Split 'test'"):
    make_pretraining_iterator(_config(prepared), "test", 8, 0, 0, 1, vocab_size=30000)


# sha256[:16] of 300 / 300 / 100 / 100 batches of 8 from the tiny corpus, taken from the loader before random B
# segments stopped decoding whole documents: the lazy read must not change a single example.
TINY_FINGERPRINTS = {(128, "document", "sop", 300): "cd29fff334f25249", (128, "chunk", "sop", 300): "44c3a4740ab7225a",
                     (512, "document", "nsp", 100): "c1249c89bc75b139", (512, "chunk", "sop", 100): "c76398530f41e0ee"}


def test_random_b_segments_read_only_their_sentences_and_batches_are_unchanged(tiny_prepared):
  manifest = records.read_manifest(tiny_prepared)
  docs = DocumentSource(records.split_files(tiny_prepared, manifest, "train"), manifest["token_dtype"],
                        in_memory_bytes=0)
  ids, offsets = docs.other(random.Random(0), 0)
  assert ids.dtype == np.uint16 and not ids.flags.owndata          # a view of the record, not a decoded copy
  for ((seq, scope, task, count), expected), in_memory_bytes in itertools.product(
      TINY_FINGERPRINTS.items(), (0, DocumentSource.IN_MEMORY_BYTES)):   # read from disk, and held in memory
    config = {"kind": "prepared", "path": tiny_prepared, "max_seq_length": seq, "max_predictions_per_seq": 20,
              "short_seq_scope": scope, "sentence_task": task, "num_workers": 0, "prefetch": 0, "shuffle_buffer": 64}
    iterator = make_pretraining_iterator(config, "train", 8, 5, 0, 1, vocab_size=tiny.VOCAB_SIZE,
                                         in_memory_bytes=in_memory_bytes)
    digest = hashlib.sha256()
    for _ in range(count):
      batch = next(iterator)
      for key in sorted(batch):
        digest.update(key.encode() + batch[key].dtype.str.encode() + batch[key].tobytes())
    assert digest.hexdigest()[:16] == expected, (seq, scope, task)
