"""A fine-tuning workdir's weights are used only as what they are: a restarted run drops a best/ it never
produced, eval and predict refuse a head trained for another task or class order (and reuse the recorded order
when none is given), and init_checkpoint=<a fine-tuning run> loads that run's best weights, saying which."""
import json
import types

import jax
import numpy as np
import pytest

from albert_jax import finetune, job_kinds
from albert_jax.model_config import model_config_from
from albert_jax.run import Run
from albert_jax.run.best import read_best
from albert_jax.run.best_keeper import BestKeeper
from albert_jax.tasks import get_task
from albert_jax.weights import loading, store
from experiments import glue
from tests.helpers import config_for, quietly, spm, write_split


@pytest.fixture(scope="module")
def run(shared_data, tmp_path_factory):
  """A 4-step run trained with labels=pos|neg (not the sorted order) in a workdir holding another run's best/ of
  step 60 (killed before any checkpoint). About 20 s: the tests using it are marked slow."""
  root = tmp_path_factory.mktemp("identity")
  data = root / "data"
  data.mkdir()
  write_split(data / "train.tsv", 16)
  write_split(data / "dev.tsv", 8)
  write_split(data / "test.tsv", 4, labeled=False)
  workdir = root / "run"
  config = config_for(data, spm(shared_data), labels="pos|neg")
  task, model_config = get_task(config), model_config_from(config)
  stale = workdir / "best" / "step_60"
  store.save_pretrained(str(stale), model_config, task.init_params(task.build_model(model_config),
                                                                   jax.random.key(1)))
  (workdir / "best" / "best.json").write_text(json.dumps(
      {"step": 60, "metric": "accuracy", "value": 1.0, "metrics": {"accuracy": 1.0}, "weights": str(stale)}))
  output = quietly(finetune.train, config, Run(str(workdir)))
  return types.SimpleNamespace(data=data, spm=spm(shared_data), workdir=workdir, output=output)


@pytest.mark.slow
def test_a_restart_drops_the_best_of_steps_it_scores_again(run):
  assert "this run continues from step 0 and scores the steps after it again" in run.output
  best = read_best(Run(str(run.workdir)))
  assert best["step"] in (2, 4) and "(best: step 60," not in run.output
  assert [p.name for p in (run.workdir / "best").glob("step_*")] == [f"step_{best['step']}"]
  assert best["head"] == {"task": "classification", "task_name": "", "labels": ["pos", "neg"]}


def test_a_resumed_run_keeps_the_best_of_steps_before_its_checkpoint(shared_data, tmp_path):
  workdir = tmp_path / "run"
  (workdir / "best" / "step_2").mkdir(parents=True)
  record = {"step": 2, "metric": "accuracy", "value": 0.5, "weights": str(workdir / "best" / "step_2")}
  (workdir / "best" / "best.json").write_text(json.dumps(record))
  config = config_for(tmp_path, spm(shared_data), labels="neg|pos")
  task = get_task(config)
  assert BestKeeper(Run(str(workdir)), task, model_config_from(config), 2).record == record
  assert BestKeeper(Run(str(workdir)), task, model_config_from(config), 1).record is None
  assert not (workdir / "best" / "best.json").exists() and not (workdir / "best" / "step_2").exists()


def test_a_best_record_by_another_metric_is_replaced_by_the_first_score(shared_data, tmp_path):
  """A tagging run resumed from before parts of speech were scored by accuracy holds an entity-F1 record; an
  accuracy of 0.3 does not compare with an F1 of 0.9."""
  workdir = tmp_path / "run"
  (workdir / "best").mkdir(parents=True)
  (workdir / "best" / "best.json").write_text(json.dumps({"step": 2, "metric": "f1", "value": 0.9,
                                                          "weights": str(workdir / "best" / "step_2")}))
  keeper = BestKeeper(Run(str(workdir)), get_task(config_for(tmp_path, spm(shared_data), labels="neg|pos")), None, 2)
  assert keeper.record["metric"] == "f1" and keeper.is_better(0.3)
  keeper.record = {"step": 2, "metric": "accuracy", "value": 0.9}
  assert not keeper.is_better(0.3) and keeper.is_better(0.95)


@pytest.mark.slow
def test_predict_without_labels_uses_the_order_recorded_at_training(run, tmp_path):
  texts = tmp_path / "in.tsv"
  write_split(texts, 3, labeled=False)
  args = job_kinds.RunArgs(input=str(texts), output=str(tmp_path / "out.jsonl"))
  finetune.predict(config_for(run.data, run.spm), Run(str(run.workdir)), args)  # sorted would be neg|pos
  rows = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
  assert len(rows) == 3 and all(list(r["probabilities"]) == ["pos", "neg"] for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("labels", ["neg|pos", "neg|pos|meh"])
def test_eval_refuses_another_class_order_or_count(run, labels):
  with pytest.raises(ValueError, match=r"labels=pos\|neg.*labels=neg\|pos.*pass labels=pos\|neg"):
    finetune.evaluate(config_for(run.data, run.spm, labels=labels), Run(str(run.workdir)))
  assert not (run.workdir / "dev_predictions.jsonl").exists()


@pytest.mark.slow
def test_eval_refuses_a_workdir_of_another_task(run, tmp_path):
  (tmp_path / "CoLA").mkdir()
  (tmp_path / "CoLA" / "dev.tsv").write_text("".join(f"src\t{i % 2}\t\ta fine film\n" for i in range(4)))
  config = glue.get_config(f"task=cola,size=tiny,spm={run.spm},data={tmp_path}")
  config.data.max_seq_length = 16
  with pytest.raises(ValueError, match="task=classification.*task=glue, task_name=cola.*config.json"):
    finetune.evaluate(config, Run(str(run.workdir)))
  assert not (run.workdir / "dev_predictions.tsv").exists()


@pytest.mark.slow
def test_resuming_with_another_class_order_is_refused(run):
  with pytest.raises(ValueError, match=r"checkpoint step 4\) holds a head trained for .*labels=pos\|neg"):
    finetune.train(config_for(run.data, run.spm, labels="neg|pos"), Run(str(run.workdir)))


@pytest.mark.slow
def test_init_checkpoint_of_a_fine_tuning_run_loads_its_best_weights(run, capsys):
  best = read_best(Run(str(run.workdir)))
  loaded = loading.load_init_params(str(run.workdir))
  assert f"loading the best dev checkpoint of the fine-tuning run (step {best['step']}," in capsys.readouterr().out
  jax.tree.map(np.testing.assert_array_equal, loaded, store.load_pretrained(best["weights"])[1])


def test_a_workdir_without_weights_is_named_as_the_workdir(shared_data, tmp_path):
  with pytest.raises(FileNotFoundError, match=f"--workdir='{tmp_path}' is neither"):
    finetune.evaluate(config_for(tmp_path, spm(shared_data), labels="neg|pos"), Run(str(tmp_path)))


def saved_weights(path, config, drop_head=False):
  """A converted-weights directory of `config`'s task model, with or without its classifier head."""
  model_config = model_config_from(config)
  task = get_task(config)
  params = jax.device_get(task.init_params(task.build_model(model_config), jax.random.key(1)))
  if drop_head:
    params = {k: v for k, v in params.items() if k == "albert"}
  store.save_pretrained(str(path), model_config, params)
  return str(path)


def test_eval_of_weights_without_a_task_head_names_the_head_not_a_flax_error(shared_data, tmp_path):
  """A pretraining run passed as --workdir of eval/predict is refused naming the missing head, not with flax's
  ScopeParamNotFoundError."""
  write_split(tmp_path / "dev.tsv", 4)
  config = config_for(tmp_path, spm(shared_data), labels="neg|pos")
  weights = saved_weights(tmp_path / "pretrained", config, drop_head=True)
  with pytest.raises(ValueError, match=r"(?s)--workdir=.*holds no head trained for this task:\n  classifier/bias: "
                                       r"expected shape \(2,\), found missing.*run fine-tuned for this task"):
    finetune.evaluate(config, Run(weights))


def test_predicting_with_another_tasks_head_says_so_not_backbone(shared_data, tmp_path):
  """num_train_steps=0 (GLUE AX with the MNLI run) with a 2-class head for 3 classes is reported as another task's
  head, not as a backbone mismatch with advice to check the model size."""
  write_split(tmp_path / "test.tsv", 4, labeled=False)
  weights = saved_weights(tmp_path / "rte_like", config_for(tmp_path, spm(shared_data), labels="neg|pos"))
  config = config_for(tmp_path, spm(shared_data), labels="neg|pos|meh")
  config.train.num_train_steps, config.init_checkpoint = 0, weights
  with pytest.raises(ValueError, match=r"(?s)init_checkpoint holds no head trained for this task:\n  classifier/"
                                       r"bias: expected shape \(3,\), found shape \(2,\).*for AX, the MNLI run's"):
    finetune.predict_test(config, Run(str(tmp_path / "out")))
