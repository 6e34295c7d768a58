"""The pretraining input pipeline on grain: prepared documents in, masked host batches out, checkpointable.

  documents (ArrayRecord, one split)  ->  DocumentStream: this host's documents [process_index::process_count],
  a new shuffled order every epoch, forever, read a block at a time
  -> PretrainingBatches: instances of whole documents, shuffled `shuffle_buffer` at a time, then batched and masked
  -> worker processes (`num_workers`, each on a slice of the documents) or a prefetch thread.

Each document's instances and each instance's mask are pure functions of (seed, document index, epoch), so the
stream is the same for a seed whatever the machine; with worker processes it also depends on num_workers (grain
interleaves the workers' batches). Hosts read disjoint documents that together cover the split.
`get_state()` is a small JSON dict: where the current shuffle window began plus how far into it the iterator is,
so `set_state` rebuilds that window and continues with exactly the next example.

`data.packing=full_sentences` (data_pipeline.packing) replaces the first two steps: every host reads every
document in one global order per epoch and packs the same sequences; the global batches are shuffled and cut as
above and each host builds and masks its own rows of them, so the global batches do not depend on the host count,
and neither does the saved position (`position_is_global`): it resumes exactly on another host count.
"""
from __future__ import annotations

import bisect
import collections
import functools
import itertools
import os
import random
from typing import Any, Callable, Mapping, Sequence

import grain
import numpy as np
from array_record.python.array_record_module import ArrayRecordReader

from data_pipeline import records, rng, shuffle
from data_pipeline.examples import BatchBuilder, ExampleConfig
from data_pipeline.instances import Document, Instance, document_instances
from data_pipeline.packing import FullSentences
from data_pipeline.tokenization import Tokenizer
from data_pipeline.wordpiece import load_tokenizer

from albert_jax.errors import InputError

class DocumentSource:
  """Random access to one split's documents: one ArrayRecord reader per shard, called directly (grain's
  ArrayRecordDataSource adds ~4 us of Python to a ~25 us record read). A split of at most `in_memory_bytes` (an
  eval split, a small corpus) is read once, whole, and served from memory: its documents come round again every
  few hundred steps, and a read costs more than building a short document's examples. Picklable for grain worker
  processes, which open their own readers."""

  IN_MEMORY_BYTES = 64 << 20

  def __init__(self, files: list[str], dtype: np.dtype, in_memory_bytes: int = IN_MEMORY_BYTES):
    self._files, self._dtype, self._in_memory_bytes = list(files), np.dtype(dtype), in_memory_bytes
    self._readers = [ArrayRecordReader(f, options="readahead_buffer_size:0", file_reader_buffer_size=32768)
                     for f in self._files]     # random access, opened as grain's ArrayRecordDataSource opens them
    self._starts = list(itertools.accumulate((r.num_records() for r in self._readers), initial=0))
    self._in_memory: list[Document] | None = None     # decoded once, to the int32 that examples are built from
    if sum(os.path.getsize(f) for f in self._files) <= in_memory_bytes:
      self._in_memory = [self._view(record, np.int32) for reader in self._readers for record in reader.read_all()]

  @property
  def in_memory(self) -> bool:
    return self._in_memory is not None

  def __getstate__(self) -> dict[str, Any]:
    return {"files": self._files, "dtype": self._dtype, "in_memory_bytes": self._in_memory_bytes}

  def __setstate__(self, state: Mapping[str, Any]) -> None:
    self.__init__(state["files"], state["dtype"], state["in_memory_bytes"])

  def __len__(self) -> int:
    return self._starts[-1]

  def _view(self, record: bytes, dtype: np.dtype | None = None) -> Document:
    ids, offsets = records.document_view(record, self._dtype)
    if dtype is not None:
      ids = ids.astype(dtype)
    ids.flags.writeable = offsets.flags.writeable = False    # shared by every reader of the document
    return ids, offsets

  def __getitem__(self, index: int) -> Document:
    ids, offsets = self.view(index)
    return ids.astype(np.int32, copy=False), offsets

  def view(self, index: int) -> Document:
    """The document, read-only. From disk its ids are a view of the record in the stored dtype, so an instance
    converts only the tokens it takes (and a random B segment only its sentences, not a whole book); an in-memory
    split holds them as int32."""
    if not 0 <= index < self._starts[-1]:
      raise IndexError(f"document {index} of {self._starts[-1]}")
    if self._in_memory is not None:
      return self._in_memory[index]
    shard = bisect.bisect_right(self._starts, index) - 1
    return self._view(self._readers[shard].read([index - self._starts[shard]])[0])

  @staticmethod
  def pick_other(r: random.Random, doc_index: int, count: int) -> int:
    """A random document index other than `doc_index` (10 tries, as the original)."""
    for _ in range(10):
      pick = r.randint(0, count - 1)
      if pick != doc_index:
        break
    return pick

  def other(self, r: random.Random, doc_index: int) -> Document:
    """A random other document, as a `view`."""
    return self.view(self.pick_other(r, doc_index, len(self)))


class DocumentStream(grain.IterDataset):
  """This host's (document index, epoch, document) elements: its documents, reshuffled every epoch, forever.

  The order is that of grain's `MapDataset.source(documents)[process_index::process_count].shuffle(seed)
  .repeat(None)`, which this loader was built on (its checkpoints resume exactly), without grain's per-element
  path: an index shuffle, statistics and a handoff to a read thread cost ~250 us of CPU per document, ~5 times
  the record read. Here the order is computed an epoch at a time (`shuffle.permutation`) and documents are read
  in blocks, back to back, in the consuming thread (a read between two documents' example building finds colder
  caches and costs more). Element k is stream position start + k * step: grain's worker processes each take a
  stride (`set_slice`), as they did of the map dataset.
  """

  def __init__(self, documents: DocumentSource, seed: int, process_index: int, process_count: int):
    super().__init__()
    self.documents, self._seed, self._hosts = documents, seed % 2**32, (process_index, process_count)
    self._count = len(range(process_index, len(documents), process_count))
    self._slice = 0, 1
    self._orders: dict[int, np.ndarray] = {}

  def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
    """Keeps positions sl.start, sl.start + sl.step, ... of this stream (grain's `mp_prefetch` workers)."""
    if sequential_slice:
      raise InputError("DocumentStream takes strided slices only (mp_prefetch with sequential_slice=False).")
    start, step = self._slice
    self._slice = start + sl.start * step, step * sl.step

  def order(self, positions: Sequence[int]) -> list[tuple[int, int]]:
    """(document index, epoch) of the elements at `positions`."""
    start, step = self._slice
    epochs, within = np.divmod(start + step * np.asarray(positions, np.int64), self._count)
    shuffled = np.empty_like(within)
    for epoch in np.unique(epochs).tolist():
      if epoch not in self._orders:            # iterators move forward: keep the previous epoch's order only
        self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1}
        self._orders[epoch] = shuffle.permutation(self._count, self._seed + epoch)
      rows = epochs == epoch
      shuffled[rows] = self._orders[epoch][within[rows]]
    process_index, process_count = self._hosts
    return list(zip((process_index + process_count * shuffled).tolist(), epochs.tolist()))

  def __getitem__(self, position: int) -> tuple[int, int, Document]:
    ((index, epoch),) = self.order([position])
    return index, epoch, self.documents.view(index)

  def __iter__(self) -> "_DocumentIterator":
    return _DocumentIterator(self)


class _DocumentIterator(grain.DatasetIterator):
  """Orders and reads `_BLOCK` elements at a time; the state is that of grain's PrefetchDatasetIterator, which this
  replaces: the number of elements returned."""

  _BLOCK = 64

  def __init__(self, stream: DocumentStream):
    super().__init__()
    self._stream, self._next, self._ahead = stream, 0, collections.deque()

  def __next__(self) -> tuple[int, int, Document]:
    if not self._ahead:
      view = self._stream.documents.view
      self._ahead.extend((i, e, view(i)) for i, e in self._stream.order(range(self._next, self._next + self._BLOCK)))
    self._next += 1
    return self._ahead.popleft()

  def get_state(self) -> dict[str, Any]:
    return {"next_index": self._next}

  def set_state(self, state: Mapping[str, Any]) -> None:
    self._next = state["next_index"]
    self._ahead.clear()


def document_pairs(documents: DocumentSource, builder: BatchBuilder, seed: int,
                   element: tuple[int, int, Document]) -> tuple[int, list[Instance]]:
  """A document's segment-pair instances and the key that shuffles a window beginning with them."""
  doc_index, epoch, doc = element
  key = rng.mix(seed, doc_index, builder.config.epoch_key(epoch))
  return key, document_instances(doc, doc_index, key, builder.pair_config, documents.other)


def packed_sequence(instance: Instance) -> tuple[int, list[Instance]]:
  """A packed sequence (data_pipeline.packing) as its own instance, its key shuffling a window beginning with it."""
  return instance.key, [instance]


class PretrainingBatches(grain.IterDataset):
  """Elements -> dicts of batched, masked numpy arrays. `instances_of(element)` gives (window key, instances);
  instances are shuffled `shuffle_buffer` at a time and taken `batch_size` at a time, of which `rows` are built
  and masked (a host's share of a global batch, or all of it)."""

  def __init__(self, parent: grain.IterDataset, instances_of: Callable[[Any], tuple[int, list[Instance]]],
               builder: BatchBuilder, batch_size: int, rows: slice = slice(None)):
    super().__init__(parent)
    self._instances_of, self._builder, self._batch_size, self._rows = instances_of, builder, batch_size, rows

  def __iter__(self) -> "_BatchIterator":
    return _BatchIterator(self._parent.__iter__(), self._instances_of, self._builder, self._batch_size, self._rows)


class _BatchIterator(grain.DatasetIterator):

  def __init__(self, parent, instances_of, builder: BatchBuilder, batch_size: int, rows: slice):
    super().__init__(parent)
    self._instances_of, self._builder, self._batch_size, self._rows = instances_of, builder, batch_size, rows
    self._window, self._position = [], 0
    self._window_state = self._parent.get_state()

  def _fill_window(self) -> None:
    """Instances of whole elements until there are `shuffle_buffer`, shuffled together."""
    self._window_state = self._parent.get_state()
    window, first = [], None
    while len(window) < self._builder.config.shuffle_buffer:
      key, instances = self._instances_of(next(self._parent))
      first = key if first is None else first
      window.extend(instances)
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
    return self._builder(batch[self._rows])

  def get_state(self) -> dict[str, Any]:
    return {"window_start": self._window_state, "position": self._position}

  def set_state(self, state: Mapping[str, Any]) -> None:
    if set(state["window_start"]) != set(self._window_state):
      raise InputError(f"The saved data position {dict(state['window_start'])} is not one of this data.packing's "
                       f"(those hold {sorted(self._window_state)}); resume with the data settings the run was "
                       "trained with, or train in a new --workdir.")
    self._parent.set_state(state["window_start"])
    self._fill_window()
    self._position = state["position"]


def check_preparation(path: str, vocab_size: int, spm_model: str | None = None) -> dict:
  """The manifest of the preparation at `path`, refused unless it was tokenized for a model of `vocab_size` pieces
  and, when given, with `spm_model` (the tokenizer the model is trained with)."""
  manifest = records.read_manifest(path)
  if spm_model and load_tokenizer(spm_model).sha256 != manifest["tokenizer"]["sha256"]:
    raise InputError(f"The shards in {path} were tokenized with {os.path.join(path, manifest['tokenizer']['model'])}, "
                     f"not with data.spm_model={spm_model} (sha256 differs); prepare the data with that model "
                     "(python -m data_pipeline.prepare --spm_model=...) or point data.spm_model at the shards' one.")
  if manifest["tokenizer"]["vocab_size"] != vocab_size:
    raise InputError(f"The data at {path!r} was tokenized with a {manifest['tokenizer']['vocab_size']}-piece "
                     f"vocabulary but the model has vocab_size={vocab_size}; set --config.model.vocab_size="
                     f"{manifest['tokenizer']['vocab_size']} or prepare the data with the model's tokenizer.")
  return manifest


def _open_split(path: str, split: str, vocab_size: int, spm_model: str | None = None,
                in_memory_bytes: int = DocumentSource.IN_MEMORY_BYTES) -> tuple[dict, DocumentSource, Tokenizer]:
  """The split's documents and tokenizer, refused unless the shards fit the model (`check_preparation`) and were
  written with the manifest's own copy of the tokenizer."""
  manifest = check_preparation(path, vocab_size, spm_model)
  tokenizer = load_tokenizer(os.path.join(path, manifest["tokenizer"]["model"]),
                             manifest["tokenizer"]["do_lower_case"])
  if tokenizer.sha256 != manifest["tokenizer"]["sha256"]:
    raise InputError(f"{tokenizer.model_path} does not match the sha256 in {path}/manifest.json; the directory was "
                     "modified after preparation. Prepare it again.")
  documents = DocumentSource(records.split_files(path, manifest, split), manifest["token_dtype"], in_memory_bytes)
  return manifest, documents, tokenizer


def document_stream(documents: DocumentSource, seed: int, process_index: int, process_count: int) -> DocumentStream:
  """This host's (document index, epoch, document) elements: its documents, reshuffled every epoch, forever."""
  return DocumentStream(documents, seed, process_index, process_count)


def make_pretraining_dataset(data_config: Mapping[str, Any], split: str, host_batch_size: int, seed: int,
                             process_index: int, process_count: int, vocab_size: int,
                             in_memory_bytes: int = DocumentSource.IN_MEMORY_BYTES) -> grain.IterDataset:
  """The pipeline as a grain IterDataset (see the module docstring)."""
  config = ExampleConfig.from_config(data_config)
  _, documents, tokenizer = _open_split(data_config["path"], split, vocab_size, data_config.get("spm_model"),
                                        in_memory_bytes)
  builder = BatchBuilder(tokenizer, config)
  if config.packing == "full_sentences":   # one global stream: every host packs it, and builds its own rows
    ds = FullSentences(document_stream(documents, seed, 0, 1), seed, config.max_seq_length - 2, tokenizer.sep_id)
    ds = PretrainingBatches(ds, packed_sequence, builder, host_batch_size * process_count,
                            slice(process_index * host_batch_size, (process_index + 1) * host_batch_size))
  else:
    if len(documents) < process_count:
      raise InputError(f"Split {split!r} has {len(documents)} documents, fewer than the {process_count} hosts.")
    ds = document_stream(documents, seed, process_index, process_count)
    ds = PretrainingBatches(ds, functools.partial(document_pairs, documents, builder, seed), builder, host_batch_size)
  workers, prefetch = int(data_config.get("num_workers", 0)), int(data_config.get("prefetch", 2))
  if workers > 0:
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=max(prefetch, 1)))
  if prefetch > 0:
    return grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=prefetch)
  return ds


def position_is_global(data_config: Mapping[str, Any]) -> bool:
  """Whether the iterator's saved position is the same on every host, so that it continues exactly on another host
  count: with full_sentences every host reads the one global stream and its state is a place in it (the packing
  cursor of a shuffle window, and how far into the window); with segment pairs each host reads its own share of the
  documents, and its state is a place in that share."""
  return ExampleConfig.from_config(data_config).packing == "full_sentences"


def make_pretraining_iterator(data_config: Mapping[str, Any], split: str, global_batch_size: int, seed: int,
                              process_index: int | None = None, process_count: int | None = None,
                              vocab_size: int | None = None,
                              in_memory_bytes: int = DocumentSource.IN_MEMORY_BYTES) -> grain.DatasetIterator:
  """An endless iterator of host batches (global_batch_size // process_count examples) with get_state/set_state.

  data_config: `config.data` (experiments/common.py). kind "prepared" reads `path` (data_pipeline.prepare output);
  kind "tiny" first builds the bundled tiny corpus into `path` (default ~/.cache/albert_jax/tiny), tokenized by the
  `tiny_tokenizer` kind (default "unigram").
  in_memory_bytes: a split whose shards are at most this big is read whole into memory (0: always from disk).
  """
  if vocab_size is None:
    raise InputError("make_pretraining_iterator needs vocab_size (the model's) to check it against the data.")
  if process_index is None or process_count is None:
    import jax
    process_index, process_count = jax.process_index(), jax.process_count()
  if global_batch_size % process_count:
    raise InputError(f"global_batch_size={global_batch_size} is not divisible by the {process_count} hosts.")
  kind = data_config.get("kind", "prepared")
  if kind == "tiny":
    from data_pipeline.tiny import ensure_tiny_dataset, tokenizer_kind
    built = ensure_tiny_dataset(data_config.get("path"), tokenizer_kind(data_config))
    data_config = {**dict(data_config), "path": built}
  elif kind != "prepared":
    raise InputError(f"data.kind={kind!r} is not read by data_pipeline.loader; use 'prepared' or 'tiny'.")
  ds = make_pretraining_dataset(data_config, split, global_batch_size // process_count, seed, process_index,
                                process_count, vocab_size, in_memory_bytes)
  return iter(ds)

