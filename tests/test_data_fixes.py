"""Data preparation bugs, each test failing without its fix: a rerun rewriting manifest.json (and so refusing a
resume), single-word masking (data.ngram=1) crashing and ngram < 1 accepted, a SentencePiece sample differing
between processes, a file named twice by --input read twice, and storage errors shown as tracebacks."""
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from albert_jax import storage
from data_pipeline import cli, masking, rng, train_spm
from data_pipeline.examples import ExampleConfig
from data_pipeline.prepare import PrepareConfig, main as prepare_main, prepare
from data_pipeline.sources import Source
from tests import albert_reference
from tests.data_fixtures import albert_tokenizer, unmasked_batches
from tests.test_data_cli import TEXT, _error as refused
from tests.test_gcs import gcs  # noqa: F401  the GCS server fixture
from tests.test_train import REPO, cli as pretrain_cli, logged, prepared_run

ALICE = REPO / "data_pipeline" / "assets" / "gutenberg_00011_alice_in_wonderland.txt"


def _spm(shared_data):
  return str(shared_data / "albert_spm" / "spiece.model")


def _files(folder: Path) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ------------------------------------------------------------------------------------- manifest.json and resume

@pytest.mark.shared_data
def test_a_rerun_or_another_worker_count_writes_the_same_manifest_and_shards(shared_data, tmp_path, capsys):
  book = shared_data / "corpus" / "gutenberg_00041_legend_of_sleepy_hollow.txt"
  flags = [f"--input={book}", "--format=paragraphs", f"--spm_model={_spm(shared_data)}", "--num_shards=3",
           "--eval_fraction=0.2"]
  prepare_main([*flags, f"--output_dir={tmp_path / 'one'}"])
  assert "seconds" in json.loads(capsys.readouterr().out)   # the time taken is told, not recorded
  first = _files(tmp_path / "one")
  assert "seconds" not in json.loads(first["manifest.json"])
  prepare_main([*flags, f"--output_dir={tmp_path / 'one'}"])   # the same command again: nothing to do
  assert _files(tmp_path / "one") == first
  prepare_main([*flags, f"--output_dir={tmp_path / 'two'}", "--workers=2"])
  assert _files(tmp_path / "two") == first


def _prepare(text: Path, output_dir: Path, spm_model: str) -> None:
  result = subprocess.run([sys.executable, "-m", "data_pipeline.prepare", f"--input={text}", "--format=paragraphs",
                           f"--spm_model={spm_model}", f"--output_dir={output_dir}"], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
  assert result.returncode == 0, result.stderr


@pytest.mark.slow
@pytest.mark.shared_data
def test_pretraining_resumes_after_the_same_preparation_is_run_again(shared_data, tmp_path):
  """The rerun used to record a new time in manifest.json, whose sha256 the checkpoint holds: resume was refused."""
  text = tmp_path / "book.txt"
  text.write_text((shared_data / "corpus" / "gutenberg_01952_yellow_wallpaper.txt").read_text()[:60_000])
  data = tmp_path / "prepared"
  run = [*prepared_run(data), "--config.train.eval_every=0", "--config.checkpoint.every=2"]
  tiny = "experiments/pretrain_tiny.py"
  _prepare(text, data, _spm(shared_data))
  first = pretrain_cli(tmp_path / "run", *run, "--config.train.num_train_steps=2", config=tiny)
  assert first.returncode == 0, first.stderr
  _prepare(text, data, _spm(shared_data))
  resumed = pretrain_cli(tmp_path / "run", *run, "--config.train.num_train_steps=3", config=tiny)
  assert resumed.returncode == 0, resumed.stderr
  assert logged(tmp_path / "run").keys() == {1, 2, 3}


# ------------------------------------------------------------------------------------------- data.ngram

class _OurWordOrder(random.Random):
  """The original's `rng`, its shuffle of the words replaced by the order the masker draws for `key`: the two
  algorithms then visit the same words in the same order."""

  def __init__(self, key: np.uint64):
    super().__init__(0)
    self.key = key

  def shuffle(self, words: list) -> None:
    z = rng.bits(np.array([self.key], np.uint64), 1, len(words))   # the masker's stream for its word order
    words[:] = [words[i] for i in masking.word_order(z, np.array([len(words)]))[0]]


@pytest.mark.shared_data
@pytest.mark.parametrize("seq,max_predictions", [(128, 20), (512, 0)])
def test_single_word_masking_is_the_originals_given_the_same_word_order(shared_data, seq, max_predictions):
  tokenizer = albert_tokenizer(shared_data)
  batch, _ = unmasked_batches(shared_data, seq, 100)
  table = masking.start_piece_table([tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)])
  masker = masking.Masker(table, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, seq, max_predictions,
                          ngram=1)
  for ids, mask, key in zip(batch["input_ids"], batch["attention_mask"], batch["keys"]):
    masked, spans = masker.select(ids[None], mask[None], key[None])   # one example: its own width, as the original
    _, positions, _, accepted = albert_reference.create_masked_lm_predictions(
        ids[:mask.sum()].tolist(), 0.15, max_predictions or 10**9, tokenizer.vocab_size, _OurWordOrder(key),
        np.random.default_rng(0), table, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, ngram=1)
    assert np.nonzero(masked[0])[0].tolist() == positions
    assert set(accepted) == {1} and sorted(spans[spans > 0].tolist()) == accepted


@pytest.mark.parametrize("ngram", [0, -1])
def test_ngram_below_one_is_refused_naming_the_setting(ngram):
  with pytest.raises(ValueError, match=rf"^data\.ngram={ngram} must be at least 1 .*--config\.data\.ngram"):
    ExampleConfig(ngram=ngram)


# ------------------------------------------------------------------------------------ SentencePiece sampling

def test_train_spm_samples_the_same_sentences_in_every_process(tmp_path):
  models = []
  for name in ("a", "b"):
    model = tmp_path / f"{name}.model"
    result = subprocess.run([sys.executable, "-m", "data_pipeline.train_spm", f"--input={ALICE}",
                             "--format=paragraphs", f"--output={model}", "--vocab_size=500",
                             "--input_sentence_size=400", "--num_threads=1"], capture_output=True, text=True,
                            cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    models.append(model.read_bytes())
  assert models[0] == models[1]


def test_train_spm_trains_on_exactly_the_seeded_sample(tmp_path, monkeypatch):
  fed = []

  def trainer(sentence_iterator, model_writer, **flags):
    fed.append(list(sentence_iterator))
    model_writer.write(b"model")

  monkeypatch.setattr(spm.SentencePieceTrainer, "train", trainer)
  source = Source(str(ALICE), format="paragraphs")
  corpus = list(train_spm.sentences(source))
  train_spm.train(source, str(tmp_path / "m.model"), input_sentence_size=400, seed=3)
  assert len(fed[-1]) == 400 and set(fed[-1]) <= set(corpus)
  assert fed[-1] == train_spm.sample(iter(corpus), 400, 3) != train_spm.sample(iter(corpus), 400, 4)
  train_spm.train(source, str(tmp_path / "m.model"), input_sentence_size=len(corpus))
  assert fed[-1] == corpus   # not over the cap: every sentence, in order, as before sampling was ours


# -------------------------------------------------------------------------------------- a file named twice

@pytest.mark.shared_data
def test_a_file_named_by_several_paths_or_globs_is_read_once(shared_data, tmp_path, capsys):
  (tmp_path / "a.txt").write_text(TEXT)
  (tmp_path / "b.txt").write_text(TEXT.replace("Document", "Page"))
  (tmp_path / "link.txt").symlink_to(tmp_path / "b.txt")
  spec = f"{tmp_path}/a.txt,{tmp_path}/*.txt,{tmp_path}/./a.txt"
  assert Source(spec).files() == [f"{tmp_path}/a.txt", f"{tmp_path}/b.txt"]
  manifest = prepare(PrepareConfig(input=spec, spm_model=_spm(shared_data), output_dir=str(tmp_path / "out"),
                                   eval_fraction=0.2))
  assert manifest["input_files"] == 2 and manifest["totals"]["documents"] == 40
  assert ("data_pipeline.prepare: dropped 3 repeated --input file(s), named by more than one path or glob; each "
          "file is read once.") in capsys.readouterr().err.splitlines()


# ------------------------------------------------------------------------------------------- storage errors

def test_a_storage_error_is_one_line():
  def no_bucket():
    raise storage.StorageError("Bucket gs://b does not exist; create it with `gcloud storage buckets create gs://b`.")
  with pytest.raises(SystemExit) as exit_:
    cli.run("data_pipeline.prepare", no_bucket)
  assert exit_.value.code == ("data_pipeline.prepare: error: Bucket gs://b does not exist; create it with "
                              "`gcloud storage buckets create gs://b`.")


@pytest.mark.shared_data
def test_a_missing_bucket_is_one_line_from_both_commands(gcs, shared_data, tmp_path):  # noqa: F811
  missing = "gs://no-such-bucket"
  assert refused("prepare", f"--input={ALICE}", f"--spm_model={_spm(shared_data)}",
                 f"--output_dir={missing}/prepared").startswith(f"Bucket {missing} does not exist")
  assert refused("train_spm", f"--input={missing}/corpus/*.txt", f"--output={tmp_path / 'm.model'}").startswith(
      f"Bucket {missing} does not exist")
