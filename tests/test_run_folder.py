"""A run's folder (`albert_jax.run`): its layout, the weights a run has, and a tool's output that would land on a run's
own file or folder, refused in one line before anything is written (predict, embed, seeds, glue_submission;
convert refuses any --dst in a training workdir, tests/test_cli_args.py)."""
import os
import subprocess
import sys

import pytest

from albert_jax import glue_submission, run
from albert_jax.errors import InputError
from tests.helpers import REPO, cpu_env

# The own files and folders the acceptance names: (where an output goes, the message's end), RUN for the run.
TARGETS = [
    ("config.json", "would replace the run's own config.json ({real}/config.json); write it to another path."),
    ("head.json", "would replace the run's own head.json ({real}/head.json); write it to another path."),
    ("metrics.jsonl", "would replace the run's own metrics.jsonl ({real}/metrics.jsonl); write it to another path."),
    ("best/out", "is inside the run's best/ ({real}/best); write it outside the weights."),
    ("checkpoints/out", "is inside the run's checkpoints/ ({real}/checkpoints); write it outside the weights."),
]
FILES = {"config.json": '{"task": "glue"}', "head.json": '{"task": "glue"}', "metrics.jsonl": '{"step": 1}\n',
         "best/best.json": '{"step": 2, "metric": "accuracy", "value": 0.5, "weights": "best/step_2"}',
         "checkpoints/2/marker": "weights"}


def make_run(path):
  """A fine-tuning run's folder as training leaves it (file contents stand in for the real ones)."""
  for name, text in FILES.items():
    (path / name).parent.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(text)
  return path


def snapshot(path):
  return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def fine_tuned(tmp_path):
  return make_run(tmp_path / "run")


def test_the_layout_is_named_in_one_place():
  r = run.Run("w")
  assert (r.config, r.checkpoints, r.best, r.best_record, r.head, r.lock, r.metrics, r.tensorboard) == (
      "w/config.json", "w/checkpoints", "w/best", "w/best/best.json", "w/head.json", "w/run.lock", "w/metrics.jsonl",
      "w/tensorboard")
  assert (r.config_history(40, 0), r.config_history(40, 2), r.best_step(7)) == (
      "w/config.40.json", "w/config.40.2.json", "w/best/step_7")
  assert r.best_weights({"weights": "/elsewhere/w/best/step_7/"}) == "w/best/step_7"  # by name: the run moved
  assert (r.seed(3).workdir, r.seed(3).config, r.seeds_report) == ("w/seed_3", "w/seed_3/config.json", "w/seeds.json")
  assert (r.learning_rate(1e-5).seed(0).workdir, r.learning_rate(3e-4).seeds_report) == ("w/lr_1e-05/seed_0",
                                                                                          "w/lr_0.0003/seeds.json")


def test_weights_are_traced_to_the_run_that_recorded_them(tmp_path, fine_tuned):
  """A weights path (init_checkpoint, --src) is the run itself or its best/step_N; a converted folder is no run."""
  best_step = fine_tuned / "best" / "step_2"
  best_step.mkdir()
  assert run.run_of_best(f"{best_step}/") == run.run_of_best(str(best_step)) == run.Run(str(fine_tuned))
  assert run.run_of_best(str(fine_tuned)) is None and run.run_of_best(str(tmp_path / "step_2")) is None
  assert run.run_of_weights(str(fine_tuned)) == run.run_of_weights(str(best_step)) == run.Run(str(fine_tuned))
  assert run.run_of_weights(str(best_step), "provenance.json") is None  # a run that recorded no fingerprints
  (fine_tuned / "provenance.json").write_text("{}")
  assert run.run_of_weights(str(best_step), "provenance.json") == run.Run(str(fine_tuned))
  converted = tmp_path / "converted"
  converted.mkdir()
  assert run.run_of_weights(str(converted)) is None
  assert run.as_run(str(converted)).head == f"{converted}/head.json"  # a converted folder keeps head.json as a run
  assert run.Run("gs://b/w").written_in("/tmp/m").metrics == "/tmp/m/metrics.jsonl"


def test_an_output_in_a_learning_rate_s_folder_of_a_seeds_folder_is_refused(tmp_path):
  (tmp_path / "seeds.json").write_text("{}")
  output = str(tmp_path / "lr_1e-05" / "dev.tsv")
  with pytest.raises(InputError) as refused:
    run.check_output("--output", output)
  real = os.path.realpath(tmp_path)
  assert str(refused.value) == (f"--output={output} is inside the run's lr_1e-05/ ({real}/lr_1e-05); write it "
                                "outside the run's own files.")
  run.check_output("--output", str(tmp_path / "lr_notes" / "dev.tsv"))  # no rate's folder


def test_the_weights_of_a_run_are_its_own_else_init_checkpoint(tmp_path, fine_tuned):
  assert run.Run(str(fine_tuned)).weights("") == (str(fine_tuned), "--workdir")
  empty = tmp_path / "empty"
  empty.mkdir()
  assert run.Run(str(empty)).weights("conv") == ("conv", "init_checkpoint")
  (empty / "checkpoints").mkdir()
  assert run.Run(str(empty)).weights("conv") == (str(empty), "--workdir")  # a pretraining run: latest
  with pytest.raises(InputError, match=r"^No weights in .*/new: it has no checkpoints and config.init_checkpoint is "
                                       "empty; pass --workdir of a training run"):
    run.Run(str(tmp_path / "new")).weights("")


@pytest.mark.parametrize("target, message", TARGETS)
def test_an_output_on_a_run_s_own_file_is_refused_whether_the_run_is_named_or_found(fine_tuned, target, message):
  real = os.path.realpath(fine_tuned)
  output = str(fine_tuned / target)
  for named in (run.Run(str(fine_tuned)), None):  # the mode's --workdir, or a run the output lands in
    with pytest.raises(InputError) as refused:
      run.check_output("--output", output, named)
    assert str(refused.value) == f"--output={output} {message.format(real=real)}"


def test_other_paths_in_or_beside_a_run_are_taken(tmp_path, fine_tuned):
  for output in ("preds.tsv", "dev_predictions.tsv", "configs/config.json", "best.json"):
    run.check_output("--output", str(fine_tuned / output), run.Run(str(fine_tuned)))
  notes = tmp_path / "notes"
  notes.mkdir()
  run.check_output("--output", str(notes / "head.json"))  # a folder that holds no run
  run.check_output("--output", str(tmp_path / "new" / "best" / "x"))
  with pytest.raises(InputError, match=r"new/best/x is inside the run's best/"):  # the mode's run, not made yet
    run.check_output("--output", str(tmp_path / "new" / "best" / "x"), run.Run(str(tmp_path / "new")))
  with pytest.raises(InputError, match=r"would replace the run's own config.12.json"):  # a resume's kept config
    run.check_output("--output", str(fine_tuned / "config.12.json"))


def test_predict_embed_and_seeds_outputs_on_a_run_s_own_files_are_refused_before_anything_is_written(tmp_path,
                                                                                                      fine_tuned):
  """The command lines' own checks, each command line parsed afresh in one process: --mode=predict names the run
  as --workdir, --mode=embed reads another run and writes into this one, albert_jax.seeds --workdir=DIR would put
  DIR/seed_<k> and DIR/seeds.json there."""
  (tmp_path / "texts.tsv").write_text("sentence\na film\n")
  other = make_run(tmp_path / "other")
  before = snapshot(fine_tuned)
  config = "--config=experiments/glue.py:task=sst-2,size=tiny"
  main_lines = [[config, f"--mode={mode}", f"--workdir={workdir}", f"--input={tmp_path / 'texts.tsv'}",
                 f"--output={fine_tuned / target}"]
                for mode, workdir in (("predict", fine_tuned), ("embed", other)) for target, _ in TARGETS]
  seeds_lines = [[config, "--seeds=2", f"--workdir={fine_tuned / target.removesuffix('/out')}"]
                 for target, _ in TARGETS]
  script = f"""
from absl import flags
from albert_jax import cli, seeds
from albert_jax.errors import UserError
for argv in {main_lines!r} + {seeds_lines!r}:
  flags.FLAGS.unparse_flags()
  argv = cli.parse_flags(["albert_jax", *argv])
  try:
    seeds.check_command_line(argv) if flags.FLAGS.seeds else cli.check_command_line(argv, flags.FLAGS.mode)
    print("taken")
  except UserError as e:
    print(e)
"""
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=cpu_env(), capture_output=True, text=True,
                          timeout=120)
  real = os.path.realpath(fine_tuned)
  expected = [f"--output={fine_tuned / target} {message.format(real=real)}" for target, message in TARGETS * 2] + [
      f"--workdir={fine_tuned / target.removesuffix('/out')} {message.format(real=real)}"
      .replace("is inside the run's", "is the run's") for target, message in TARGETS]
  assert result.stdout.splitlines() == expected, result.stderr
  assert snapshot(fine_tuned) == before


@pytest.mark.parametrize("target, message", TARGETS)
def test_a_glue_submission_into_a_run_s_own_files_is_refused(tmp_path, fine_tuned, target, message):
  source = make_run(tmp_path / "rte")
  (source / "RTE.tsv").write_text("index\tprediction\n0\tentailment\n")
  before = snapshot(fine_tuned)
  out = str(fine_tuned / target.removesuffix("/out"))
  expected = f"--out={out} {message.format(real=os.path.realpath(fine_tuned))}".replace("is inside the", "is the")
  with pytest.raises(SystemExit) as refused:
    glue_submission.main(["--runs", str(source), "--out", out, "--allow_partial", "--no_check_counts"])
  assert refused.value.code == f"glue_submission: error: {expected}"
  assert snapshot(fine_tuned) == before
