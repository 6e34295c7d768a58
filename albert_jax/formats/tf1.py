"""The original's TF1 checkpoints (google-research/albert release tarballs, TF-Hub modules) -> (ModelConfig, params),
without TensorFlow.

A TF checkpoint is a tensor bundle: `PREFIX.index`, a leveldb-format table (sorted keys, prefix-compressed blocks,
a 48-byte footer) mapping each variable name to a `BundleEntryProto` (dtype, shape, shard, offset, size, masked
crc32c), the empty key to a `BundleHeaderProto` (shard count, byte order); and `PREFIX.data-0000i-of-0000N`, the
raw tensor bytes. `TensorBundle` reads that directly (both protos are decoded from the wire format: a few fields);
`load_tf1` maps the names with the table in docs/checkpoints.md and the architecture from `albert_config.json`
(the head count is in no weight shape: the xlarge v2 tarball's 32 heads come from there alone). A checkpoint of
ELECTRA's (google-research/electra) is read by `tf1_electra`.
"""
from __future__ import annotations

import glob
import json
import os
import re
import struct
from typing import Any

from absl import logging
import flax.linen as nn
from flax import traverse_util
import google_crc32c
import ml_dtypes
import numpy as np

from albert_jax import model as model_lib
from albert_jax import storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.formats import Format, tf1_electra
from albert_jax.formats.names import TF1_ALBERT, name_map
from albert_jax.model_config import ModelConfig
from albert_jax.weights import store

CONFIG_FILE = "albert_config.json"
_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48
# tensorflow/core/framework/types.proto DataType values with a fixed-size numpy equivalent.
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 9: np.int64,
           10: np.bool_, 14: ml_dtypes.bfloat16, 17: np.uint16, 19: np.float16, 22: np.uint32, 23: np.uint64}
# TF1 `modeling.AlbertConfig` defaults (REFERENCE b.1); its `gelu` is the tanh approximation (our gelu_new).
_TF1_DEFAULTS = {"embedding_size": 128, "hidden_size": 4096, "num_hidden_layers": 12, "num_hidden_groups": 1,
                 "num_attention_heads": 64, "intermediate_size": 16384, "inner_group_num": 1, "hidden_act": "gelu",
                 "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "max_position_embeddings": 512,
                 "type_vocab_size": 2, "initializer_range": 0.02}
_TF1_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu"}
_HEADS = ("predictions", "sop_classifier")
# Saved alongside the weights by training, never part of the model.
_NOT_WEIGHTS = re.compile(r"(^|/)(global_step|adam_[mv]|Adam(_1)?|AdamWeightDecayOptimizer\w*|LAMB\w*)(/|$)")
HUB_PREFIX = "module/"

Path = tuple[str, ...]


# ----------------------------------------------------------------------------------------------- wire format

def _varint(data: bytes, pos: int) -> tuple[int, int]:
  result = shift = 0
  while True:
    byte = data[pos]
    result |= (byte & 0x7F) << shift
    pos += 1
    if byte < 0x80:
      return result, pos
    shift += 7


def _proto_fields(data: bytes) -> list[tuple[int, Any]]:
  """(field number, value) of a serialized protobuf message: ints for varint/fixed fields, bytes otherwise."""
  fields, pos = [], 0
  while pos < len(data):
    key, pos = _varint(data, pos)
    number, wire = key >> 3, key & 7
    if wire == 0:
      value, pos = _varint(data, pos)
    elif wire == 1:
      value, pos = struct.unpack_from("<Q", data, pos)[0], pos + 8
    elif wire == 2:
      size, pos = _varint(data, pos)
      value, pos = data[pos:pos + size], pos + size
    elif wire == 5:
      value, pos = struct.unpack_from("<I", data, pos)[0], pos + 4
    else:
      raise InputError(f"Unsupported protobuf wire type {wire} (field {number}): not a tensor bundle index.")
    fields.append((number, value))
  return fields


def _masked_crc32c(data: bytes) -> int:
  """leveldb/TF store crc32c rotated and offset ("masked"), so a crc of data holding crcs stays well distributed."""
  crc = google_crc32c.value(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ------------------------------------------------------------------------------------------------ the table

def _read_block(f, handle: tuple[int, int], where: str) -> bytes:
  """One table block; its 5-byte trailer is the compression type and the masked crc32c of block + type."""
  offset, size = handle
  f.seek(offset)
  raw = f.read(size + 5)
  if len(raw) != size + 5:
    raise InputError(f"{where} is truncated (a block at byte {offset} ends past the file); copy it again.")
  block, kind, crc = raw[:size], raw[size], struct.unpack("<I", raw[size + 1:])[0]
  if _masked_crc32c(raw[:size + 1]) != crc:
    raise InputError(f"{where} is corrupt (crc mismatch in the block at byte {offset}); copy it again.")
  if kind != 0:
    raise InputError(f"{where} has a compressed block (type {kind}); TensorFlow writes bundle indexes "
                     "uncompressed, so this is not a TF checkpoint index.")
  return block


def _block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
  """Key/value pairs of a block: each key shares a prefix with the previous one; restart offsets end the block."""
  num_restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
  end, pos, key, out = len(block) - 4 - 4 * num_restarts, 0, b"", []
  while pos < end:
    shared, pos = _varint(block, pos)
    unshared, pos = _varint(block, pos)
    value_size, pos = _varint(block, pos)
    key = key[:shared] + block[pos:pos + unshared]
    pos += unshared
    out.append((key, block[pos:pos + value_size]))
    pos += value_size
  return out


def _read_table(path: str) -> dict[bytes, bytes]:
  """Every key/value of a leveldb-format table file (footer -> index block -> data blocks)."""
  with open(path, "rb") as f:
    f.seek(0, os.SEEK_END)
    length = f.tell()
    if length < _FOOTER_SIZE:
      raise InputError(f"{path} is too short to be a checkpoint index.")
    f.seek(length - _FOOTER_SIZE)
    footer = f.read(_FOOTER_SIZE)
    if struct.unpack("<Q", footer[-8:])[0] != _TABLE_MAGIC:
      raise InputError(f"{path} is not a TensorFlow checkpoint index (no table magic number); point to the "
                       "`.index` of a TF checkpoint (name-based V2 format).")
    pos = _varint(footer, _varint(footer, 0)[1])[1]  # skip the metaindex handle
    index_offset, pos = _varint(footer, pos)
    index_size, _ = _varint(footer, pos)
    table = {}
    for _, handle in _block_entries(_read_block(f, (index_offset, index_size), path)):
      offset, pos = _varint(handle, 0)
      table.update(_block_entries(_read_block(f, (offset, _varint(handle, pos)[0]), path)))
  return table


# ------------------------------------------------------------------------------------------------ the bundle

class TensorBundle:
  """The tensors of one TF checkpoint (`PREFIX.index` + `PREFIX.data-*`), read lazily by name."""

  def __init__(self, prefix: str):
    self.prefix = prefix
    table = _read_table(prefix + ".index")
    header = dict(_proto_fields(table.pop(b"", b"")))
    self.num_shards = header.get(1, 1)
    if header.get(2, 0) not in (0, 1):
      raise InputError(f"{prefix}.index has an unknown byte order {header[2]}.")
    self.byte_order = ">" if header.get(2, 0) == 1 else "<"
    self.entries = {key.decode(): self._entry(key.decode(), value) for key, value in table.items()}

  def _entry(self, name: str, value: bytes) -> dict[str, Any]:
    fields = _proto_fields(value)
    one = dict(fields)
    if any(number == 7 for number, _ in fields):
      raise InputError(f"{self.prefix}: variable {name} is partitioned (saved in slices); re-save it whole "
                       "(e.g. from a TF1 session without a partitioner) to convert it.")
    dims = [dict(_proto_fields(d)).get(1, 0) for n, d in _proto_fields(one.get(2, b"")) if n == 2]
    return {"dtype": one.get(1, 0), "shape": tuple(dims), "shard": one.get(3, 0), "offset": one.get(4, 0),
            "size": one.get(5, 0), "crc32c": one.get(6)}

  def read(self, name: str) -> np.ndarray:
    """The tensor `name`, checked against its crc32c, in native byte order."""
    entry = self.entries[name]
    if entry["dtype"] not in _DTYPES:
      raise InputError(f"{self.prefix}: variable {name} has TF dtype {entry['dtype']}, which has no fixed-size "
                       "numpy equivalent (strings, resources); it is not a weight.")
    path = f"{self.prefix}.data-{entry['shard']:05d}-of-{self.num_shards:05d}"
    with open(path, "rb") as f:
      f.seek(entry["offset"])
      data = f.read(entry["size"])
    if len(data) != entry["size"] or (entry["crc32c"] is not None and _masked_crc32c(data) != entry["crc32c"]):
      raise InputError(f"{path}: the bytes of variable {name} are truncated or corrupt (size/crc32c mismatch); "
                       "copy the checkpoint again.")
    dtype = np.dtype(_DTYPES[entry["dtype"]]).newbyteorder(self.byte_order)
    return np.frombuffer(data, dtype).reshape(entry["shape"]).astype(dtype.newbyteorder("="))


# ------------------------------------------------------------------------------------------------ ALBERT

def find_checkpoint(src: str) -> str:
  """The checkpoint prefix in `src`: a prefix itself, the `checkpoint` file's latest, a SavedModel / TF-Hub
  module's `variables/variables`, or the one `*.index` in the directory."""
  if os.path.isfile(src + ".index"):
    return src
  if not os.path.isdir(src):
    raise MissingFileError(f"--src={src} is neither a directory nor a checkpoint prefix (PREFIX.index).")
  state = os.path.join(src, "checkpoint")
  if os.path.isfile(state):
    with open(state) as f:
      match = re.search(r'^model_checkpoint_path:\s*"(.*)"', f.read(), re.MULTILINE)
    if match:  # the path may be absolute from the machine that wrote it
      for prefix in (os.path.join(src, match.group(1)), os.path.join(src, os.path.basename(match.group(1)))):
        if os.path.isfile(prefix + ".index"):
          return prefix
  hub = os.path.join(src, "variables", "variables")
  if os.path.isfile(hub + ".index"):
    return hub
  found = sorted(glob.glob(os.path.join(src, "*.index")))
  if len(found) == 1:
    return found[0][:-len(".index")]
  if not found:
    raise MissingFileError(f"No TF checkpoint in {src}: expected PREFIX.index + PREFIX.data-* files (e.g. "
                           "model.ckpt-best.*) or variables/variables.* (a TF-Hub module).")
  raise InputError(f"{src} holds several checkpoints {[os.path.basename(p) for p in found]}; pass the one to "
                   "convert as --src=DIR/PREFIX.")


def holds_checkpoint(path: str) -> bool:
  """Whether the local `path` is a checkpoint prefix, or a folder holding one (`find_checkpoint`)."""
  if not (os.path.isfile(path + ".index") or os.path.isdir(path)):
    return False
  try:
    find_checkpoint(path)
  except MissingFileError:
    return False
  return True


def _find_config(src: str, prefix: str) -> str:
  base = src if os.path.isdir(src) else os.path.dirname(prefix)
  for candidate in (os.path.join(base, CONFIG_FILE), os.path.join(base, "assets", CONFIG_FILE),
                    os.path.join(os.path.dirname(prefix), CONFIG_FILE)):
    if os.path.isfile(candidate):
      return candidate
  raise MissingFileError(f"No {CONFIG_FILE} in {base}: a TF1 checkpoint's architecture (head count included, "
                         f"which no weight shape shows) is in the {CONFIG_FILE} of the same release tarball; "
                         "copy it next to the checkpoint.")


def config_from_tf1(values: dict[str, Any]) -> ModelConfig:
  """ModelConfig from the original's albert_config.json (missing keys take `modeling.AlbertConfig` defaults)."""
  if "vocab_size" not in values:
    raise InputError(f"{CONFIG_FILE} has no vocab_size (the original requires it).")
  v = {**_TF1_DEFAULTS, **values}
  if v.get("net_structure_type", 0) != 0:
    raise InputError(f"{CONFIG_FILE} has net_structure_type={v['net_structure_type']}; only the released "
                     "architecture (0) is implemented.")
  if v["hidden_act"] not in _TF1_ACTIVATIONS:
    raise InputError(f"{CONFIG_FILE} has hidden_act={v['hidden_act']!r}; supported: {sorted(_TF1_ACTIVATIONS)}.")
  fields = {k: v[k] for k in ("vocab_size", *_TF1_DEFAULTS)}
  fields["hidden_act"] = _TF1_ACTIVATIONS[v["hidden_act"]]
  # TF1 adds the E->H projection only when E != H (our default rule); its LayerNorm epsilon is fixed at 1e-12.
  return ModelConfig(**fields, layer_norm_eps=1e-12, sharing="all")


def load_tf1(src: str) -> tuple[ModelConfig, dict[str, Any]]:
  """Reads a TF1 ALBERT checkpoint (release tarball dir, TF-Hub module dir, or prefix) + albert_config.json.

  Returns float32 numpy params with the heads the checkpoint has ({"albert"} always; "predictions" and
  "sop_classifier" when present). A TF-Hub `module/` name prefix is removed; optimizer slots and global_step are
  skipped; other variables (fine-tuning heads) are skipped with a warning.
  """
  prefix = find_checkpoint(src)
  with open(_find_config(src, prefix)) as f:
    c = config_from_tf1(json.load(f))
  bundle = TensorBundle(prefix)
  names = {(n[len(HUB_PREFIX):] if n.startswith(HUB_PREFIX) else n): n for n in bundle.entries
           if not _NOT_WEIGHTS.search(n)}
  shapes = {p: tuple(x.shape) for p, x in
            traverse_util.flatten_dict(nn.unbox(model_lib.abstract_params(model_lib.AlbertForPreTraining(c)))).items()}
  heads = {h for h in _HEADS if any(ours[0] == h and tf in names for ours, tf, _ in name_map(TF1_ALBERT, c))}
  params = {}
  for ours, tf, transpose in name_map(TF1_ALBERT, c):
    if ours[0] != "albert" and ours[0] not in heads:
      continue
    if tf not in names:
      raise InputError(f"{prefix}: variable {tf} (ours {'/'.join(ours)}) is missing; the checkpoint does not hold "
                       f"the model that {CONFIG_FILE} describes (check num_hidden_groups, inner_group_num, and "
                       "embedding_size vs hidden_size).")
    value = bundle.read(names.pop(tf))
    value = value.T if transpose else value
    if value.shape != shapes[ours]:
      raise InputError(f"{prefix}: variable {tf} (ours {'/'.join(ours)}) has shape {list(value.shape)}, but "
                       f"{CONFIG_FILE} predicts {list(shapes[ours])}; use the config from the same release.")
    params[ours] = np.ascontiguousarray(value, dtype=np.float32)
  ours_left = sorted(n for n in names if n.startswith(("bert/", "cls/predictions/", "cls/seq_relationship/")))
  if ours_left:
    raise InputError(f"{prefix}: variables {ours_left} have no place in the model that {CONFIG_FILE} describes "
                     f"(num_hidden_groups={c.num_hidden_groups}, inner_group_num={c.inner_group_num}).")
  if names:
    logging.warning("load_tf1(%s): skipping variables albert_jax has no module for: %s", prefix, sorted(names))
  return c, traverse_util.unflatten_dict(params)


def from_tf1(src: str, dst: str, clear=lambda: None) -> str:
  """Converts the TF1 checkpoint `src` into our pretrained-weights folder `dst`; returns what was written."""
  if storage.is_remote(src):
    raise InputError(f"--src={src}: the TF1 reader reads local files; copy the release folder with "
                     "`gcloud storage cp -r` first (--dst may be gs://).")
  prefix = find_checkpoint(src)
  bundle = TensorBundle(prefix)
  variables = {name: entry["shape"] for name, entry in bundle.entries.items() if not _NOT_WEIGHTS.search(name)}
  if tf1_electra.holds_electra(set(variables)):
    towers = tf1_electra.load(variables, bundle.read, prefix)
    clear()
    return tf1_electra.save(towers, src, dst)
  model_config, params = load_tf1(src)
  clear()
  store.save_pretrained(dst, model_config, params)
  return ", ".join(sorted(params))


FORMAT = Format("tf1", "a TF1 checkpoint + albert_config.json, as in the original's release tarballs and TF-Hub "
                "modules, or google-research/electra's released folders (both towers), read without TensorFlow",
                read=from_tf1, recognises=holds_checkpoint)
