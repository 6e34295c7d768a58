"""Our metrics against independent implementations (scikit-learn, scipy, the official SQuAD rules written out
in tests/squad_official.py from their published definition) on real dev labels with deterministic perturbations."""
import json

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from albert_jax.tasks import metrics, squad_metrics
from albert_jax.tasks import get_task
from experiments import glue
from tests.squad_official import official_v1, official_v2


def _glue_labels(shared_data, task):
  config = glue.get_config(f"task={task},data={shared_data / 'glue'}")
  t = get_task(config)
  return np.asarray([ex.label for ex in t.read_examples(t.split_path("dev"), labeled=True)])


def _flip_every(labels, k, num_classes=2):
  pred = labels.copy()
  pred[::k] = (pred[::k] + 1) % num_classes
  return pred


@pytest.mark.parametrize("task", ["cola", "mrpc", "rte", "sst-2", "wnli"])
def test_classification_metrics_match_sklearn(shared_data, task):
  labels = _glue_labels(shared_data, task)
  for k in (2, 3, 7):
    pred = _flip_every(labels, k)
    assert metrics.accuracy(labels, pred) == pytest.approx(sklearn.metrics.accuracy_score(labels, pred))
    assert metrics.f1_binary(labels, pred) == pytest.approx(sklearn.metrics.f1_score(labels, pred))
    assert metrics.matthews_corrcoef(labels, pred) == pytest.approx(sklearn.metrics.matthews_corrcoef(labels, pred))


def test_matthews_degenerate_and_multiclass():
  assert metrics.matthews_corrcoef([1, 1, 0], [1, 1, 1]) == sklearn.metrics.matthews_corrcoef([1, 1, 0], [1, 1, 1])
  rng = np.random.default_rng(0)
  truth, pred = rng.integers(0, 3, 500), rng.integers(0, 3, 500)
  pred[:300] = truth[:300]
  assert metrics.matthews_corrcoef(truth, pred) == pytest.approx(sklearn.metrics.matthews_corrcoef(truth, pred))


def test_regression_metrics_match_scipy(shared_data):
  scores = _glue_labels(shared_data, "sts-b")  # many ties: scores are multiples of 0.2 / 0.25
  pred = scores + np.sin(np.arange(len(scores))) * 1.3
  rounded = np.round(pred)  # ties on the prediction side too
  for p in (pred, rounded):
    assert metrics.pearson(scores, p) == pytest.approx(scipy.stats.pearsonr(scores, p)[0], abs=1e-12)
    assert metrics.spearman(scores, p) == pytest.approx(scipy.stats.spearmanr(scores, p)[0], abs=1e-12)


def perturbed_answer(i, qa):
  """Deterministic variants of a real gold answer covering every normalisation rule and partial overlaps."""
  text = qa["answers"][i % len(qa["answers"])]["text"]
  words = text.split()
  return [text, text.upper() + ".", "The " + text, " ".join(words[1:]), text + " and more words", "",
          f'"{text}"', words[0] if words else "x", "unrelated"][i % 9]


@pytest.fixture(scope="module")
def squad_dev(shared_data):
  with open(shared_data / "squad" / "dev-v1.1.json") as f:
    return json.load(f)["data"]


def test_squad_v1_scores_match_official(squad_dev):
  predictions = {qa["id"]: perturbed_answer(i, qa) for i, qa in
                 enumerate(qa for a in squad_dev for p in a["paragraphs"] for qa in p["qas"])}
  del predictions[next(iter(predictions))]  # a missing prediction counts as 0
  gold = {qa["id"]: [a["text"] for a in qa["answers"]] for a in squad_dev for p in a["paragraphs"] for qa in p["qas"]}
  ours = squad_metrics.evaluate_v1(gold, predictions)
  official = official_v1(squad_dev, predictions)
  assert ours == pytest.approx(official, abs=1e-9)
  assert 20 < ours["exact_match"] < 60


def test_squad_v2_scores_match_official(squad_dev):
  # v2-style gold: every 4th question unanswerable (answers emptied).
  dataset = json.loads(json.dumps(squad_dev[:10]))
  qas = [qa for a in dataset for p in a["paragraphs"] for qa in p["qas"]]
  for i, qa in enumerate(qas):
    if i % 4 == 0:
      qa["answers"] = []
  preds = {qa["id"]: perturbed_answer(i, qa) if qa["answers"] else ["", "some span"][i % 2]
           for i, qa in enumerate(qas)}
  na_probs = {qa["id"]: float(np.sin(i * 1.7)) for i, qa in enumerate(qas)}
  gold = {qa["id"]: [a["text"] for a in qa["answers"]] for qa in qas}
  for thresh in (0.0, 0.5, 1.0):
    ours = squad_metrics.evaluate_v2(gold, preds, na_probs, thresh)
    official = official_v2(dataset, preds, na_probs, thresh)
    assert {k: v for k, v in ours.items() if not k.endswith("total")} == pytest.approx(official, abs=1e-9)
    assert ours["total"] == len(qas) and ours["NoAns_total"] == sum(1 for qa in qas if not qa["answers"])
  assert ours["best_f1"] >= ours["f1"]


def test_squad_v2_best_threshold_reproduces_best_f1_when_no_answer_everywhere_wins(squad_dev):
  """Null-score odds can be negative. When "no answer" for every question scores best, the threshold lies below
  every odds (the official script's starting threshold 0.0 would answer the questions with odds <= 0), and
  rescoring at it gives best_f1 again."""
  qas = [qa for a in squad_dev[:2] for p in a["paragraphs"] for qa in p["qas"]][:40]
  gold = {qa["id"]: [a["text"] for a in qa["answers"]] if i % 3 else [] for i, qa in enumerate(qas)}
  preds = {qid: "unrelated words" for qid in gold}  # every span wrong: answering never helps
  na_probs = {qid: -0.5 + 0.01 * i for i, qid in enumerate(gold)}  # -0.5 .. -0.11
  best = squad_metrics.evaluate_v2(gold, preds, na_probs, 0.0)
  assert best["best_f1_thresh"] < min(na_probs.values())
  rescored = squad_metrics.evaluate_v2(gold, preds, na_probs, best["best_f1_thresh"])
  assert rescored["f1"] == pytest.approx(best["best_f1"]) == pytest.approx(100 * 14 / 40)
