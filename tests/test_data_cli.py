"""The data command lines as a user runs them: a mistake in the flags or the input, or a storage error, is one line
on stderr and exit status 1, found before anything is written where it can be; lines longer than SentencePiece's
limit are learnt from, and a split left empty is told with its consequence and fix."""
import json
import os
import re
from pathlib import Path

import pytest
import sentencepiece as spm

from albert_jax import storage
from albert_jax.errors import InputError
from data_pipeline import cli, train_spm
from data_pipeline.prepare import PrepareConfig, main as prepare_main, prepare
from data_pipeline.sources import Source
from tests.helpers import TEXT, data_cli_error as _error


def _spm(shared_data):
  return str(shared_data / "albert_spm" / "spiece.model")


def test_an_input_error_is_one_line_and_a_bug_keeps_its_traceback():
  def mistake():
    raise InputError("--input pattern 'x' matches no file.")
  with pytest.raises(SystemExit) as exit_:
    cli.run("data_pipeline.prepare", mistake)
  assert exit_.value.code == "data_pipeline.prepare: error: --input pattern 'x' matches no file."
  def bug():
    raise ValueError("a bug")
  with pytest.raises(ValueError, match="a bug"):
    cli.run("data_pipeline.prepare", bug)


def test_a_storage_error_is_one_line():
  def no_bucket():
    raise storage.StorageError("Bucket gs://b does not exist; create it with `gcloud storage buckets create gs://b`.")
  with pytest.raises(SystemExit) as exit_:
    cli.run("data_pipeline.prepare", no_bucket)
  assert exit_.value.code == ("data_pipeline.prepare: error: Bucket gs://b does not exist; create it with "
                              "`gcloud storage buckets create gs://b`.")


@pytest.mark.shared_data
def test_prepare_checks_every_number_before_writing_anything(shared_data, tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(TEXT)
  out = tmp_path / "out"
  flags = [f"--input={corpus}", f"--spm_model={_spm(shared_data)}", f"--output_dir={out}"]
  for bad in ("num_shards", "num_eval_shards", "workers", "max_sentence_tokens"):
    assert _error("prepare", *flags, f"--{bad}=0") == f"--{bad}=0 must be at least 1."
  assert _error("prepare", *flags, "--eval_fraction=1") == "--eval_fraction must be in [0, 1), got 1.0."
  assert _error("prepare", *flags, "--max_unit_bytes=3").startswith("max_unit_bytes=3 and max_document_units")
  assert not out.exists()
  prepare_main([*flags, "--num_shards=2"])   # the corrected command is not refused as "different settings"
  assert json.loads((out / "manifest.json").read_text())["totals"]["documents"] == 20


@pytest.mark.shared_data
def test_prepare_refuses_bad_input_in_one_line(shared_data, tmp_path):
  (tmp_path / "folder").mkdir()
  (tmp_path / "empty.txt").write_text("")
  binary = tmp_path / "data.bin"
  binary.write_bytes(b"text\n\0more")
  flags = [f"--spm_model={_spm(shared_data)}", f"--output_dir={tmp_path / 'out'}"]
  assert _error("prepare", f"--input={tmp_path}/missing*.txt", *flags) == (
      f"--input pattern '{tmp_path}/missing*.txt' matches no file.")
  assert _error("prepare", f"--input={tmp_path / 'folder'}", *flags) == (
      f"--input '{tmp_path / 'folder'}' is a directory; name the files in it, e.g. "
      f"--input='{tmp_path / 'folder'}/*.txt'.")
  assert _error("prepare", f"--input={binary}", *flags).startswith(f"--input file {binary} is binary")
  assert _error("prepare", f"--input={tmp_path / 'empty.txt'}", *flags).startswith("No documents in --input=")
  assert _error("prepare", f"--input={binary}", f"--spm_model={tmp_path}/none.model",
                f"--output_dir={tmp_path / 'out'}").startswith(f"SentencePiece model '{tmp_path}/none.model' not")


@pytest.mark.shared_data
def test_a_preparation_without_documents_does_not_refuse_the_corrected_command(shared_data, tmp_path):
  corpus = tmp_path / "docs.jsonl"
  corpus.write_text("".join(json.dumps({"body": f"Text {i}. More text."}) + "\n" for i in range(5)))
  config = PrepareConfig(input=str(corpus), format="jsonl", spm_model=_spm(shared_data),
                         output_dir=str(tmp_path / "out"), num_shards=1, eval_fraction=0)
  with pytest.raises(InputError, match="No documents"):
    prepare(config)
  assert os.listdir(tmp_path / "out") == []
  assert prepare(PrepareConfig(**{**config.__dict__, "text_field": "body"}))["totals"]["documents"] == 5


@pytest.mark.shared_data
def test_an_empty_split_is_told_with_its_consequence_and_fix(shared_data, tmp_path, capsys):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(TEXT)
  config = PrepareConfig(input=str(corpus), spm_model=_spm(shared_data), output_dir=str(tmp_path / "out"))
  manifest = prepare(config)   # 20 documents at the default 1%: none held out
  assert manifest["splits"]["eval"]["documents"] == 0
  assert capsys.readouterr().err.splitlines()[-1] == (
      "data_pipeline.prepare: warning: no document went to the eval split (--eval_fraction=0.01 of 20 documents); "
      "pretraining with held-out evaluation (train.eval_every > 0) needs it and stops with an error: raise "
      "--eval_fraction or add documents, or train with --config.train.eval_every=0 (no held-out evaluation).")
  # No eval split asked for: still prepared, and still told.
  manifest = prepare(PrepareConfig(**{**config.__dict__, "output_dir": str(tmp_path / "none"), "eval_fraction": 0}))
  assert manifest["splits"]["train"]["documents"] == 20
  assert "warning: no document went to the eval split (--eval_fraction=0 of 20" in capsys.readouterr().err
  prepare(PrepareConfig(**{**config.__dict__, "output_dir": str(tmp_path / "half"), "eval_fraction": 0.5}))
  assert "warning" not in capsys.readouterr().err


@pytest.mark.shared_data
def test_the_same_files_named_from_another_directory_are_the_same_preparation(shared_data, tmp_path, monkeypatch):
  (tmp_path / "corpus").mkdir()
  (tmp_path / "corpus" / "a.txt").write_text(TEXT)
  (tmp_path / "spm.model").write_bytes(Path(_spm(shared_data)).read_bytes())
  out = tmp_path / "out"
  absolute = PrepareConfig(input=f"{tmp_path}/corpus/*.txt", spm_model=str(tmp_path / "spm.model"),
                           output_dir=str(out), num_shards=2, eval_fraction=0.2)
  prepare(absolute)
  shard = next(out.glob("train-*.array_record"))
  written = shard.stat().st_mtime_ns
  monkeypatch.chdir(tmp_path)
  relative = PrepareConfig(**{**absolute.__dict__, "input": "./corpus/*.txt", "spm_model": "spm.model"})
  prepare(relative)
  assert shard.stat().st_mtime_ns == written   # resumed as the same preparation: nothing written again
  recorded = json.loads((out / "prepare_config.json").read_text())
  assert (recorded["input"], recorded["spm_model"]) == (f"{tmp_path}/corpus/*.txt", str(tmp_path / "spm.model"))
  # Recorded as given by earlier versions: still the same preparation.
  (out / "prepare_config.json").write_text(json.dumps({**recorded, "input": "corpus/*.txt"}))
  prepare(relative)
  assert shard.stat().st_mtime_ns == written


def _long_lines(path: Path, short: int) -> Path:
  """`short` short lines, then 32 lines of 4.6 kB (a paragraph per line) holding the only q, z and j."""
  lines = ["The cat sat on the mat.", "A dog ran.", "The end came."][:short] + [
      " ".join(f"quiz{n} jazz{n}" for n in range(k * 300, k * 300 + 300)) for k in range(32)]
  path.write_text("".join(line + "\n" for line in lines))
  return path


def test_train_spm_learns_from_lines_longer_than_the_trainers_limit(tmp_path, capsys):
  corpus = _long_lines(tmp_path / "mixed.txt", short=3)
  fed = list(train_spm.sentences(Source(str(corpus))))
  assert len(fed) == 3 + 32 * 2 and max(len(s.encode()) for s in fed) <= train_spm.MAX_SENTENCE_BYTES
  assert " ".join(fed[3:5]) == corpus.read_text().splitlines()[3]   # cut at a space: nothing lost
  model = train_spm.train(Source(str(corpus)), str(tmp_path / "m.model"), vocab_size=100)
  assert capsys.readouterr().err.splitlines()[-1].startswith("data_pipeline.train_spm (vocab 100): 67 sentences read")
  sp = spm.SentencePieceProcessor(model_file=model)
  assert sp.unk_id() not in sp.encode("quiz jazz")   # learnt from the long lines
  only_long = _long_lines(tmp_path / "long.txt", short=0)
  train_spm.train(Source(str(only_long)), str(tmp_path / "long.model"), vocab_size=100)


def test_train_spm_refuses_bad_input_and_flags_in_one_line(tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(TEXT)
  (tmp_path / "folder").mkdir()
  (tmp_path / "empty.txt").write_text("")
  late_nul = tmp_path / "late.txt"
  late_nul.write_bytes(TEXT.encode() * 200 + b"\0")   # read inside the trainer, which wraps errors in its own
  out = f"--output={tmp_path / 'm.model'}"
  assert _error("train_spm", f"--input={tmp_path / 'empty.txt'}", out) == (
      f"No text in --input='{tmp_path / 'empty.txt'}'; check --format (now 'lines') and --text_field, and that "
      "the files hold text.")
  assert _error("train_spm", f"--input={corpus}", "--format=jsonl", out).startswith("No text in --input=")
  assert _error("train_spm", f"--input={tmp_path / 'folder'}", out).startswith(
      f"--input '{tmp_path / 'folder'}' is a directory")
  assert _error("train_spm", f"--input={late_nul}", out).startswith(f"--input file {late_nul} is binary")
  assert _error("train_spm", f"--input={corpus}", out, "--vocab_size=0") == "--vocab_size=0 must be at least 14."
  assert re.fullmatch(r"--vocab_size=30000 is more than this text supports: at most \d+; lower --vocab_size or "
                      "train on more text.", _error("train_spm", f"--input={corpus}", out, "--vocab_size=30000"))
  assert re.match(r"--vocab_size=20 is less than this text needs: at least \d+ ",
                  _error("train_spm", f"--input={corpus}", out, "--vocab_size=20"))
  assert _error("train_spm", f"--input={corpus}", f"--output={tmp_path}") == (
      f"--output={tmp_path} is a directory; pass the path of the .model file to write, e.g. "
      f"--output={tmp_path}/spm.model.")
  assert not (tmp_path / "m.model").exists()
