"""The prepared-data format: one ArrayRecord record per document, and the manifest that describes a preparation.

A record is `uint32 n | uint32 len_1..len_n | token ids` (ids as uint16 when the vocabulary fits, else int32):
the sentences' token ids back to back. Word boundaries are not stored; they follow from the vocabulary online.
"""
from __future__ import annotations

import json
import os
import struct
import urllib.parse

import numpy as np

from albert_jax import storage
from albert_jax.errors import InputError, MissingFileError

MANIFEST = "manifest.json"
SPM_MODEL = "spiece.model"   # a copy of the tokenizer, next to the shards: a SentencePiece model's name
# The names of the copies of the other kinds: a WordPiece vocabulary, a tokenizer.json, a byte-level BPE pair.
WORDPIECE_VOCAB, TOKENIZER_JSON, BPE_FILES = "vocab.txt", "tokenizer.json", ("vocab.json", "merges.txt")
TOKENIZER_COPIES = (SPM_MODEL, WORDPIECE_VOCAB, TOKENIZER_JSON) + BPE_FILES
FORMAT_VERSION = 1


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)


def encode_document(sentences: list[list[int]], dtype: np.dtype) -> bytes:
  lengths = np.array([len(s) for s in sentences], np.uint32)
  ids = np.concatenate([np.asarray(s, dtype) for s in sentences]) if sentences else np.zeros(0, dtype)
  return np.uint32(len(sentences)).tobytes() + lengths.tobytes() + ids.tobytes()


def document_view(record: bytes, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
  """(token ids as stored [T], a read-only view of `record`; sentence start offsets int64 [n+1]).

  Only the n+1 offsets are computed, so taking a few sentences of a book-length document does not convert all of
  its tokens (`DocumentSource.view`)."""
  (n,) = struct.unpack_from("=I", record)
  offsets = np.frombuffer(record, np.uint32, n + 1).astype(np.int64)   # n, then the sentence lengths
  offsets[0] = 0
  return np.frombuffer(record, dtype, offset=4 + 4 * n), offsets.cumsum()   # (a cumsum that casts costs 3x)


def tokenizer_copy_names(files: list[str]) -> list[str]:
  """The names the copies of a tokenizer's files take beside the shards (the names transformers looks for)."""
  if len(files) == 2:
    return list(BPE_FILES)
  return [WORDPIECE_VOCAB if files[0].endswith(".txt") else TOKENIZER_JSON if files[0].endswith(".json")
          else SPM_MODEL]


def shard_name(split: str, index: int, count: int) -> str:
  return f"{split}-{index:05d}-of-{count:05d}.array_record"


def read_manifest(path: str) -> dict:
  """The manifest of a finished preparation, or an error that says how to make one."""
  manifest_path = os.path.join(path, MANIFEST)
  if not path or not storage.path(manifest_path).is_file():
    raise MissingFileError(
        f"No prepared pretraining data at {path!r} ({MANIFEST} missing). Run `python -m data_pipeline.prepare "
        f"--input=... --spm_model=... --output_dir={path or 'DIR'}` (it is resumable; an interrupted run is "
        "finished by running it again) and set --config.data.path to that directory.")
  manifest = json.loads(storage.path(manifest_path).read_text())
  if manifest.get("format_version") != FORMAT_VERSION:
    raise InputError(f"{manifest_path} has format_version {manifest.get('format_version')}, this code reads "
                     f"{FORMAT_VERSION}; prepare the data again with this version of data_pipeline.prepare.")
  return manifest


def split_files(path: str, manifest: dict, split: str) -> list[str]:
  """The split's shard paths: local files, which is all that ArrayRecord's reader opens (its C++ file layer has
  no Cloud Storage support), so a gs:// preparation is read through a gcsfuse mount."""
  if storage.is_remote(path):
    bucket, prefix = urllib.parse.urlparse(path).netloc, urllib.parse.urlparse(path).path.strip("/")
    raise InputError(f"data.path={path}: ArrayRecord shards are read from local files only (array_record has no "
                     f"Cloud Storage reader). Mount the bucket with gcsfuse and point data.path at the mount: "
                     f"`gcsfuse --implicit-dirs -o ro --file-cache-max-size-mb=-1 "
                     f"--file-cache-cache-file-for-range-read=true --cache-dir=/tmp/gcsfuse_cache {bucket} "
                     f"/mnt/{bucket}` then --config.data.path=/mnt/{bucket}/{prefix} (or copy it to local disk with "
                     f"`gcloud storage cp -r {path} DIR`).")
  if split not in manifest["splits"]:
    raise InputError(f"Split {split!r} not in the preparation at {path!r}; it has {sorted(manifest['splits'])}.")
  files = [os.path.join(path, s["file"]) for s in manifest["splits"][split]["shards"] if s["documents"]]
  if not files:
    raise InputError(f"Split {split!r} of {path!r} has no documents; prepare with more input or, for 'eval', "
                     "a larger --eval_fraction.")
  return files
