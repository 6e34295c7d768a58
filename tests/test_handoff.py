"""From a pretraining run to fine-tuning with nothing but its path: `init_checkpoint` gives the model and the
tokenizer (`record.take_recorded`), explicit overrides win and conflicts are refused, every process takes process
0's values, and the README's four commands (pretrain -> fine-tune RTE -> predict -> export) run as written."""
import json
import os
import shlex
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from albert_jax import finetune, model as model_lib
from albert_jax.model_config import model_config_for, model_config_from
from albert_jax.weights import record, store
from albert_jax.weights.resolve import resolve
from experiments import glue as glue_experiment
from tests.helpers import REPO, glue_data, logged
from tests.processes import communicate_all, free_port

# The default run's model (experiments/pretrain_tiny.py) where the glue experiment's `size=base` differs.
TINY_RUN_MODEL = dict(vocab_size=4000, embedding_size=32, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=512, max_position_embeddings=128)
CAPPED = "data.max_seq_length=128 (capped at the model's max_position_embeddings)"


def said_model(model: dict) -> str:
  return ", ".join(f"{k}={v}" for k, v in model.items())


def training_workdir(path, data: dict) -> str:
  """A training workdir's config.json as `run.config.write` writes it, with the default run's
  model."""
  path.mkdir(parents=True, exist_ok=True)
  model = {**model_config_for("tiny").to_dict(), **TINY_RUN_MODEL}
  (path / "config.json").write_text(json.dumps({"task": "pretrain", "model": model, "data": data}))
  return str(path)


def prepared_tokenizer(folder, do_lower_case: bool) -> None:
  folder.mkdir(parents=True)
  (folder / "manifest.json").write_text(json.dumps({"tokenizer": {"model": "spiece.model",
                                                                   "do_lower_case": do_lower_case}}))


def test_the_model_and_the_tokenizer_of_the_run_are_taken_unless_the_command_line_set_them(tmp_path):
  workdir = training_workdir(tmp_path / "pre", {"kind": "tiny", "path": "", "spm_model": ""})
  prepared_tokenizer(tmp_path / "pre" / "tiny_data" / "prepared", do_lower_case=False)
  spm = f"{workdir}/tiny_data/prepared/spiece.model"
  config, said = record.take_recorded(glue_experiment.get_config("task=rte"), record.read(workdir), explicit=())
  assert model_config_from(config) == model_config_for("base", **TINY_RUN_MODEL, dtype="float32")
  assert (config.data.spm_model, config.data.do_lower_case, config.data.max_seq_length) == (spm, False, 128)
  assert config.train.max_micro_batch_size == 64  # base's 8192 tokens a device over the 128 taken, not over 512
  assert said == (f"model and tokenizer from {workdir} (config.json): {said_model(TINY_RUN_MODEL)}; "
                  f"spm_model={spm}, do_lower_case=False; {CAPPED}")
  given = glue_experiment.get_config(f"task=rte,spm={tmp_path / 'mine.model'}")
  given.model.hidden_size, given.data.max_seq_length = 768, 512  # given, equal to the experiment's: still kept
  config, said = record.take_recorded(given, record.read(workdir),
                                      explicit=("model.hidden_size", "data.max_seq_length"))
  assert (config.model.hidden_size, config.model.num_hidden_layers, config.data.max_seq_length) == (768, 4, 512)
  assert config.train.max_micro_batch_size == 16  # 8192 // 512
  assert config.data.spm_model == str(tmp_path / "mine.model") and config.data.do_lower_case
  assert said == f"model from {workdir} (config.json): " + said_model(
      {k: v for k, v in TINY_RUN_MODEL.items() if k != "hidden_size"})
  same, said = record.take_recorded(config, record.read(workdir), explicit=("model.hidden_size", "data.max_seq_length"))
  assert said is None and same.to_dict() == config.to_dict()


def test_the_tokenizer_of_each_kind_of_weights(tmp_path):
  """A run's data.spm_model (with the lower-casing its preparation recorded), a fine-tuning run's from its
  best/step_N, a spiece.model beside converted weights; none for synthetic data."""
  prepared_tokenizer(tmp_path / "prepared", do_lower_case=False)
  pre = training_workdir(tmp_path / "pre", {"kind": "prepared", "path": str(tmp_path / "prepared"),
                                               "spm_model": "/data/spm.model"})
  assert record.recorded_tokenizer(pre) == ("/data/spm.model", False)
  tuned = training_workdir(tmp_path / "rte", {"spm_model": "/data/rte.model", "do_lower_case": True})
  (tmp_path / "rte" / "best" / "step_8").mkdir(parents=True)
  assert record.recorded_tokenizer(f"{tuned}/best/step_8") == ("/data/rte.model", True)
  (tmp_path / "converted").mkdir()
  assert record.recorded_tokenizer(str(tmp_path / "converted")) is None
  (tmp_path / "converted" / "spiece.model").write_bytes(b"")
  assert record.recorded_tokenizer(str(tmp_path / "converted")) == (str(tmp_path / "converted/spiece.model"), None)
  synthetic = training_workdir(tmp_path / "synthetic", {"kind": "synthetic", "path": "", "spm_model": ""})
  assert record.recorded_tokenizer(synthetic) is None


def test_a_config_built_in_python_is_used_as_it_is(tmp_path):
  workdir = training_workdir(tmp_path / "pre", {"kind": "synthetic"})
  config = glue_experiment.get_config("task=rte")
  assert resolve(workdir, config).config is config  # no overrides passed: not the command line's


def test_explicit_values_that_contradict_the_weights_are_refused(tmp_path):
  model_config = model_config_for("tiny", num_hidden_layers=2)
  backbone = jax.eval_shape(lambda: model_lib.init_params(model_lib.AlbertModel(model_config), jax.random.key(0)))
  store.save_pretrained(str(tmp_path / "init"), model_config,
                        {"albert": jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nn.unbox(backbone))})
  base = glue_experiment.get_config(f"task=rte,spm={tmp_path / 'spm.model'}")
  base.init_checkpoint = str(tmp_path / "init")
  for field, value, message in (
      ("model.hidden_size", 32, "hidden_size=64 but this run has 32; .* Pass --config.model.hidden_size=64"),
      ("model.num_attention_heads", 8, "num_attention_heads=4 but this run has 8"),
      ("data.max_seq_length", 512, "data.max_seq_length=512 exceeds model.max_position_embeddings=128")):
    given = base.copy_and_resolve_references()
    given.update_from_flattened_dict({field: value})
    config, said = record.take_recorded(given, record.read(str(tmp_path / "init")), explicit=(field,))
    assert said.startswith(f"model from {tmp_path / 'init'} (model_config.json): ")
    with pytest.raises(ValueError, match=message):
      task = finetune.get_task(config)
      weights = resolve(config.init_checkpoint, config)
      finetune._warm_start(config, task, task.build_model(model_config_from(config)), weights)


TWO_PROCESSES = """
import json, sys
import jax
jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
from albert_jax.weights import record
from experiments import glue
config, _ = record.take_recorded(glue.get_config("task=rte"), record.read(sys.argv[3]), explicit=())
print("RESULT", json.dumps([config.model.hidden_size, config.data.max_seq_length]), flush=True)
"""


@pytest.mark.slow
def test_every_process_takes_the_values_of_process_0(tmp_path):
  """Each process reads weights of another size (as hosts with their own copies could): both take process 0's."""
  for name, size in (("a", 64), ("b", 32)):
    (tmp_path / name).mkdir()
    (tmp_path / name / "model_config.json").write_text(json.dumps({"hidden_size": size, "max_position_embeddings":
                                                                   size}))
  port, script = free_port(), tmp_path / "take.py"
  script.write_text(TWO_PROCESSES)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu",
             PYTHONPATH=str(REPO))
  procs = [subprocess.Popen([sys.executable, str(script), f"localhost:{port}", str(i), str(tmp_path / name)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i, name in enumerate("ab")]
  outputs = communicate_all(procs, timeout=120)
  assert all(p.returncode == 0 for p in procs), outputs
  for output in outputs:
    assert json.loads(next(line for line in output.splitlines() if line.startswith("RESULT "))[7:]) == [64, 64]


# ---------------------------------------------------------------------------------- the README's commands

SECTION = "## From the default run to a fine-tuned model"
# Appended to the README's commands (pretrain, fine-tune, predict, export): a tiny run of each.
FAST = (["--config.train.num_train_steps=3", "--config.train.eval_every=0", "--config.train.global_batch_size=8",
         "--config.model.num_hidden_layers=1", "--config.model.scan_unroll=1", "--config.checkpoint.async_save=false"],
        ["--config.train.num_train_steps=2", "--config.train.global_batch_size=8", "--config.train.warmup_steps=1",
         "--config.train.eval_every=2", "--config.data.length_buckets=none"],
        ["--config.data.length_buckets=none"],
        [])


# How a `next:` line names the interpreter of the test's processes (which inherit its PATH): runnable as printed.
PYTHON = "python" if shutil.which("python") == sys.executable else sys.executable


def readme_commands(tmp) -> list[list[str]]:
  """The commands of the README's section, /tmp/ moved into `tmp`, each as its argv."""
  section = (REPO / "README.md").read_text().split(SECTION + "\n", 1)[1].split("\n## ", 1)[0]
  block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ").replace("/tmp/", f"{tmp}/")
  return [shlex.split(line) for line in block.strip().splitlines()]


def run(argv: list[str], data: str) -> subprocess.CompletedProcess:
  assert argv[0] == "python"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, *(arg.replace("DATA/glue", data) for arg in argv[1:])], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_readme_pretrains_fine_tunes_predicts_and_exports(shared_data, tmp_path):
  """The default run, then RTE fine-tuned from its workdir alone (on a slice of the shared GLUE data), predictions
  of its best checkpoint and the export. Each run says what comes next: the README's next command."""
  data = str(glue_data(shared_data, "rte", tmp_path / "glue"))
  pretrain, fine_tune, predict, export = commands = readme_commands(tmp_path)
  assert pretrain == shlex.split(f"python -m albert_jax.main --config experiments/pretrain_tiny.py --workdir "
                                 f"{tmp_path}/albert_tiny")  # the default run
  done = [run(argv + fast, data) for argv, fast in zip(commands[:2], FAST)]
  for result in done:
    assert result.returncode == 0, result.stdout + result.stderr
  progress = [line for line in done[0].stderr.splitlines() if line.startswith("step ")]
  assert progress[0].startswith("step 1/3 done in ") and progress[1].startswith("step 3/3 | ")
  last = done[0].stdout.splitlines()[-1]
  assert last.startswith(f"done: checkpoint {tmp_path}/albert_tiny/checkpoints/3; next: ")
  experiment = [arg.replace("experiments/", f"{REPO}/experiments/", 1) for arg in fine_tune[1:]]  # any folder
  assert shlex.split(last.split("; next: ")[1]) == [PYTHON, *experiment]
  assert list(logged(tmp_path / "albert_tiny")) == [3]  # the first step's line is said, not logged
  spm = f"{tmp_path}/albert_tiny/tiny_data/prepared/spiece.model"
  taken = f"{said_model({**TINY_RUN_MODEL, 'num_hidden_layers': 1})}; spm_model={spm}; {CAPPED}"
  assert done[1].stdout.splitlines()[0] == f"model and tokenizer from {tmp_path}/albert_tiny (config.json): {taken}"
  assert shlex.split(done[1].stdout.splitlines()[-1].split("; next: ")[1]) == [PYTHON, *predict[1:], "&&", PYTHON,
                                                                               *export[1:]]
  recorded = json.loads((tmp_path / "albert_tiny_rte" / "config.json").read_text())
  assert (recorded["model"]["hidden_size"], recorded["data"]["spm_model"]) == (128, spm)

  predicted = run(predict + FAST[2], data)
  assert predicted.returncode == 0, predicted.stdout + predicted.stderr
  lines = predicted.stdout.splitlines()  # the run's own config, which already names the model and tokenizer
  assert lines[0] == (f"config: {tmp_path}/albert_tiny_rte/config.json (the run's resolved config); overrides: "
                      "data.length_buckets=none")
  assert not [line for line in lines if line.startswith("model and tokenizer from")]
  rows = (tmp_path / "albert_tiny_rte_dev.tsv").read_text().splitlines()
  assert rows[0] == "index\tprediction" and len(rows) == 1 + 23  # the dev slice's rows
  assert {row.split("\t")[1] for row in rows[1:]} <= {"entailment", "not_entailment"}
  exported = run(export, data)
  assert exported.returncode == 0, exported.stdout + exported.stderr
  hf_config = json.loads((tmp_path / "albert_tiny_rte_hf" / "config.json").read_text())
  assert hf_config["architectures"] == ["AlbertForSequenceClassification"]
  assert (hf_config["hidden_size"], hf_config["num_hidden_layers"], hf_config["vocab_size"]) == (128, 1, 4000)
  assert (tmp_path / "albert_tiny_rte_hf" / "tokenizer.json").is_file()


def test_a_printed_command_names_python_only_where_path_runs_this_interpreter(tmp_path, monkeypatch):
  from albert_jax import console
  other, real = tmp_path / "other", sys.executable
  other.mkdir()
  (other / "python").symlink_to(real)  # the same program, but not the interpreter (venv) that ran
  monkeypatch.setattr(sys, "executable", str(tmp_path / "my venv" / "bin" / "python"))
  monkeypatch.setenv("PATH", str(other))
  assert console.python() == f"'{tmp_path}/my venv/bin/python'"  # quoted: the shell runs it as printed
  (tmp_path / "my venv" / "bin").mkdir(parents=True)
  (tmp_path / "my venv" / "bin" / "python").symlink_to(real)
  monkeypatch.setenv("PATH", f"{tmp_path}/my venv/bin:{other}")  # the venv activated
  assert console.python() == "python"
