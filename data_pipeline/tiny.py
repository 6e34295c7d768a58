"""The tiny pretraining dataset for CPU runs: the bundled public-domain corpus, its own 4000-piece SentencePiece
model (trained in seconds) and prepared shards, built once into a directory and reused after."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from data_pipeline import records, train_spm
from data_pipeline.prepare import PrepareConfig, prepare
from data_pipeline.sources import Source

from albert_jax.errors import InputError

ASSETS = Path(__file__).resolve().parent / "assets"
VOCAB_SIZE = 4000
DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "albert_jax", "tiny")
PREPARED = "prepared"  # the folder, inside the one it is built in, of the corpus's preparation


def ensure_tiny_dataset(directory: str | None = None) -> str:
  """Build (or reuse) the tiny dataset under `directory` (default: DEFAULT_DIR); returns the prepared path for
  `config.data.path`."""
  directory = os.path.abspath(os.path.expanduser(directory or DEFAULT_DIR))
  if os.path.isfile(os.path.join(directory, records.MANIFEST)):
    raise InputError(f"data.path={directory} holds prepared data ({records.MANIFEST}), but data.kind=tiny builds the "
                     "bundled corpus into data.path: pass --config.data.kind=prepared to train on your data.")
  prepared = os.path.join(directory, PREPARED)
  if os.path.isfile(os.path.join(prepared, records.MANIFEST)):
    return prepared
  print(f"Building the bundled tiny dataset in {directory} (first use: a SentencePiece model, then shards)...",
        file=sys.stderr, flush=True)
  corpus = ",".join(sorted(str(p) for p in ASSETS.glob("*.txt")))
  model = os.path.join(directory, "tiny_spm.model")
  if not os.path.isfile(model):
    train_spm.train(Source(corpus, format="paragraphs"), model, vocab_size=VOCAB_SIZE)
  prepare(PrepareConfig(input=corpus, format="paragraphs", spm_model=model, output_dir=prepared, num_shards=4,
                        eval_fraction=0.05, workers=1))
  return prepared
