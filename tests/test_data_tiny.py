"""The bundled tiny dataset (CPU default run): built from the package's own assets, quickly, once."""
import json
import os

import numpy as np
import pytest

from data_pipeline import tiny
from data_pipeline.loader import make_pretraining_iterator


def test_tiny_dataset_builds_once_and_loads(tmp_path):
  path = tiny.ensure_tiny_dataset(str(tmp_path))
  manifest = json.loads(open(os.path.join(path, "manifest.json")).read())
  assert manifest["tokenizer"]["vocab_size"] == tiny.VOCAB_SIZE == 4000
  assert manifest["splits"]["train"]["documents"] > 50 and manifest["splits"]["eval"]["documents"] > 0
  assert manifest["input_files"] == len(list(tiny.ASSETS.glob("*.txt"))) == 5
  stamp = os.stat(os.path.join(path, "manifest.json")).st_mtime_ns
  assert tiny.ensure_tiny_dataset(str(tmp_path)) == path
  assert os.stat(os.path.join(path, "manifest.json")).st_mtime_ns == stamp          # reused, not rebuilt
  config = {"kind": "tiny", "path": str(tmp_path), "max_seq_length": 128, "max_predictions_per_seq": 20,
            "num_workers": 0, "prefetch": 0}
  for split in ("train", "eval"):
    batch = next(make_pretraining_iterator(config, split, 32, 0, 0, 1, vocab_size=4000))
    assert batch["input_ids"].shape == (32, 128) and batch["input_ids"].max() < 4000
    assert np.all(batch["masked_lm_weights"].sum(1) >= 1)


def test_a_data_path_holding_prepared_data_is_refused_not_built_into(tmp_path):
  """`pretrain_tiny.py --config.data.path=MY_DATA` on a folder of prepared data is refused: the bundled corpus is not
  built into it."""
  (tmp_path / "manifest.json").write_text("{}")
  with pytest.raises(ValueError, match=f"^data.path={tmp_path} holds prepared data .*--config.data.kind=prepared"):
    tiny.ensure_tiny_dataset(str(tmp_path))
  assert os.listdir(tmp_path) == ["manifest.json"]
