"""Pretraining on real text through the CLI: the default tiny run, and a run on shards prepared from
../shared/data/corpus with ALBERT's own tokenizer (`prepare` CLI -> loader -> train step -> resume)."""
import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers import REPO, assert_trees_equal, final_params, pretrain_cli as cli

BOOKS = ("gutenberg_00011_alice_in_wonderland.txt", "gutenberg_00035_time_machine.txt")
REAL_RUN = ["--config.data.kind=prepared", "--config.model.vocab_size=30000", "--config.data.max_seq_length=64",
            "--config.data.max_predictions_per_seq=10", "--config.train.global_batch_size=16",
            "--config.train.warmup_steps=10", "--config.train.learning_rate=0.01", "--config.log.every=10",
            "--config.train.eval_every=0", "--config.checkpoint.async_save=false"]


def mlm_losses(workdir):
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  return [r["mlm_loss"] for r in rows if "mlm_loss" in r]


@pytest.fixture(scope="module")
def prepared_corpus(shared_data, tmp_path_factory):
  out = tmp_path_factory.mktemp("prepared")
  inputs = ",".join(str(shared_data / "corpus" / b) for b in BOOKS)
  subprocess.run([sys.executable, "-m", "data_pipeline.prepare", f"--input={inputs}", "--format=paragraphs",
                  f"--spm_model={shared_data / 'albert_spm' / 'spiece.model'}", f"--output_dir={out}",
                  "--num_shards=4", "--workers=2"], cwd=REPO, check=True, capture_output=True, text=True)
  return out


@pytest.mark.slow
def test_loss_falls_on_real_text_and_resume_continues_the_data_exactly(prepared_corpus, tmp_path):
  steps = ["--config.train.num_train_steps=60", "--config.checkpoint.every=30", f"--config.data.path={prepared_corpus}",
           f"--config.compilation_cache_dir={tmp_path / 'compilation_cache'}"]  # one compile for the three launches
  full = cli(tmp_path / "full", *REAL_RUN, *steps, config="experiments/pretrain_tiny.py")
  assert full.returncode == 0, full.stderr
  losses = mlm_losses(tmp_path / "full")
  assert losses[-1] < losses[0] - 1.0, losses  # from ~uniform over 30k pieces towards the unigram level
  # Kill -9 once step 30 is saved, then resume: same data order, bit-identical parameters.
  victim = cli(tmp_path / "resumed", *REAL_RUN, *steps, config="experiments/pretrain_tiny.py", wait=False)
  deadline = time.time() + 600
  while not (tmp_path / "resumed" / "checkpoints" / "30" / "_CHECKPOINT_METADATA").exists():
    assert victim.poll() is None and time.time() < deadline
    time.sleep(0.05)
  victim.send_signal(signal.SIGKILL)
  victim.wait()
  resumed = cli(tmp_path / "resumed", *REAL_RUN, *steps, config="experiments/pretrain_tiny.py")
  assert resumed.returncode == 0 and "Resumed from step 30" in resumed.stdout, resumed.stderr
  assert_trees_equal(final_params(tmp_path / "full")[1], final_params(tmp_path / "resumed")[1])


@pytest.mark.slow
def test_default_tiny_run_builds_its_data_and_learns(tmp_path):
  """The README's first command, shortened: bundled corpus -> own SentencePiece model -> shards -> training."""
  result = cli(tmp_path, "--config.train.num_train_steps=40", "--config.log.every=10",
               "--config.train.eval_every=40", "--config.train.eval_batches=2", config="experiments/pretrain_tiny.py")
  assert result.returncode == 0, result.stderr
  losses = mlm_losses(tmp_path)
  assert losses[-1] < losses[0] - 0.5, losses
  assert (tmp_path / "tiny_data" / "prepared" / "manifest.json").exists()
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert np.isfinite([r["eval/mlm_loss"] for r in rows if "eval/mlm_loss" in r]).all()
