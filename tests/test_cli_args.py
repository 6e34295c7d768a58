"""Command-line arguments refused in one line that names the fix, before anything is loaded or written: experiment
arguments (`file.py:arg`), misspelt `--config.<field>` overrides, and `albert_jax.convert`'s --from/--to/--src/--dst."""
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

GLUE_TASKS = "['ax', 'cola', 'mnli', 'mrpc', 'qnli', 'qqp', 'rte', 'sst-2', 'sts-b', 'wnli']"


def run(module, *args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=120)


@pytest.mark.parametrize("spec, message", [
    ("glue.py:task=rtee", f"Unknown GLUE task 'rtee'; choose one of {GLUE_TASKS}."),
    ("glue.py:tsk=rte", "Unknown config argument 'tsk'; valid: ['data', 'recipe', 'size', 'spm', 'task']."),
    ("glue.py:task", "Config argument 'task' has no value; write task=VALUE."),
    ("race.py:size=xl", "Unknown model size 'xl'; choose one of "),
    ("pretrain_base.py:version=v3", "Config argument version='v3' names no ALBERT release; choose one of "
                                    "['v1', 'v2']."),
    ("glue.py:task=rte,task=mnli", "Config argument task is given twice in 'task=rte,task=mnli'; keep one.")])
def test_a_bad_experiment_argument_is_one_line(spec, message):
  """A typo, an unknown value (`version=v3`) or a repeated argument: one line naming it, no traceback, never a
  quiet default or the last value."""
  result = run("albert_jax.main", f"--config=experiments/{spec}", "--mode=describe")
  assert result.returncode == 1 and result.stderr.startswith(f"error: {message}"), result.stderr
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("override, flag", [
    ("--config.trian.num_train_steps=4", "--config.train.num_train_steps"),
    ("--config.trian.lerning_rate=1", "--config.train.learning_rate")])
def test_a_misspelt_section_suggests_the_whole_flag(override, flag):
  """The hint is the whole flag one can pass, not the section alone (`--config.train`)."""
  result = run("albert_jax.main", "--config=experiments/pretrain_tiny.py", "--mode=describe", override)
  assert result.returncode == 1 and result.stderr.strip().endswith(f"did you mean {flag}?"), result.stderr


@pytest.mark.parametrize("args, message", [
    ("--to=hf --src={run} --dst={run} --overwrite", "--dst={run} is --src; write the conversion to a new directory."),
    ("--to=hf --src={run} --dst={run}/hf", "--dst={run}/hf is inside --src={run}; write the conversion to a "
                                           "directory apart from it."),
    ("--to=hf --src={run} --dst={tmp} --overwrite", "--dst={tmp} holds --src={run}; write the conversion to a "
                                                    "directory apart from it."),
    ("--from=hf --src={hf} --dst={run} --overwrite", "--dst={run} is the training workdir {run} (it has "
                                                     "checkpoints/); writing there would overwrite the run's files: "
                                                     "choose a directory outside it."),
    ("--from=tf1 --src={hf} --dst={run}/checkpoints/x", "--dst={run}/checkpoints/x is inside the training workdir "
                                                        "{run} (it has checkpoints/); writing there would overwrite "
                                                        "the run's files: choose a directory outside it."),
    ("--to=hf --src={run} --dst={tmp}/notes.txt", "--dst={tmp}/notes.txt is a file; pass a directory (it is created "
                                                  "if missing)."),
    ("--to=hf --src={tmp}/no_config --dst={tmp}/out", "--src={tmp}/no_config has checkpoints/ but no config.json, "
                                                      "which names the run's model: pass a training workdir as "
                                                      "albert_jax.main wrote it (config.json next to checkpoints/)."),
    ("--src={run} --dst={tmp}/out", "Pass exactly one of --from=hf, --from=tf1 (into ours) or --to=hf (ours -> HF).")])
def test_convert_refuses_bad_paths_before_loading(tmp_path, args, message):
  """A --dst that is the run itself (whose config.json the HF one would replace, even with --overwrite, leaving a run
  that cannot resume), a --dst file, a workdir without config.json: each refused in one line, not a bare errno
  after the checkpoint loaded. The checks come before any loading, so folders with checkpoints/ stand in for
  training runs."""
  paths = {"run": tmp_path / "run", "hf": tmp_path / "hf", "tmp": tmp_path}
  for folder in (tmp_path / "run" / "checkpoints", tmp_path / "no_config" / "checkpoints", tmp_path / "hf"):
    folder.mkdir(parents=True)
  (tmp_path / "run" / "config.json").write_text('{"model": {}}')
  (tmp_path / "notes.txt").write_text("notes")
  before = sorted(tmp_path.rglob("*"))
  result = run("albert_jax.convert", *args.format(**paths).split())
  assert result.returncode == 1, result.stderr
  assert result.stderr.strip().splitlines()[-1] == f"convert: error: {message.format(**paths)}", result.stderr
  assert sorted(tmp_path.rglob("*")) == before and (tmp_path / "run" / "config.json").read_text() == '{"model": {}}'


BAD_FLAGS = [("--mode=trian", "flag --mode=trian: value should be one of <train|eval|predict|embed|compile|describe>"),
             ("--pooling=max", "flag --pooling=max: value should be one of <mean|pooled>"),
             ("--num_slices=two", "flag --num_slices=two: invalid literal for int()"),
             ("--fit=ture", "flag --fit=ture: ('Non-boolean argument to boolean flag', 'ture')"),
             ("--bogus=1", "Unknown command line flag 'bogus'")]


@pytest.mark.parametrize("overrides", [[], ["--config.train.num_train_steps=2", "--config.log.every=1"]],
                         ids=["alone", "with_overrides"])
@pytest.mark.parametrize("flag, message", BAD_FLAGS, ids=[flag for flag, _ in BAD_FLAGS])
def test_a_bad_flag_is_one_line_naming_it_with_or_without_overrides(flag, message, overrides):
  """absl's message for the flag itself; with `--config.*` overrides present a second parse used to report the
  overrides as "defined twice" instead."""
  result = run("albert_jax.main", "--config=experiments/pretrain_tiny.py", flag, *overrides)
  assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert result.stderr.startswith(f"FATAL Flags parsing error: {message}"), result.stderr


@pytest.mark.parametrize("config, message", [
    (None, "--config is required: pass an experiment file, e.g. experiments/pretrain_tiny.py."),
    ("experiments/pretrain_tyni.py", "--config=experiments/pretrain_tyni.py: experiments/pretrain_tyni.py does not "
                                     "exist; pass an experiment file, e.g. experiments/pretrain_tiny.py."),
    ("experiments:size=tiny", "--config=experiments:size=tiny: experiments is a directory; pass an experiment file"),
    ("{tmp}/notes.py", "--config={tmp}/notes.py defines no get_config(); an experiment file returns its "
                       "ConfigDict from get_config(), as experiments/pretrain_tiny.py does."),
    ("{tmp}/broken.py", "--config={tmp}/broken.py: {tmp}/broken.py, line 2: unmatched ')'; fix that line of the "
                        "experiment file."),
    ("{tmp}/plain.py", "--config={tmp}/plain.py: get_config() returned a dict; return an ml_collections.ConfigDict, "
                       "as experiments/pretrain_tiny.py does (ml_collections.ConfigDict(d) wraps a dict).")])
def test_a_config_file_that_is_missing_or_not_an_experiment_is_one_line(tmp_path, config, message):
  """Not ml_collections' traceback, which for a missing file came only when the config was first read, nor
  Python's for an experiment that does not parse or returns a dict (which failed later, at `config.task`)."""
  (tmp_path / "notes.py").write_text("size = 'tiny'\n")
  (tmp_path / "broken.py").write_text("def get_config():\n  return dict(size='tiny'))\n")
  (tmp_path / "plain.py").write_text("def get_config():\n  return {'size': 'tiny'}\n")
  result = run("albert_jax.main", *([f"--config={config.format(tmp=tmp_path)}"] if config else []), "--mode=describe")
  assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert result.stderr.startswith(f"error: {message.format(tmp=tmp_path)}"), result.stderr


@pytest.mark.parametrize("platforms", ["gpu", "tpu", "nonsense"])
def test_a_backend_this_host_lacks_is_one_line_and_writes_nothing(tmp_path, platforms):
  """JAX_PLATFORMS=gpu on a CPU host failed with jax's traceback from the first call that needed a device."""
  workdir = tmp_path / "run"
  result = subprocess.run([sys.executable, "-m", "albert_jax.main", "--config=experiments/pretrain_tiny.py:synthetic",
                           f"--workdir={workdir}"], cwd=REPO, env=dict(os.environ, JAX_PLATFORMS=platforms),
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert result.stderr.startswith(f"error: JAX_PLATFORMS={platforms}: Unable to initialize backend "), result.stderr
  assert result.stderr.strip().endswith(". Unset JAX_PLATFORMS to use the devices this host has, or name one of them "
                                        "(cpu on a host without accelerators)."), result.stderr
  assert not workdir.exists()


@pytest.mark.parametrize("args, message", [
    (["--mode=train", "--workdir={w}", "--fit"], "--fit does nothing with --mode=train; it is read by "
                                                 "--mode=compile. Drop it, or choose that mode."),
    (["--mode=train", "--workdir={w}", "--output=preds.tsv"], "--output does nothing with --mode=train; it is read "
                                                              "by --mode=eval and --mode=predict and --mode=embed."),
    (["--mode=eval", "--workdir={w}", "--split=test"], "--split does nothing with --mode=eval; it is read by "
                                                       "--mode=predict."),
    (["--mode=predict", "--workdir={w}", "--pooling=mean"], "--pooling does nothing with --mode=predict"),
    (["--mode=describe", "--topology=v3-8"], "--topology does nothing with --mode=describe"),
    (["--mode=train"], "--workdir is required for --mode=train: where the run's checkpoints and metrics are."),
    (["--mode=describe", "stray"], "unexpected arguments ['stray']; every setting is a --flag or a --config.<field> "
                                   "override."),
    (["--mode=predict", "--workdir={w}", "--input={w}.tsv", "--output={w}.tsv"], "--output={w}.tsv is --input; "
                                                                                  "write the output to a new file."),
    (["--mode=embed", "--workdir={w}", "--input={w}.txt", "--output={w}/best/vectors.npy"],
     "--output={w}/best/vectors.npy is inside the run's best/ ({w}/best); write it outside the weights.")])
def test_a_flag_the_mode_does_not_read_is_refused_before_anything_is_written(tmp_path, args, message):
  """Ignoring it would let a user believe it took effect (`--fit` on a training run, `--output` on eval); an
  `--output` that would replace the input or land among the weights is refused the same way."""
  workdir = tmp_path / "run"
  result = run("albert_jax.main", "--config=experiments/pretrain_tiny.py",
               *[arg.format(w=workdir) for arg in args])
  assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert result.stderr.startswith(f"error: {message.format(w=workdir)}"), result.stderr
  assert not workdir.exists()


@pytest.mark.parametrize("flag", ["--help", "--helpfull"])
def test_help_prints_the_flags_and_exits_0(flag):
  result = run("albert_jax.main", flag)
  assert result.returncode == 0 and not result.stderr, result.stderr
  opening = result.stdout.splitlines()[:3]  # what a user runs first: the README's default run
  assert opening[2] == "  python -m albert_jax.main --config experiments/pretrain_tiny.py --workdir /tmp/albert_tiny"
  assert "--config: Experiment file" in result.stdout and "--mode: <train|eval|predict|embed|compile|describe>" in \
      result.stdout, result.stdout


@pytest.mark.parametrize("mode, message", [
    ("predcit", "--mode=predcit is not a mode (did you mean --mode=predict?); choose one of train, eval, predict, "
                "embed, compile, describe."),
    ("xyz", "--mode=xyz is not a mode; choose one of train, eval, predict, embed, compile, describe."),
])
def test_a_mode_that_is_not_one_is_named_rather_than_the_missing_config(tmp_path, mode, message):
  result = run("albert_jax.main", f"--workdir={tmp_path / 'run'}", f"--mode={mode}")
  assert result.returncode == 1 and result.stderr == f"error: {message}\n", result.stderr
  assert not (tmp_path / "run").exists()


def test_an_input_or_output_that_is_a_folder_is_named_with_the_fix(tmp_path):
  """A folder as --input, or as the --output of predict or embed, is refused naming the file to pass instead."""
  folder, workdir = tmp_path / "texts", tmp_path / "run"
  folder.mkdir()
  config = "--config=experiments/pretrain_tiny.py"
  as_input = run("albert_jax.main", config, "--mode=embed", f"--workdir={workdir}", f"--input={folder}",
                 f"--output={tmp_path / 'v.npy'}")
  as_output = run("albert_jax.main", config, "--mode=embed", f"--workdir={workdir}", f"--input={tmp_path / 'x.txt'}",
                  f"--output={folder}")
  assert as_input.returncode == 1 and as_input.stderr == (
      f"error: --input={folder} is a folder; --mode=embed reads one file of examples: pass that file (its format: "
      "docs/finetuning.md).\n"), as_input.stderr
  assert as_output.returncode == 1 and as_output.stderr == (
      f"error: --output={folder} is a folder; --mode=embed writes one file: name it, e.g. "
      f"--output={folder / 'embeddings.npy'}.\n"), as_output.stderr
  assert not workdir.exists() and list(folder.iterdir()) == []


def test_encoder_only_says_it_writes_an_electra_model_for_electra_weights():
  result = run("albert_jax.convert", "--helpfull")
  assert "write the encoder alone (an AlbertModel; an ElectraModel for an ELECTRA run or backbone)" in \
      " ".join(result.stdout.split()), result.stdout
