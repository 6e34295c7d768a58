"""The prepared-data format: one ArrayRecord record per document, and the manifest that describes a preparation.

A record is `uint32 n | uint32 len_1..len_n | token ids` (ids as uint16 when the vocabulary fits, else int32):
the sentences' token ids back to back. Word boundaries are not stored; they follow from the vocabulary online.
"""
from __future__ import annotations

import json
import os

import numpy as np

MANIFEST = "manifest.json"
SPM_MODEL = "spiece.model"   # a copy of the tokenizer, next to the shards
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
  its tokens (`DocumentSource.other`)."""
  n = int(np.frombuffer(record, np.uint32, 1)[0])
  offsets = np.zeros(n + 1, np.int64)
  np.cumsum(np.frombuffer(record, np.uint32, n, offset=4), out=offsets[1:])
  return np.frombuffer(record, dtype, offset=4 + 4 * n), offsets


def decode_document(record: bytes, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
  """(token ids int32 [T], sentence start offsets int64 [n+1])."""
  ids, offsets = document_view(record, dtype)
  return ids.astype(np.int32), offsets


def shard_name(split: str, index: int, count: int) -> str:
  return f"{split}-{index:05d}-of-{count:05d}.array_record"


def read_manifest(path: str) -> dict:
  """The manifest of a finished preparation, or an error that says how to make one."""
  manifest_path = os.path.join(path, MANIFEST)
  if not path or not os.path.isfile(manifest_path):
    raise FileNotFoundError(
        f"No prepared pretraining data at {path!r} ({MANIFEST} missing). Run `python -m data_pipeline.prepare "
        f"--input=... --spm_model=... --output_dir={path or 'DIR'}` (it is resumable; an interrupted run is "
        "finished by running it again) and set --config.data.path to that directory.")
  with open(manifest_path) as f:
    manifest = json.load(f)
  if manifest.get("format_version") != FORMAT_VERSION:
    raise ValueError(f"{manifest_path} has format_version {manifest.get('format_version')}, this code reads "
                     f"{FORMAT_VERSION}; prepare the data again with this version of data_pipeline.prepare.")
  return manifest


def split_files(path: str, manifest: dict, split: str) -> list[str]:
  if split not in manifest["splits"]:
    raise ValueError(f"Split {split!r} not in the preparation at {path!r}; it has {sorted(manifest['splits'])}.")
  files = [os.path.join(path, s["file"]) for s in manifest["splits"][split]["shards"] if s["documents"]]
  if not files:
    raise ValueError(f"Split {split!r} of {path!r} has no documents; prepare with more input or, for 'eval', "
                     "a larger --eval_fraction.")
  return files
