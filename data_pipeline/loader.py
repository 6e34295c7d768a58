"""The pretraining input pipeline on grain: prepared documents in, masked host batches out, checkpointable.

  documents (ArrayRecord, one split)  ->  this host's documents [process_index::process_count]
  -> shuffle(seed), a new order every epoch -> repeat forever -> read threads
  -> PretrainingBatches: instances of whole documents, shuffled `shuffle_buffer` at a time, then batched and masked
  -> worker processes (`num_workers`, each on a slice of the documents) or a prefetch thread.

Each document's instances and each instance's mask are pure functions of (seed, document index, epoch), so the
stream is the same for a seed whatever the machine; with worker processes it also depends on num_workers (grain
interleaves the workers' batches). Hosts read disjoint documents that together cover the split.
`get_state()` is a small JSON dict: where the current shuffle window began plus how far into it the iterator is,
so `set_state` rebuilds that window and continues with exactly the next example.
"""
from __future__ import annotations

import os
import random
from typing import Any, Mapping

import grain
import numpy as np
from absl import flags

from data_pipeline import records, rng
from data_pipeline.examples import BatchBuilder, ExampleConfig
from data_pipeline.instances import Document, document_instances
from data_pipeline.tokenization import Tokenizer

_TINY_DIR = os.path.join(os.path.expanduser("~"), ".cache", "albert_jax", "tiny")


class DocumentSource:
  """Random access to one split's documents, decoded; picklable for grain worker processes."""

  def __init__(self, files: list[str], dtype: np.dtype):
    self._records = grain.sources.ArrayRecordDataSource(files)
    self._dtype = np.dtype(dtype)

  def __len__(self) -> int:
    return len(self._records)

  def __getitem__(self, index: int) -> Document:
    return records.decode_document(self._records[index], self._dtype)

  @staticmethod
  def pick_other(r: random.Random, doc_index: int, count: int) -> int:
    """A random document index other than `doc_index` (10 tries, as the original)."""
    for _ in range(10):
      pick = r.randint(0, count - 1)
      if pick != doc_index:
        break
    return pick

  def other(self, r: random.Random, doc_index: int) -> Document:
    """A random other document, undecoded: its ids are a view of the record in the stored dtype, so a random B
    segment converts only the sentences it takes, not a whole book."""
    return records.document_view(self._records[self.pick_other(r, doc_index, len(self))], self._dtype)


class PretrainingBatches(grain.IterDataset):
  """(document index, epoch, document) elements -> dicts of batched, masked numpy arrays."""

  def __init__(self, parent: grain.IterDataset, documents: DocumentSource, builder: BatchBuilder,
               batch_size: int, seed: int):
    super().__init__(parent)
    self._documents, self._builder, self._batch_size, self._seed = documents, builder, batch_size, seed

  def __iter__(self) -> "_BatchIterator":
    return _BatchIterator(self._parent.__iter__(), self._documents, self._builder, self._batch_size, self._seed)


class _BatchIterator(grain.DatasetIterator):

  def __init__(self, parent, documents: DocumentSource, builder: BatchBuilder, batch_size: int, seed: int):
    super().__init__(parent)
    self._documents, self._builder, self._batch_size, self._seed = documents, builder, batch_size, seed
    self._window, self._position = [], 0
    self._window_state = self._parent.get_state()

  def _fill_window(self) -> None:
    """Instances of whole documents until there are `shuffle_buffer`, shuffled together."""
    self._window_state = self._parent.get_state()
    config = self._builder.config
    window, first = [], None
    while len(window) < config.shuffle_buffer:
      doc_index, epoch, doc = next(self._parent)
      key = rng.mix(self._seed, doc_index, config.epoch_key(epoch))
      first = key if first is None else first
      window.extend(document_instances(doc, doc_index, key, self._builder.pair_config, self._documents.other))
    random.Random(first).shuffle(window)
    self._window, self._position = window, 0

  def __next__(self) -> dict[str, np.ndarray]:
    batch = []
    while len(batch) < self._batch_size:
      if self._position == len(self._window):
        self._fill_window()
      take = min(self._batch_size - len(batch), len(self._window) - self._position)
      batch.extend(self._window[self._position:self._position + take])
      self._position += take
    return self._builder(batch)

  def get_state(self) -> dict[str, Any]:
    return {"window_start": self._window_state, "position": self._position}

  def set_state(self, state: Mapping[str, Any]) -> None:
    self._parent.set_state(state["window_start"])
    self._fill_window()
    self._position = state["position"]


def _open_split(path: str, split: str, vocab_size: int,
                spm_model: str | None = None) -> tuple[dict, DocumentSource, Tokenizer]:
  """The split's documents and tokenizer, refused unless the shards were written with `spm_model` (when given:
  the tokenizer the model is trained with) and with the manifest's own copy of the tokenizer."""
  manifest = records.read_manifest(path)
  if spm_model and Tokenizer(spm_model).sha256 != manifest["tokenizer"]["sha256"]:
    raise ValueError(f"The shards in {path} were tokenized with {os.path.join(path, manifest['tokenizer']['model'])}, "
                     f"not with data.spm_model={spm_model} (sha256 differs); prepare the data with that model "
                     "(python -m data_pipeline.prepare --spm_model=...) or point data.spm_model at the shards' one.")
  if manifest["tokenizer"]["vocab_size"] != vocab_size:
    raise ValueError(f"The data at {path!r} was tokenized with a {manifest['tokenizer']['vocab_size']}-piece "
                     f"vocabulary but the model has vocab_size={vocab_size}; set --config.model.vocab_size="
                     f"{manifest['tokenizer']['vocab_size']} or prepare the data with the model's tokenizer.")
  tokenizer = Tokenizer(os.path.join(path, manifest["tokenizer"]["model"]), manifest["tokenizer"]["do_lower_case"])
  if tokenizer.sha256 != manifest["tokenizer"]["sha256"]:
    raise ValueError(f"{tokenizer.model_path} does not match the sha256 in {path}/manifest.json; the directory was "
                     "modified after preparation. Prepare it again.")
  documents = DocumentSource(records.split_files(path, manifest, split), manifest["token_dtype"])
  return manifest, documents, tokenizer


class _WithEpoch:
  """Element i of the repeated source -> (document index, epoch, document)."""

  def __init__(self, count: int):
    self._count = count

  def __call__(self, index: int, doc: Document) -> tuple[int, int, Document]:
    return index % self._count, index // self._count, doc


def document_stream(documents: DocumentSource, seed: int, process_index: int,
                    process_count: int) -> grain.MapDataset:
  """This host's (document index, epoch, document) elements: its documents, reshuffled every epoch, forever."""
  ds = grain.MapDataset.source(documents).map_with_index(_WithEpoch(len(documents)))
  return ds[process_index::process_count].shuffle(seed=seed % 2**32).repeat(None)


def make_pretraining_dataset(data_config: Mapping[str, Any], split: str, host_batch_size: int, seed: int,
                             process_index: int, process_count: int, vocab_size: int) -> grain.IterDataset:
  """The pipeline as a grain IterDataset (see the module docstring)."""
  config = ExampleConfig.from_config(data_config)
  _, documents, tokenizer = _open_split(data_config["path"], split, vocab_size, data_config.get("spm_model"))
  if len(documents) < process_count:
    raise ValueError(f"Split {split!r} has {len(documents)} documents, fewer than the {process_count} hosts.")
  ds = document_stream(documents, seed, process_index, process_count).to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=16))
  ds = PretrainingBatches(ds, documents, BatchBuilder(tokenizer, config), host_batch_size, seed)
  workers, prefetch = int(data_config.get("num_workers", 0)), int(data_config.get("prefetch", 2))
  if workers > 0:
    if not flags.FLAGS.is_parsed():   # grain's worker processes read absl flags; outside an absl app use defaults
      flags.FLAGS.mark_as_parsed()
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=max(prefetch, 1)))
  if prefetch > 0:
    return grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=prefetch)
  return ds


def make_pretraining_iterator(data_config: Mapping[str, Any], split: str, global_batch_size: int, seed: int,
                              process_index: int | None = None, process_count: int | None = None,
                              vocab_size: int | None = None) -> grain.DatasetIterator:
  """An endless iterator of host batches (global_batch_size // process_count examples) with get_state/set_state.

  data_config: `config.data` (experiments/common.py). kind "prepared" reads `path` (data_pipeline.prepare output);
  kind "tiny" first builds the bundled tiny corpus into `path` (default ~/.cache/albert_jax/tiny).
  """
  if vocab_size is None:
    raise ValueError("make_pretraining_iterator needs vocab_size (the model's) to check it against the data.")
  if process_index is None or process_count is None:
    import jax
    process_index, process_count = jax.process_index(), jax.process_count()
  if global_batch_size % process_count:
    raise ValueError(f"global_batch_size={global_batch_size} is not divisible by the {process_count} hosts.")
  kind = data_config.get("kind", "prepared")
  if kind == "tiny":
    from data_pipeline.tiny import ensure_tiny_dataset
    data_config = {**dict(data_config), "path": ensure_tiny_dataset(data_config.get("path") or _TINY_DIR)}
  elif kind != "prepared":
    raise ValueError(f"data.kind={kind!r} is not read by data_pipeline.loader; use 'prepared' or 'tiny'.")
  ds = make_pretraining_dataset(data_config, split, global_batch_size // process_count, seed, process_index,
                                process_count, vocab_size)
  return iter(ds)

