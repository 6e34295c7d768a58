"""The tiny pretraining dataset for CPU runs: the bundled public-domain corpus, its own 4000-piece tokenizer (a
SentencePiece model, or a byte-level BPE or WordPiece vocabulary: `data.tiny_tokenizer`; trained in seconds) and
prepared shards, built once into a directory and reused after."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Mapping

from data_pipeline import records, train_spm
from data_pipeline.prepare import PrepareConfig, prepare
from data_pipeline.sources import Source

from albert_jax.errors import InputError

ASSETS = Path(__file__).resolve().parent / "assets"
VOCAB_SIZE = 4000
DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "albert_jax", "tiny")
# The tokenizer of each kind (`train_spm.MODEL_TYPES`, `data.tiny_tokenizer`) and the folder prepared with it.
TOKENIZERS = {"unigram": ("tiny_spm.model", "prepared"), "bpe": ("tiny_bpe/vocab.json", "prepared_bpe"),
              "wordpiece": ("tiny_wordpiece/vocab.txt", "prepared_wordpiece")}


def tokenizer_kind(data_config: Mapping[str, Any]) -> str:
  """The kind of tokenizer `data.tiny_tokenizer` names; "unigram" for a config without it (a run from before it)."""
  return data_config.get("tiny_tokenizer", "unigram")


def prepared_dir(directory: str, model_type: str = "unigram") -> str:
  """Where the bundled corpus prepared with a `model_type` tokenizer is kept under `directory`."""
  if model_type not in TOKENIZERS:
    raise InputError(f"data.tiny_tokenizer={model_type!r}; choose one of {', '.join(TOKENIZERS)}.")
  return os.path.join(directory, TOKENIZERS[model_type][1])


def ensure_tiny_dataset(directory: str | None = None, model_type: str = "unigram") -> str:
  """Build (or reuse) the tiny dataset under `directory` (default: DEFAULT_DIR), tokenized by a `model_type`
  tokenizer trained on it; returns the prepared path for `config.data.path`."""
  directory = os.path.abspath(os.path.expanduser(directory or DEFAULT_DIR))
  if os.path.isfile(os.path.join(directory, records.MANIFEST)):
    raise InputError(f"data.path={directory} holds prepared data ({records.MANIFEST}), but data.kind=tiny builds the "
                     "bundled corpus into data.path: pass --config.data.kind=prepared to train on your data.")
  prepared = prepared_dir(directory, model_type)
  if os.path.isfile(os.path.join(prepared, records.MANIFEST)):
    return prepared
  print(f"Building the bundled tiny dataset in {directory} (first use: a {model_type} tokenizer, then shards)...",
        file=sys.stderr, flush=True)
  corpus = ",".join(sorted(str(p) for p in ASSETS.glob("*.txt")))
  model = os.path.join(directory, TOKENIZERS[model_type][0])
  if not os.path.isfile(model):
    train_spm.train(Source(corpus, format="paragraphs"), model if model_type == "unigram" else os.path.dirname(model),
                    vocab_size=VOCAB_SIZE, model_type=model_type)
  prepare(PrepareConfig(input=corpus, format="paragraphs", spm_model=model, output_dir=prepared, num_shards=4,
                        eval_fraction=0.05, workers=1))
  return prepared
