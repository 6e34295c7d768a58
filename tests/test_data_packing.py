"""data.packing=full_sentences (RoBERTa's FULL-SENTENCES): a hand-packed corpus, every token of an epoch once,
sequences across documents, exact resume, the same global batches for any host count, a saved position that
resumes on another host count (a run's too, where segment pairs' is refused), today's batch layout."""
import json
import pathlib

import numpy as np
import pytest

from albert_jax import data_states, engine, pretrain
from albert_jax.cli import experiment_config
from albert_jax.errors import InputError
from albert_jax.run import Run
from data_pipeline import records, rng, tiny
from data_pipeline.examples import ExampleConfig
from data_pipeline.loader import DocumentSource, document_stream, make_pretraining_iterator
from data_pipeline.packing import FullSentences

SEP, CLS = 3, 2


def _doc(*sentences):
  return (np.concatenate([np.asarray(s, np.int32) for s in sentences]),
          np.concatenate([[0], np.cumsum([len(s) for s in sentences])]).astype(np.int64))


class Documents:
  """In-memory documents, read as `DocumentStream` reads a DocumentSource."""

  def __init__(self, docs):
    self.docs = docs

  def __len__(self):
    return len(self.docs)

  def view(self, index):
    return self.docs[index]


# Seed 0 visits documents 0, 2, 1 in epoch 0 and 1, 2, 0 in epoch 1 (asserted below): A, B, C, then C, B, A.
A, C = _doc([10, 11, 12], [13, 14]), _doc([40, 41], [42, 43, 44])
B = _doc(list(range(20, 30)), [30])                     # a 10-token sentence: longer than a sequence of 8
HAND = Documents([A, C, B])
# max_tokens 8 ([CLS] + 8 + [SEP] = max_seq_length 10), by hand: a sentence that does not fit closes the
# sequence; B's first sentence is cut; C follows B after a [SEP]; an epoch's last sequence stops at its end.
EPOCH_0 = [[10, 11, 12, 13, 14], list(range(20, 28)), [28, 29, 30, SEP, 40, 41], [42, 43, 44]]
EPOCH_1 = [[40, 41, 42, 43, 44], list(range(20, 28)), [28, 29, 30, SEP, 10, 11, 12], [13, 14]]


def _packed(documents, seed=0, max_tokens=8, sl=None):
  ds = FullSentences(document_stream(documents, seed, 0, 1), seed, max_tokens, SEP)
  if sl is not None:
    ds.set_slice(sl)
  return iter(ds)


def test_a_hand_packed_corpus():
  assert [i for i, _ in document_stream(HAND, 0, 0, 1).order(range(6))] == [0, 2, 1, 1, 2, 0]
  it = _packed(HAND)
  got = [next(it) for _ in range(len(EPOCH_0) + len(EPOCH_1) + 1)]
  assert [x.a.tolist() for x in got] == EPOCH_0 + EPOCH_1 + [EPOCH_0[0]]   # epoch 2 has epoch 0's order again
  assert all(x.a.dtype == np.int32 and x.b is None and x.label == 0 for x in got)
  assert [x.key for x in got[:5]] == [rng.mix(0, 0, n) for n in range(4)] + [rng.mix(0, 1, 0)]


def test_resume_from_every_position_and_worker_strides():
  it, stream, states = _packed(HAND), [], []
  for _ in range(12):
    states.append(json.loads(json.dumps(it.get_state())))
    stream.append(next(it).a.tolist())
  for k in range(5):             # at the start, a document, mid-sentence, mid-document, the next epoch
    restored = _packed(HAND)
    restored.set_state(states[k])
    assert [next(restored).a.tolist() for _ in range(4)] == stream[k:k + 4], k
  odd = _packed(HAND, sl=slice(1, None, 2))          # grain's worker 1 of 2
  assert [next(odd).a.tolist() for _ in range(5)] == stream[1:11:2]


def _config(path, **overrides):
  return {"kind": "prepared", "path": path, "max_seq_length": 128, "max_predictions_per_seq": 0, "ngram": 1,
          "sentence_task": "none", "packing": "full_sentences", "num_workers": 0, "prefetch": 0,
          "shuffle_buffer": 16, **overrides}


def _unmasked(batch):
  ids = batch["input_ids"].copy()
  rows = np.nonzero(batch["masked_lm_weights"])[0]
  ids[rows, batch["masked_lm_positions"][batch["masked_lm_weights"] > 0]] = batch["masked_lm_ids"][
      batch["masked_lm_weights"] > 0]
  return ids


def test_every_token_of_an_epoch_is_in_exactly_one_sequence_and_sequences_cross_documents(tiny_prepared):
  """With no shuffle window (shuffle_buffer=1) the rows are the packed sequences in order: unmasked, without
  [CLS], the closing [SEP] and padding, and with the [SEP]s between documents left out, epoch 0's rows are the
  split's documents in epoch 0's order, token for token."""
  manifest = records.read_manifest(tiny_prepared)
  docs = DocumentSource(records.split_files(tiny_prepared, manifest, "train"), manifest["token_dtype"])
  order = [i for i, _ in document_stream(docs, 7, 0, 1).order(range(len(docs)))]
  expected = np.concatenate([docs[i][0] for i in order])
  it = make_pretraining_iterator(_config(tiny_prepared, shuffle_buffer=1), "train", 32, 7, 0, 1,
                                 vocab_size=tiny.VOCAB_SIZE)
  sequences, tokens = [], 0
  while tokens < len(expected):
    batch = next(it)
    for row, length in zip(_unmasked(batch), batch["attention_mask"].sum(1)):
      assert row[0] == CLS and row[length - 1] == SEP and not row[length:].any()
      if tokens < len(expected):                       # the rest of the last batch is epoch 1's
        sequences.append(row[1:length - 1])
        tokens += int((sequences[-1] != SEP).sum())
  assert tokens == len(expected)
  assert np.array_equal(np.concatenate([s[s != SEP] for s in sequences]), expected)
  # each [SEP] inside a sequence stands where one document of the epoch's order ends and the next begins
  boundaries = set(np.cumsum([len(docs[i][0]) for i in order])[:-1].tolist())
  separators, before = [], 0
  for s in sequences:
    separators += (before + np.flatnonzero(s == SEP) - np.arange((s == SEP).sum())).tolist()
    before += int((s != SEP).sum())
  assert set(separators) <= boundaries and len(set(separators)) == len(separators) > len(docs) // 2
  lengths = np.array([len(s) for s in sequences])
  assert lengths.max() == 126 and np.mean(lengths) > 100                        # filled, a sequence at most S-2


def test_batches_have_the_layout_of_segment_pair_batches(tiny_prepared):
  packed = next(make_pretraining_iterator(_config(tiny_prepared), "train", 8, 0, 0, 1, vocab_size=tiny.VOCAB_SIZE))
  pairs = next(make_pretraining_iterator(_config(tiny_prepared, packing="segment_pairs", sentence_task="sop"),
                                         "train", 8, 0, 0, 1, vocab_size=tiny.VOCAB_SIZE))
  assert {k: (v.shape, v.dtype) for k, v in packed.items()} == {k: (v.shape, v.dtype) for k, v in pairs.items()}
  assert not packed["token_type_ids"].any() and not packed["sentence_order_label"].any()
  length = packed["attention_mask"].sum(1)
  assert np.array_equal(packed["attention_mask"], (np.arange(128) < length[:, None]).astype(np.int32))
  # 15% of each row's tokens ([CLS] and [SEP]s counted, as the budget does), none of them [CLS] or a [SEP]
  assert np.array_equal(packed["masked_lm_weights"].sum(1), np.maximum(1, np.round(0.15 * length)))
  assert not np.isin(packed["masked_lm_ids"][packed["masked_lm_weights"] > 0], [CLS, SEP]).any()


def _hosts(config, count, seed=3):
  """The iterators of `count` simulated hosts of one run (global batch 8)."""
  return [make_pretraining_iterator(config, "train", 8, seed, h, count, vocab_size=tiny.VOCAB_SIZE)
          for h in range(count)]


def _global_batch(hosts):
  halves = [next(h) for h in hosts]
  return {key: np.concatenate([h[key] for h in halves]) for key in halves[0]}


def test_a_position_saved_on_two_hosts_resumes_exactly_on_one_host_or_four(tiny_prepared):
  """The saved position is a place in the one global stream: two hosts save the same state, the one a single
  uninterrupted host has there, and restored on one host or on four it continues with that host's next global
  batches, every field exactly (the hosts' rows concatenated). Behind a prefetch thread, as a training run reads."""
  config = _config(tiny_prepared, prefetch=2)
  (straight,), two = _hosts(config, 1), _hosts(config, 2)
  for _ in range(5):
    batch, rows = next(straight), _global_batch(two)
    assert all(np.array_equal(batch[key], rows[key]) for key in batch)
  states = [json.loads(json.dumps(h.get_state())) for h in two]   # as a checkpoint writes them
  assert states[0] == states[1] == straight.get_state()
  expected = [next(straight) for _ in range(20)]             # 160 sequences: across 10 shuffle windows
  for count in (1, 4):
    resumed = _hosts(config, count)
    for host in resumed:
      host.set_state(states[0])
    for step, batch in enumerate(expected):
      again = _global_batch(resumed)
      for key in batch:
        assert batch[key].dtype == again[key].dtype and np.array_equal(batch[key], again[key]), (count, step, key)


def _run_config(path, *overrides):
  """RoBERTa's tiny recipe (full_sentences) reading the prepared tiny corpus at `path`."""
  recipe = pathlib.Path(__file__).resolve().parents[1] / "experiments/pretrain_roberta.py"
  return experiment_config(["main", f"--config={recipe}:size=tiny", f"--config.data.path={path}", *overrides])


def _resume_on_one_process(config, position, tmp_path):
  """A fresh run's batches, put by the loop at `position` as saved by both processes of a 2-process run."""
  batches = pretrain.pretraining_batches(config, "train", engine.BatchSplit(8, 8, 1, 1, 1, 0), Run(str(tmp_path)))
  data_states.resume_position(batches, data_states.DataStates(2, {0: position, 1: position}), "Step 3 in ckpt",
                              config.get("resume_with_changes", False))
  return batches


@pytest.mark.parametrize("kind", ["prepared", "tiny"])
def test_a_run_resumes_a_full_sentences_position_on_another_process_count(tiny_prepared, kind, tmp_path, capsys):
  """The position that two processes saved (the same, as the test above shows) continues a run on one process with
  the batches of a run never interrupted."""
  # data.kind=tiny takes the folder the bundled corpus is prepared in (found built, here)
  path = tiny_prepared if kind == "prepared" else pathlib.Path(tiny_prepared).parent
  config = _run_config(path, f"--config.data.kind={kind}")
  straight = pretrain.pretraining_batches(config, "train", engine.BatchSplit(8, 8, 1, 1, 1, 0), Run(str(tmp_path)))
  assert straight.position_is_global
  for _ in range(3):
    next(straight)
  resumed = _resume_on_one_process(config, json.loads(json.dumps(straight.get_state())), tmp_path)
  assert ("Step 3 in ckpt was written by 2 processes and this run has 1; the data position is the same on every "
          "process, so the run continues exactly.") in capsys.readouterr().out
  for _ in range(2):
    batch, again = next(straight), next(resumed)
    assert all(np.array_equal(batch[key], again[key]) for key in batch)


def test_a_segment_pairs_position_is_still_refused_on_another_process_count(tiny_prepared, tmp_path):
  config = _run_config(tiny_prepared, "--config.data.kind=prepared", "--config.data.packing=segment_pairs",
                       "--config.data.sentence_task=sop")
  position = pretrain.pretraining_batches(config, "train", engine.BatchSplit(8, 8, 1, 1, 1, 0), Run(str(tmp_path)))
  assert not position.position_is_global
  with pytest.raises(InputError) as error:
    _resume_on_one_process(config, position.get_state(), tmp_path)
  assert str(error.value) == (
      "Step 3 in ckpt was written by 2 processes and this run has 1: the data loader keeps a position per process, "
      "which means nothing on another process count. Resume with 2 processes, or pass "
      "--config.resume_with_changes=True to continue the model from there with the data read from its start.")


@pytest.mark.parametrize("fields, message", [
    ({"packing": "full"}, "data.packing='full'; choose one of ('segment_pairs', 'full_sentences')."),
    ({"packing": "full_sentences", "sentence_task": "sop"},
     "data.sentence_task='sop'; set --config.data.sentence_task=none (or use data.packing=segment_pairs)."),
    ({"packing": "full_sentences", "sentence_task": "none", "masking": "static"},
     "set --config.data.masking=dynamic (or use data.packing=segment_pairs).")])
def test_settings_that_full_sentences_cannot_build_are_refused_in_one_line(fields, message):
  with pytest.raises(ValueError) as error:
    ExampleConfig(**fields)
  assert message in str(error.value) and "\n" not in str(error.value)


def test_a_position_saved_with_the_other_packing_is_refused(tiny_prepared):
  pairs = make_pretraining_iterator(_config(tiny_prepared, packing="segment_pairs"), "train", 8, 0, 0, 1,
                                    vocab_size=tiny.VOCAB_SIZE)
  packed = make_pretraining_iterator(_config(tiny_prepared), "train", 8, 0, 0, 1, vocab_size=tiny.VOCAB_SIZE)
  with pytest.raises(ValueError, match=r"is not one of this data.packing's \(those hold \['document', 'sentence', "
                                       r"'sequence', 'token'\]\); resume with the data settings the run was trained"):
    packed.set_state(pairs.get_state())
  with pytest.raises(ValueError, match=r"\(those hold \['next_index'\]\)"):
    pairs.set_state(packed.get_state())


@pytest.mark.parametrize("kind", ["prepared", "tiny"])
def test_resume_with_changes_to_the_other_packing_reads_the_data_from_its_start(tiny_prepared, kind, tmp_path,
                                                                                 capsys):
  """The refusal of a resume with another data.packing offers --config.resume_with_changes=True: with it the saved
  position, which the loader cannot take, is left behind (said) rather than refused a second time."""
  path = tiny_prepared if kind == "prepared" else pathlib.Path(tiny_prepared).parent
  split = engine.BatchSplit(8, 8, 1, 1, 1, 0)
  pairs = pretrain.pretraining_batches(
      _run_config(path, f"--config.data.kind={kind}", "--config.data.packing=segment_pairs",
                  "--config.data.sentence_task=sop"), "train", split, str(tmp_path))
  next(pairs)
  saved = json.loads(json.dumps(pairs.get_state()))
  with pytest.raises(InputError, match="is not one of this data.packing's"):
    pretrain.pretraining_batches(_run_config(path, f"--config.data.kind={kind}"), "train", split,
                                 str(tmp_path)).set_state(saved)
  packed = _run_config(path, f"--config.data.kind={kind}", "--config.resume_with_changes=True")
  resumed = pretrain.pretraining_batches(packed, "train", split, str(tmp_path))
  resumed.set_state(saved)
  assert capsys.readouterr().out == ("The saved data position belongs to other data settings (data.packing); reading "
                                     "the data from its start (resume_with_changes).\n")
  fresh = pretrain.pretraining_batches(packed, "train", split, str(tmp_path))
  batch, again = next(fresh), next(resumed)
  assert all(np.array_equal(batch[key], again[key]) for key in batch)
