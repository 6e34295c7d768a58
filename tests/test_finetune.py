"""Every fine-tuning task runs through `python -m albert_jax.main` on CPU with a tiny model and writes metrics,
the best checkpoint and predictions; pretrained weights are required unless random init is explicit.

Data: small slices of the real files in ../shared/data. QQP and MNLI are not shipped there, so their files are
written in the official column layouts from RTE sentence pairs.
"""
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import pytest

from albert_jax import finetune, model as model_lib
from albert_jax.model_config import model_config_from
from albert_jax.run import Run
from albert_jax.run.best import read_best
from albert_jax.tasks.squad import null_odds_path
from albert_jax.weights import store
from albert_jax.weights.resolve import resolve
from experiments import glue as glue_experiment
from tests.cli_forks import run_each
from tests.helpers import REPO, TINY_RUN, cpu_env, finetune_cli, glue_data, rte_pairs, spm, squad_data, write_tsv
from tests.processes import communicate_all, free_port

# XLA at -O0 (tests.helpers.cpu_env): no result here is compared with one compiled otherwise.
cli = functools.partial(finetune_cli, fast_compile=True)


def refused(*command_lines) -> list:
  """Fine-tuning runs of (config, workdir, *overrides) that stop at start-up, for the start-up cost of one process
  (tests.cli_forks): the finished processes."""
  return run_each([[f"--config={config}", f"--workdir={workdir}", "--mode=train", *overrides]
                   for config, workdir, *overrides in command_lines], cpu_env())


@pytest.mark.slow
@pytest.mark.parametrize("task", ["cola", "sst-2", "mrpc", "sts-b", "qqp", "mnli", "qnli", "rte", "wnli"])
def test_glue_task_trains_evaluates_and_predicts(shared_data, tmp_path, task):
  root = glue_data(shared_data, task, tmp_path / "glue")
  result = cli(f"experiments/glue.py:task={task},size=tiny,data={root},spm={spm(shared_data)}", tmp_path / "run",
               *TINY_RUN)
  assert result.returncode == 0, result.stdout + result.stderr
  best = json.load(open(tmp_path / "run" / "best" / "best.json"))
  assert best["step"] in (2, 4) and best["metric"] in best["metrics"]
  assert (Path(best["weights"]) / "dev_predictions.tsv").exists()
  logged = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  assert any("loss" in row for row in logged) and any(f"dev/{best['metric']}" in row for row in logged)
  if task == "mnli":
    assert any("dev/dev_mismatched/accuracy" in row for row in logged)
  if task == "sst-2":  # --mode=predict on a user's own file, with the best checkpoint
    user = tmp_path / "mine.tsv"
    user.write_text("text_a\na gripping , beautiful film\nthe plot is a mess\n")
    out = cli(f"experiments/glue.py:task={task},size=tiny,data={root},spm={spm(shared_data)}", tmp_path / "run",
              *TINY_RUN, mode="predict", extra=[f"--input={user}", f"--output={tmp_path / 'mine_predictions.tsv'}"])
    assert out.returncode == 0, out.stderr
    assert len((tmp_path / "mine_predictions.tsv").read_text().strip().splitlines()) == 3  # header + 2


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
def test_squad_trains_and_writes_predictions(shared_data, tmp_path, version):
  data = squad_data(shared_data, tmp_path / "squad", version)
  result = cli(f"experiments/squad_v{version}.py:size=tiny,data={data},spm={spm(shared_data)}", tmp_path / "run",
               *TINY_RUN, "--config.data.max_seq_length=128", "--config.data.doc_stride=64",
               "--config.data.max_query_length=32")
  assert result.returncode == 0, result.stdout + result.stderr
  best = json.load(open(tmp_path / "run" / "best" / "best.json"))
  predictions_path = Path(best["weights"]) / "dev_predictions.json"
  dev = json.load(open(data / f"dev-v{'1.1' if version == 1 else '2.0'}.json"))["data"]
  assert set(json.load(open(predictions_path))) == {q["id"] for a in dev for p in a["paragraphs"] for q in p["qas"]}
  if version == 1:
    assert {"exact_match", "f1"} <= set(best["metrics"])
  else:
    assert {"best_f1", "best_f1_thresh", "HasAns_total", "NoAns_total"} <= set(best["metrics"])
    assert best["metrics"]["NoAns_total"] == 6
    assert Path(null_odds_path(str(predictions_path))).exists()


@pytest.mark.slow
def test_race_trains_and_writes_answers(shared_data, tmp_path):
  root = tmp_path / "race"
  for split, files in (("train", slice(0, 6)), ("dev", slice(6, 9))):
    for level in ("middle", "high"):
      target = root / split / level
      target.mkdir(parents=True)
      for name in sorted(os.listdir(shared_data / "race" / "dev" / level))[files]:
        shutil.copy(shared_data / "race" / "dev" / level / name, target / name)
  result = cli(f"experiments/race.py:size=tiny,data={root},spm={spm(shared_data)}", tmp_path / "run", *TINY_RUN,
               "--config.data.max_seq_length=128", "--config.data.max_qa_length=32")
  assert result.returncode == 0, result.stdout + result.stderr
  best = json.load(open(tmp_path / "run" / "best" / "best.json"))
  assert {"accuracy", "accuracy_middle", "accuracy_high"} <= set(best["metrics"])
  assert (Path(best["weights"]) / "dev_predictions.json").exists()


def test_fine_tuning_without_weights_too_long_inputs_or_a_dev_subset_is_refused(shared_data, tmp_path):
  root = glue_data(shared_data, "rte", tmp_path / "glue")
  config = f"experiments/glue.py:task=rte,size=tiny,data={root},spm={spm(shared_data)}"
  too_long, result, ignored = refused(
      (config, tmp_path / "run", "--config.train.num_train_steps=1"),  # recipe 512 > tiny's 128 positions
      (config, tmp_path / "run", "--config.train.num_train_steps=1", "--config.data.max_seq_length=64"),
      (config, tmp_path / "run", "--config.data.max_seq_length=64", "--config.allow_random_init=True",
       "--config.train.eval_batches=2"))  # refused, not ignored with the whole dev split scored
  assert too_long.returncode != 0
  assert "data.max_seq_length=512 exceeds model.max_position_embeddings=128" in too_long.stderr
  assert result.returncode != 0
  assert "No pretrained weights" in result.stderr and "allow_random_init" in result.stderr
  assert ignored.returncode == 1 and ignored.stderr.strip().splitlines()[-1].startswith(
      "error: train.eval_batches=2 limits pretraining's held-out evaluation; fine-tuning scores the whole dev split")


@pytest.mark.slow
def test_warm_start_from_pretraining_then_ax_predictions_with_the_mnli_model(shared_data, tmp_path):
  """Pretrain (tiny, synthetic) -> fine-tune MNLI from it -> AX predictions with the MNLI model."""
  pre = cli("experiments/pretrain_tiny.py:synthetic", tmp_path / "pre", "--config.model.vocab_size=30000",
            "--config.model.hidden_size=64", "--config.model.intermediate_size=256",
            "--config.model.num_hidden_layers=2", "--config.train.num_train_steps=2", "--config.data.max_seq_length=64",
            "--config.train.global_batch_size=4", "--config.train.eval_every=0", "--config.checkpoint.every=2",
            "--config.train.warmup_steps=1")
  assert pre.returncode == 0, pre.stderr
  root = glue_data(shared_data, "mnli", tmp_path / "glue")
  test_rows = lambda count: [(i, i, f"{i}t", "fiction", *["()"] * 4, a, b)
                             for i, (a, b, _) in enumerate(rte_pairs(shared_data, count))]
  test_header = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                 "sentence1_parse", "sentence2_parse", "sentence1", "sentence2")
  write_tsv(root / "MNLI" / "test_matched.tsv", test_header, test_rows(3))
  write_tsv(root / "MNLI" / "test_mismatched.tsv", test_header, test_rows(4))
  write_tsv(root / "diagnostic" / "diagnostic.tsv", ("index", "sentence1", "sentence2"),
            [(i, a, b) for i, (a, b, _) in enumerate(rte_pairs(shared_data, 5))])
  overrides = [o for o in TINY_RUN if "allow_random_init" not in o]
  mnli_config = f"experiments/glue.py:task=mnli,size=tiny,data={root},spm={spm(shared_data)}"
  mnli = cli(mnli_config, tmp_path / "mnli", *overrides, f"--config.init_checkpoint={tmp_path / 'pre'}")
  assert mnli.returncode == 0, mnli.stderr
  assert "Warm start from" in mnli.stdout and "albert/" not in mnli.stdout.split("freshly initialised:")[1].split("\n")[0]
  # The MNLI run predicts matched, mismatched and AX; dev_mismatched is scored and written next to dev.
  assert [len((tmp_path / "mnli" / name).read_text().splitlines()) for name in ("MNLI-m.tsv", "MNLI-mm.tsv",
                                                                                 "AX.tsv")] == [4, 5, 6]
  best = json.load(open(tmp_path / "mnli" / "best" / "best.json"))
  assert "dev_mismatched/accuracy" in best["metrics"]
  assert (Path(best["weights"]) / "dev_mismatched_predictions.tsv").exists()
  split = cli(mnli_config, tmp_path / "mnli", *overrides, mode="predict",
              extra=["--split=dev_mismatched", f"--output={tmp_path / 'mm.tsv'}"])
  assert split.returncode == 0, split.stderr
  assert len((tmp_path / "mm.tsv").read_text().splitlines()) == 1 + 24
  submission = subprocess.run([sys.executable, "-m", "albert_jax.glue_submission", "--runs", str(tmp_path / "mnli"),
                               "--out", str(tmp_path / "submission"), "--allow_partial", "--no_check_counts"],
                              cwd=REPO, capture_output=True, text=True)
  assert submission.returncode == 0, submission.stderr
  assert sorted(p.name for p in (tmp_path / "submission").iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
  ax = cli(f"experiments/glue.py:task=ax,size=tiny,data={root},spm={spm(shared_data)}", tmp_path / "ax",
           *overrides, "--config.train.num_train_steps=0", f"--config.init_checkpoint={best['weights']}")
  assert ax.returncode == 0, ax.stderr
  assert len((tmp_path / "ax" / "AX.tsv").read_text().strip().splitlines()) == 6


def _best_dir(workdir):
  best = json.load(open(workdir / "best" / "best.json"))
  step_dir = Path(best.pop("weights"))
  assert [p.name for p in (workdir / "best").glob("step_*")] == [step_dir.name]  # older steps deleted
  params = jax.tree.map(np.asarray, store.load_pretrained(str(step_dir))[1])
  return best, params, (step_dir / "dev_predictions.tsv").read_text(), (workdir / "RTE.tsv").read_text()


@pytest.mark.slow
def test_two_processes_fine_tune_to_the_same_best_as_one_process(shared_data, tmp_path):
  """learning_rate=0 makes every evaluation after the first non-improving: the case where processes that keep
  different records disagree about entering the collective save of best/ (and deadlock). Warm start, best/ and
  the test predictions all load weights that must reach every process's devices."""
  root = glue_data(shared_data, "rte", tmp_path / "glue")
  write_tsv(root / "RTE" / "test.tsv", ("index", "sentence1", "sentence2"),
            [(i, a, b) for i, (a, b, _) in enumerate(rte_pairs(shared_data, 5))])
  arg = f"task=rte,size=tiny,data={root},spm={spm(shared_data)}"
  model_config = model_config_from(glue_experiment.get_config(arg)).replace(num_hidden_layers=2)
  backbone = jax.jit(lambda key: model_lib.init_params(model_lib.AlbertModel(model_config), key))(jax.random.key(1))
  store.save_pretrained(str(tmp_path / "init"), model_config, {"albert": backbone})
  run = [*(o for o in TINY_RUN if "allow_random_init" not in o), f"--config.init_checkpoint={tmp_path / 'init'}",
         "--config.train.num_train_steps=3", "--config.train.eval_every=1", "--config.train.learning_rate=0",
         "--config.checkpoint.async_save=false"]
  single = cli(f"experiments/glue.py:{arg}", tmp_path / "single", *run, devices=2)
  assert single.returncode == 0, single.stdout + single.stderr
  port = free_port()
  procs = [cli(f"experiments/glue.py:{arg}", tmp_path / "multi", *run, devices=1, wait=False,
               extra=[f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}"])
           for i in range(2)]
  outputs = communicate_all(procs, timeout=600)
  assert all(p.returncode == 0 for p in procs), outputs
  assert outputs[0].count("(best: step 1,") == 3  # steps 2 and 3 did not improve
  one, multi = _best_dir(tmp_path / "single"), _best_dir(tmp_path / "multi")
  assert one[0] == multi[0] and one[0]["step"] == 1
  jax.tree.map(np.testing.assert_array_equal, one[1], multi[1])
  assert one[2:] == multi[2:]


def test_warm_start_refuses_a_head_count_that_no_weight_shape_shows(tmp_path):
  """The xlarge v2 TF-Hub weights have 32 heads, the `xlarge` size 16: converting records 32, fine-tuning must
  not silently run them with 16."""
  config = glue_experiment.get_config("task=rte,size=tiny")
  model_config = model_config_from(config)
  backbone = jax.eval_shape(lambda: model_lib.init_params(model_lib.AlbertModel(model_config), jax.random.key(0)))
  backbone = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nn.unbox(backbone))
  store.save_pretrained(str(tmp_path / "init"), model_config.replace(num_attention_heads=8), {"albert": backbone})
  config.init_checkpoint = str(tmp_path / "init")
  config.data.max_seq_length = 64  # the recipe's 512 exceeds the tiny model's positions
  task = finetune.get_task(config)
  with pytest.raises(ValueError, match="num_attention_heads=8 but this run has 4.*--config.model.num_attention_heads=8"):
    weights = resolve(config.init_checkpoint, config)
    finetune._warm_start(config, task, task.build_model(model_config), weights)


def test_weights_refused_at_start_up_leave_no_workdir(shared_data, tmp_path):
  """Weights of another shape, or a missing init_checkpoint, are refused before the run writes head.json,
  checkpoints/ or compilation_cache/ into its new workdir."""
  root = glue_data(shared_data, "rte", tmp_path / "glue")
  config = f"experiments/glue.py:task=rte,size=tiny,data={root},spm={spm(shared_data)}"
  model_config = model_config_from(glue_experiment.get_config("task=rte,size=tiny")).replace(vocab_size=300)
  backbone = jax.eval_shape(lambda: model_lib.init_params(model_lib.AlbertModel(model_config), jax.random.key(0)))
  store.save_pretrained(str(tmp_path / "init"), model_config,
                        {"albert": jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nn.unbox(backbone))})
  cases = ((tmp_path / "init", f"init_checkpoint={tmp_path / 'init'} was saved with model.vocab_size=300 but this run "
                               "has 30000; "),
           (tmp_path / "missing", "is neither a pretrained-weights directory"))
  results = refused(*((config, tmp_path / f"run{i}", "--config.train.num_train_steps=1",
                       "--config.data.max_seq_length=64", f"--config.init_checkpoint={init}",
                       "--config.model.vocab_size=30000")  # the spm's, not the weights'
                      for i, (init, _) in enumerate(cases)))
  for i, ((_, message), result) in enumerate(zip(cases, results)):
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / f"run{i}").exists()


@pytest.mark.slow  # about 30 s: an in-process run compiled at XLA's default level
def test_early_stopping_ends_training_after_patience_evaluations_without_a_better_dev_score(shared_data, tmp_path,
                                                                                          capsys):
  """Dev is one sentence under both labels: accuracy 0.5 at every evaluation, so none beats step 1's. Patience 2,
  one evaluation a step: the run stops at step 3 of 40, saying why, its best checkpoint step 1's; rerun, it trains
  nothing and stops again."""
  from tests.helpers import config_for, write_split
  data = tmp_path / "data"
  data.mkdir()
  write_split(data / "train.tsv", 8)
  (data / "dev.tsv").write_text("sentence\tlabel\na fine film\tpos\na fine film\tneg\n")
  config = config_for(data, spm(shared_data))
  config.train.update(num_train_steps=40, eval_every=1, early_stopping_patience=2)
  config.checkpoint.update(every=40, async_save=False)
  said = "Early stopping at step 3: no better dev accuracy than step 1's 0.5000 in train.early_stopping_patience=2 " \
         "evaluations."
  for _ in range(2):
    finetune.train(config, Run(str(tmp_path / "run")))
    out = capsys.readouterr().out
    assert said in out, out
    assert "dev at step 4" not in out
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["3"]
  assert read_best(Run(str(tmp_path / "run")))["step"] == 1
  assert config_for(data, spm(shared_data)).train.early_stopping_patience == 0  # off by default
