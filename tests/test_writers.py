"""Writers never race or overwrite history: one writer per output (a second is refused naming the holder, a killed
holder does not block), an unreadable lock file is one line, a resume keeps every earlier config, no tool writes
where it reads or leaves a stale file in a submission, and a boolean flag takes only a boolean."""
import functools
import importlib
import json
import multiprocessing
import socket
import time

import flax.linen as nn
import jax
import numpy as np
import pytest

from albert_jax import convert, errors, glue_submission
from albert_jax import model as model_lib
from albert_jax.errors import InputError, UserError
from albert_jax.weights import store
from data_pipeline import train_spm
from data_pipeline.prepare import PrepareConfig, parse_args, prepare
from data_pipeline.sources import Source
from tests.helpers import SMALL_RUN, TEXT, TINY_MODEL, pretrain_cli
from tests.test_glue_submission import run_dir


def _stall(ready, *args, **kwargs):
  ready.set()
  time.sleep(600)


def _hold(module: str, name: str, write, ready) -> None:
  """The holder process: runs `write`, stalled where it writes its output (`module.name` waits for ever)."""
  setattr(importlib.import_module(module), name, functools.partial(_stall, ready))
  write()


@pytest.fixture
def holder():
  """Starts a process that runs a tool until it stalls while writing; returns it (it is killed at the end)."""
  context = multiprocessing.get_context("spawn")
  started = []

  def start(module, name, write):
    ready = context.Event()
    process = context.Process(target=_hold, args=(module, name, write, ready), daemon=True)
    process.start()
    started.append(process)
    assert ready.wait(60), "the holder never reached its writing"
    return process

  yield start
  for process in started:
    process.kill()
    process.join()


def _tools(shared_data, tmp_path):
  """(module, function stalled there, a call that writes) of each tool that writes an output."""
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(TEXT)
  spm = str(shared_data / "albert_spm" / "spiece.model")
  run = run_dir(tmp_path / "run", 0.5, [("RTE.tsv", ["entailment"] * 3)])
  abstract = nn.unbox(model_lib.abstract_params(model_lib.AlbertForPreTraining(TINY_MODEL)))
  store.save_pretrained(str(tmp_path / "weights"), TINY_MODEL,
                        jax.tree.map(lambda x: np.zeros(x.shape, np.float32), abstract))
  return {
      "prepare": ("data_pipeline.prepare", "write_shards", functools.partial(
          prepare, PrepareConfig(input=str(corpus), spm_model=spm, output_dir=str(tmp_path / "out"), num_shards=2,
                           eval_fraction=0.2))),
      "train_spm": ("data_pipeline.train_spm", "sample", functools.partial(
          train_spm.train, Source(str(corpus)), str(tmp_path / "spm.model"), vocab_size=40)),
      "convert": ("albert_jax.convert", "_earlier_files", functools.partial(
          convert.convert, None, "hf", str(tmp_path / "weights"), str(tmp_path / "hf"))),
      "glue_submission": ("albert_jax.storage", "copy_atomic", functools.partial(
          glue_submission.assemble, [run], str(tmp_path / "submission"), allow_partial=True, check_counts=False)),
  }


@pytest.mark.shared_data
@pytest.mark.parametrize("tool", ["prepare", "train_spm", "convert", "glue_submission"])
def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_holder_does_not_block(
    shared_data, tmp_path, holder, capsys, tool):
  module, stalled, write = _tools(shared_data, tmp_path)[tool]
  first = holder(module, stalled, write)
  with pytest.raises(UserError, match=f"is in use by a run on host {socket.gethostname()} \\(PID {first.pid}, "):
    write()
  if tool != "prepare":
    return
  first.kill()  # SIGKILL
  first.join()
  manifest = write()
  assert f"from a run that is no longer alive (host {socket.gethostname()}, PID {first.pid})" in capsys.readouterr().err
  out = tmp_path / "out"
  assert manifest["totals"]["documents"] == 20 and not (out / "run.lock").exists()
  assert all((out / s["file"]).stat().st_size > 0 for split in manifest["splits"].values() for s in split["shards"])


@pytest.mark.parametrize("contents", [b"\x00\xff\xfegarbage", b"", b"[1, 2]", b'{"host": "h", "pid": "x"}'])
def test_an_unreadable_lock_file_is_one_line(tmp_path, contents):
  from albert_jax.run import Run
  from albert_jax.run.lock import WorkdirLock
  (tmp_path / "run.lock").write_bytes(contents)
  with pytest.raises(UserError) as refused:
    with WorkdirLock(Run(str(tmp_path))):
      pass
  message = str(refused.value)
  assert errors.is_user_error(refused.value) and "\n" not in message
  assert message.startswith(f"{tmp_path / 'run.lock'} holds no lock record (") and "delete it" in message
  assert (tmp_path / "run.lock").read_bytes() == contents


@pytest.mark.parametrize("ahead, said", [(365 * 86400, "365 days"), (600, "600 s"), (0, None)])
def test_another_hosts_lock_from_the_future_names_the_clocks_and_the_fix(tmp_path, ahead, said):
  """A heartbeat ahead of this clock looks alive until the clock catches up, however long ago its holder died."""
  from data_pipeline.writers import WriterLock
  lock = tmp_path / "run.lock"
  now = time.time()
  lock.write_text(json.dumps({"host": "elsewhere", "pid": 7, "started": now, "heartbeat": now + ahead}))
  with pytest.raises(UserError) as refused:
    with WriterLock(str(lock), "--out", "--out"):
      pass
  message = str(refused.value)
  assert message.startswith("--out is in use by a run on host elsewhere (PID 7, started ") and "\n" not in message
  clock = (f"; its heartbeat is {said} ahead of this host's clock: the hosts' clocks disagree, and a dead holder's "
           f"lock looks alive until this clock catches up; set the clocks right (NTP), or delete {lock} if no run is "
           "writing there.")
  assert message.endswith(clock) if said else message.endswith("or use another --out.")


def test_every_resume_with_changes_keeps_the_config_it_replaced(tmp_path, monkeypatch, capsys):
  import ml_collections
  from albert_jax.run import Run, config as run_config
  monkeypatch.setattr(run_config, "latest_step", lambda run: 2)
  config = lambda every: ml_collections.ConfigDict({"model": {"hidden_size": 8}, "log": {"every": every}})
  saved = lambda name: json.loads((tmp_path / name).read_text())["log"]["every"]
  run_config.write(Run(str(tmp_path)), config(1))
  for every, kept in ((2, "config.2.json"), (3, "config.2.1.json")):  # two resumes at step 2, nothing saved between
    replaced = run_config.check_resume(Run(str(tmp_path)), config(every))
    assert f"(the previous config is kept as {kept})" in capsys.readouterr().out
    assert not (tmp_path / kept).exists()  # written with the new config.json, once no refusal can follow
    run_config.write(Run(str(tmp_path)), config(every), replaced=replaced)
  assert (saved("config.2.json"), saved("config.2.1.json"), saved("config.json")) == (1, 2, 3)


@pytest.mark.shared_data
def test_no_tool_writes_where_it_reads_nor_leaves_a_stale_file_in_a_submission(shared_data, tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(TEXT)
  spm = str(shared_data / "albert_spm" / "spiece.model")
  for output_dir, where in ((corpus, "is --input"), (tmp_path, f"holds --input={corpus}")):
    with pytest.raises(InputError, match=f"--output_dir={output_dir} {where}; write the preparation to a "):
      prepare(PrepareConfig(input=str(corpus), spm_model=spm, output_dir=str(output_dir)))
  with pytest.raises(InputError, match=f"--output={corpus} is --input; write the model to a new file."):
    train_spm.train(Source(str(corpus)), str(corpus), vocab_size=40)
  assert corpus.read_text() == TEXT
  rte = run_dir(tmp_path / "rte", 0.5, [("RTE.tsv", ["entailment"] * 3)])
  with pytest.raises(InputError, match=f"--out={rte.workdir} is --runs; write the submission to a new directory."):
    glue_submission.assemble([rte], rte.workdir, allow_partial=True, check_counts=False)
  out = tmp_path / "submission"
  out.mkdir()
  (out / "CoLA.tsv").write_text("index\tprediction\n0\t1\n")  # an earlier assembly's
  with pytest.raises(errors.ExistsError, match=f"--out={out} holds CoLA.tsv, which this submission does not write"):
    glue_submission.assemble([rte], str(out), allow_partial=True, check_counts=False)
  (out / "CoLA.tsv").unlink()
  assert glue_submission.assemble([rte], str(out), allow_partial=True, check_counts=False) == {"RTE.tsv": rte}
  assert sorted(p.name for p in out.iterdir()) == ["RTE.tsv"]


def test_a_boolean_flag_takes_only_a_boolean(tmp_path, capsys):
  required = ["--input=x.txt", "--spm_model=x.model", f"--output_dir={tmp_path}"]
  for text, value in (("TRUE", True), ("yes", True), ("1", True), ("False", False), ("NO", False), ("0", False)):
    assert parse_args([*required, f"--do_lower_case={text}"]).do_lower_case is value
  for parse, flags in ((parse_args, required), (train_spm.main, ["--input=x.txt", "--output=x.model"])):
    with pytest.raises(SystemExit) as refused:
      parse([*flags, "--do_lower_case=ture"])
    assert refused.value.code == 2
    assert "argument --do_lower_case: 'ture' is not a boolean" in capsys.readouterr().err


@pytest.mark.slow
def test_a_refused_resume_writes_nothing(tmp_path):
  """A resume with a legitimate change (a longer schedule) that a later check refuses (its only checkpoint cannot be
  read) keeps no config.<step>.json and leaves config.json as it was; only the compilation cache, the run's own
  cache, may have grown. Compiled fast (XLA's -O0): no value is compared."""
  run = tmp_path / "run"
  first = pretrain_cli(run, *SMALL_RUN, "--config.train.num_train_steps=2", "--config.checkpoint.every=2",
                       fast_compile=True)
  assert first.returncode == 0, first.stderr
  (run / "checkpoints" / "2" / "state" / "_METADATA").unlink()
  files = lambda: {path.relative_to(run): path.read_bytes() for path in run.rglob("*")
                   if path.is_file() and path.relative_to(run).parts[0] != "compilation_cache"}
  before = files()
  again = pretrain_cli(run, *SMALL_RUN, "--config.train.num_train_steps=4", "--config.checkpoint.every=2",
                       fast_compile=True)
  assert again.returncode == 1 and "error: No checkpoint in " in again.stderr, again.stderr
  assert "the previous config is kept as config.2.json" in again.stdout
  assert files() == before
