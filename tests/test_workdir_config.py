"""A workdir remembers its run: without --config, `--mode=eval|predict|embed` and a resume read the run's resolved
config (config.json) from --workdir and compute what the full command line computes; a `--config.<field>`
override changes that field alone and is said in one line; where no run config can be read, or the mode needs an
experiment file, one line names --config."""
import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from albert_jax import convert, finetune, job_kinds, runner
from albert_jax.cli import experiment_config
from albert_jax.run import Run, config as run_config
from tests.helpers import REPO, quietly, spm, write_split

DEVICES = 8  # as in this process (tests/conftest.py): a command line's outputs and the references here compute alike
# Not the experiment file's values: a run of these is predicted correctly only with them. The text is cased for the
# uncased tokenizer's do_lower_case=False to count, labels are not the sorted order, flat_matmuls is a placeholder.
FINETUNING = ["--config.model.num_hidden_layers=2", "--config.data.max_seq_length=16",
              "--config.model.max_position_embeddings=16", "--config.data.do_lower_case=False",
              "--config.data.length_buckets=none", "--config.model.flat_matmuls=False",
              "--config.train.num_train_steps=2", "--config.train.global_batch_size=8", "--config.train.warmup_steps=1",
              "--config.train.eval_every=2", "--config.checkpoint.every=2", "--config.log.every=1",
              "--config.allow_random_init=True", "--config.checkpoint.async_save=False"]
TEXTS = "sentence\nA Good Film\nan AWFUL, dull film\nFine.\n"


def cli(*args):
  """`python -m albert_jax.main ARGS` as given (no --config added), on DEVICES virtual CPU devices."""
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "albert_jax.main", *map(str, args)], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)


def said(result) -> str:
  """The run-config line of a command's output."""
  assert result.returncode == 0, result.stdout + result.stderr
  return next(line for line in result.stdout.splitlines() if line.startswith("config: "))


def run_spec(workdir) -> str:
  return f"--config={run_config.__file__}:{workdir}"


@pytest.fixture(scope="module")
def finetuned(shared_data, tmp_path_factory):
  """A 2-step classification run trained with FINETUNING's overrides, and a cased file to predict."""
  root = tmp_path_factory.mktemp("finetuned")
  write_split(root / "train.tsv", 16)
  write_split(root / "dev.tsv", 8)
  (root / "texts.tsv").write_text(TEXTS)
  argv = ["main", f"--config=experiments/classification.py:size=tiny,data={root},spm={spm(shared_data)},"
                  "text=sentence,labels=pos|neg", *FINETUNING]
  quietly(finetune.train, experiment_config(argv), Run(str(root / "run")))
  return types.SimpleNamespace(root=root, workdir=root / "run", argv=argv)


def leaves(config, prefix=""):
  """{path: (field type, value)} of every field: a list for a tuple, or an untyped None, would show here."""
  out = {}
  for key in config.keys():
    if hasattr(config[key], "keys"):
      out.update(leaves(config[key], f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = (config.get_type(key), config[key])
  return out


def test_the_run_config_reads_back_typed_and_overrides_change_only_their_fields(tmp_path):
  written = experiment_config(["main", "--config=experiments/classification.py:size=tiny,labels=pos|neg",
                               "--config.train.learning_rate=0.25", "--config.mesh.shape=(('data', 2),)"])
  run_config.write(Run(str(tmp_path)), written)
  back = experiment_config(["main", run_spec(tmp_path)])
  assert leaves(back) == leaves(written) and back.to_json_best_effort() == written.to_json_best_effort()
  assert back.model.embedding_projection is None and back.data.labels == ("pos", "neg")
  overridden = experiment_config(["main", run_spec(tmp_path), "--config.model.embedding_projection=True",
                                  "--config.data.labels=('neg', 'pos', 'meh')", "--config.train.learning_rate=1"])
  changed = {k: v for k, v in leaves(overridden).items() if leaves(written)[k] != v}
  assert changed == {"model.embedding_projection": (bool, True), "data.labels": (tuple, ("neg", "pos", "meh")),
                     "train.learning_rate": (float, 1.0)}


@pytest.mark.slow
def test_predict_with_only_the_workdir_gives_the_full_command_lines_predictions(finetuned, tmp_path):
  result = cli("--mode=predict", f"--workdir={finetuned.workdir}", f"--input={finetuned.root / 'texts.tsv'}",
               f"--output={tmp_path / 'mine.jsonl'}")
  assert said(result) == f"config: {finetuned.workdir}/config.json (the run's resolved config); no overrides"
  args = runner.RunArgs(input=str(finetuned.root / "texts.tsv"), output=str(tmp_path / "full.jsonl"))
  quietly(runner.run, experiment_config(finetuned.argv), Run(str(finetuned.workdir)), "predict", args)
  assert (tmp_path / "mine.jsonl").read_text() == (tmp_path / "full.jsonl").read_text()
  assert len((tmp_path / "mine.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow
def test_eval_with_only_the_workdir_gives_the_full_command_lines_scores(finetuned):
  result = cli("--mode=eval", f"--workdir={finetuned.workdir}")
  said(result)
  mine = (finetuned.workdir / "dev_predictions.jsonl").read_text()
  full = quietly(runner.run, experiment_config(finetuned.argv), Run(str(finetuned.workdir)), "eval")
  assert result.stdout.splitlines()[-1] == full.splitlines()[-1]
  assert json.loads(full.splitlines()[-1])["weights"] == "best checkpoint (step 2)"
  assert (finetuned.workdir / "dev_predictions.jsonl").read_text() == mine and len(mine.splitlines()) == 8


def test_eval_with_an_output_writes_nothing_into_the_workdir(finetuned, tmp_path):
  """A read-only run can be scored (cli.check_workdir accepts it with --output: tests/test_convert_heads.py)."""
  before = {p: p.stat().st_mtime_ns for p in finetuned.workdir.rglob("*")}
  said = quietly(runner.run, experiment_config(finetuned.argv), Run(str(finetuned.workdir)), "eval",
                 job_kinds.RunArgs(output=str(tmp_path / "scores")))
  assert json.loads(said.splitlines()[-1])["weights"] == "best checkpoint (step 2)"
  assert {p: p.stat().st_mtime_ns for p in finetuned.workdir.rglob("*")} == before
  assert os.listdir(tmp_path / "scores") == ["dev_predictions.jsonl"]
  assert len((tmp_path / "scores" / "dev_predictions.jsonl").read_text().splitlines()) == 8


@pytest.mark.slow
def test_embed_with_an_override_on_the_run_config_changes_that_field_alone(finetuned, tmp_path):
  """max_seq_length=4 cuts every text: the vectors are those of the full command line with that override."""
  texts = tmp_path / "texts.txt"
  texts.write_text("A Good Film\nan AWFUL, dull film\n")
  result = cli("--mode=embed", f"--workdir={finetuned.workdir}", f"--input={texts}", f"--output={tmp_path / 'm.npy'}",
               "--config.data.max_seq_length=4")
  assert said(result) == (f"config: {finetuned.workdir}/config.json (the run's resolved config); overrides: "
                          "data.max_seq_length=4")
  for output, override in (("full.npy", ["--config.data.max_seq_length=4"]), ("uncut.npy", [])):
    args = runner.RunArgs(input=str(texts), output=str(tmp_path / output))
    quietly(runner.run, experiment_config([*finetuned.argv, *override]), Run(str(finetuned.workdir)), "embed", args)
  mine = np.load(tmp_path / "m.npy")
  np.testing.assert_array_equal(mine, np.load(tmp_path / "full.npy"))
  assert mine.shape == (2, 64) and not np.allclose(mine, np.load(tmp_path / "uncut.npy"))


@pytest.mark.slow
def test_a_copied_workdir_reports_and_reads_its_own_best_weights(finetuned, tmp_path, capsys):
  """best.json records the path its run had; a copy said, and would have predicted with, the original's weights."""
  copy = tmp_path / "copy"
  shutil.copytree(finetuned.workdir, copy)
  finetune.train(experiment_config(finetuned.argv), Run(str(copy)))  # nothing left to train: reports the best
  said = capsys.readouterr().out
  assert f"done: best checkpoint {copy}/best/step_2 (accuracy " in said
  assert str(finetuned.workdir) not in said
  assert json.loads((copy / "best" / "best.json").read_text())["weights"] == f"{finetuned.workdir}/best/step_2"


def test_a_resume_with_only_the_workdir_sees_only_the_changes_asked_for(finetuned, tmp_path):
  """The config read back writes the JSON it was read from: the resume checks see no change; an override is the
  one change said, and the previous config is kept."""
  workdir = shutil.copytree(finetuned.workdir, tmp_path / "run")
  assert quietly(run_config.check_resume, Run(str(workdir)), run_config.get_config(str(workdir))) == ""
  result = cli(f"--workdir={workdir}", "--config.log.every=2")
  assert said(result) == f"config: {workdir}/config.json (the run's resolved config); overrides: log.every=2"
  assert ("Resuming at step 2 with changed settings: log.every: 1 -> 2 (the previous config is kept as "
          "config.2.json).") in result.stdout
  assert json.loads((workdir / "config.2.json").read_text()) == json.loads(
      (finetuned.workdir / "config.json").read_text())


USE_CONFIG = ("pass --config=FILE, the experiment file the run was trained with (and its --config.<field> "
              "overrides)")
REFUSALS = [
    (["--mode=eval", "--workdir={tmp}/new"], f"error: --workdir={{tmp}}/new holds no run config "
                                             f"({{tmp}}/new/config.json not found); {USE_CONFIG}."),
    (["--mode=predict", "--workdir={tmp}/garbled", "--split=dev"],
     f"error: {{tmp}}/garbled/config.json is not a run's config (a JSON object with task and model); {USE_CONFIG}, "
     "or restore it from a copy or from a config.<step>.json kept there."),
    (["--mode=embed"], "error: --config is required: pass an experiment file, e.g. experiments/pretrain_tiny.py, or "
                       "the --workdir of a training run (its config.json is read)."),
    (["--mode=train", "--workdir={tmp}/new"], "error: --config is required: pass an experiment file, e.g. "
                                              "experiments/pretrain_tiny.py."),
    (["--mode=describe", "--workdir={tmp}/run"], "error: --config is required: pass an experiment file, e.g. "
                                                 "experiments/pretrain_tiny.py."),
    (["--mode=compile", "--workdir={tmp}/run"], "error: --config is required: pass an experiment file, e.g. "
                                                "experiments/pretrain_tiny.py."),
    (["--mode=eval", "--workdir={tmp}/run", "--config.model.flat_matmul=True"],
     "FATAL Flags parsing error: --config.model.flat_matmul: {tmp}/run/config.json has no field model.flat_matmul; "
     "did you mean --config.model.flat_matmuls?")]


@pytest.mark.parametrize("args, message", REFUSALS, ids=["no_config_json", "garbled", "no_workdir", "fresh_train",
                                                         "describe", "compile", "misspelt_override"])
def test_without_a_readable_run_config_one_line_names_the_fix(tmp_path, args, message):
  """A fresh run, describe and compile need an experiment file even beside a run's config.json."""
  run_config.write(Run(str(tmp_path / "run")),
                                     experiment_config(["main", "--config=experiments/pretrain_tiny.py"]))
  (tmp_path / "garbled").mkdir()
  (tmp_path / "garbled" / "config.json").write_text('{"task": "glue", "model": {"vocab_si')
  result = cli(*[arg.format(tmp=tmp_path) for arg in args])
  assert result.returncode == 1 and result.stderr.splitlines() == [message.format(tmp=tmp_path)], result.stderr
  assert not (tmp_path / "new").exists()


def test_convert_names_a_garbled_run_config_in_one_line(tmp_path):
  (tmp_path / "run" / "checkpoints").mkdir(parents=True)
  (tmp_path / "run" / "config.json").write_text("[]")
  with pytest.raises(ValueError, match=f"^{tmp_path}/run/config.json is not a run's config .*; restore it from a copy"):
    convert.convert(None, "hf", str(tmp_path / "run"), str(tmp_path / "hf"))


def test_a_workdir_of_an_earlier_version_resumes_with_the_fields_added_since(tmp_path, monkeypatch, capsys):
  """Its config.json lacks the fields added since: they are new, not changed (no saved value could be restored),
  so the resume goes on and says so; the fields it holds are compared as ever."""
  monkeypatch.setattr(run_config, "latest_step", lambda run: 2)
  config = experiment_config(["main", "--config=experiments/pretrain_tiny.py"])
  older = json.loads(config.to_json_best_effort())
  del older["data"]["sentence_task"], older["model"]["sharing"]   # an exact-resume field and a shape field
  (tmp_path / "config.json").write_text(json.dumps(older))
  run_config.check_resume(Run(str(tmp_path)), config)
  assert capsys.readouterr().out == ("Resuming at step 2 with changed settings: data.sentence_task: 'sop' (new "
                                     "field), model.sharing: 'all' (new field) (the previous config is kept as "
                                     "config.2.json).\n")
  (tmp_path / "config.json").write_text(json.dumps(older))
  config.data.short_seq_prob = 0.2
  with pytest.raises(ValueError, match=r"with changed data\.short_seq_prob would not continue the same run"):
    run_config.check_resume(Run(str(tmp_path)), config)
  older["model"]["hidden_size"] *= 2
  (tmp_path / "config.json").write_text(json.dumps(older))
  with pytest.raises(ValueError, match=r"holds checkpoints of a different model \(model\.hidden_size: saved "):
    run_config.check_resume(Run(str(tmp_path)), config)


def test_an_electra_generator_of_another_width_is_refused_as_another_model(tmp_path, monkeypatch):
  """Another electra.generator_fraction changes the generator's parameter shapes: its checkpoints were said to be
  unreadable (move the directory aside), though they are fine and the config changed."""
  monkeypatch.setattr(run_config, "latest_step", lambda run: 2)
  config = experiment_config(["main", "--config=experiments/pretrain_electra.py"])
  (tmp_path / "config.json").write_text(config.to_json_best_effort())
  config.electra.generator_fraction = 0.5
  with pytest.raises(ValueError) as refused:
    run_config.check_resume(Run(str(tmp_path)), config)
  assert str(refused.value) == (f"Workdir {tmp_path} holds checkpoints of a different model "
                                "(electra.generator_fraction: saved 0.25 vs now 0.5). Use a new --workdir, or the "
                                "saved config (config.json there) to resume.")
