"""Multi-label classification on your own data (`experiments/classification.py:multi_label=true`): the loss, the
metrics and the tuned thresholds by hand and against scikit-learn; the label cells read strictly; and a tiny run
on keyword-labelled texts that trains, keeps its thresholds with the best checkpoint, evaluates, predicts with them
and exports a transformers model that computes our logits, probabilities and loss."""
import json
import math
import random
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sklearn.metrics

from albert_jax import buckets, convert, finetune, job_kinds
from albert_jax.errors import InputError
from albert_jax.head_identity import SEQUENCE_CLASSIFICATION, HFHead, check_identity
from albert_jax.model_config import model_config_from
from albert_jax.run import Run
from albert_jax.run.best import read_best
from albert_jax.tasks import get_task, make_tokenizer, metrics
from albert_jax.tasks.base import MODEL_INPUTS
from albert_jax.tasks.classification import THRESHOLDS_FILE, binary_cross_entropy
from albert_jax.weights import store
from experiments import classification
from tests.helpers import quietly, require_module, spm, task_of

CLASSES = {"animals": ("cat", "dog"), "food": ("bread", "cheese"), "sports": ("football", "tennis")}
FILLER = "the a we saw some very nice old new in on at today yesterday".split()
METRICS = {"micro_f1", "macro_f1", "subset_accuracy", "tuned_micro_f1", "tuned_macro_f1", "tuned_subset_accuracy"}


def keyword_rows(rng, count):
  """(text, label cell): each class present with probability 0.4, said by one of its keywords among filler."""
  rows = []
  for _ in range(count):
    classes = [name for name in sorted(CLASSES) if rng.random() < 0.4]
    words = rng.sample(FILLER, 3) + [rng.choice(CLASSES[name]) for name in classes]
    rng.shuffle(words)
    rows.append((" ".join(words), "|".join(classes)))
  return rows


def multi_hot(cell: str) -> list[bool]:
  return [name in cell.split("|") for name in sorted(CLASSES)]


def chosen(probabilities: dict, thresholds) -> str:
  """The label cell a predictions row should hold; 1e-6 below each threshold, as the file rounds probabilities."""
  return "|".join(name for (name, p), t in zip(probabilities.items(), thresholds, strict=True) if p >= t - 1e-6)


def json_lines(path) -> list[dict]:
  return [json.loads(line) for line in open(path)]


# ------------------------------------------------------------------------------------- by hand

def test_binary_cross_entropy_is_the_mean_over_rows_and_classes_by_hand():
  logits, labels = jnp.asarray([[0.0, 2.0], [-1.0, 3.0]]), jnp.asarray([[1, 0], [0, 1]])
  loss, exact = binary_cross_entropy(logits, labels)
  terms = [math.log(2), math.log(1 + math.e ** 2), math.log(1 + math.e ** -1), math.log(1 + math.e ** -3)]
  assert float(loss) == pytest.approx(sum(terms) / 4, rel=1e-6)
  assert float(exact) == 0.5  # row 0 predicts both classes (logit 0 is probability 0.5), row 1 exactly its class


def test_f1_and_subset_accuracy_by_hand_and_as_scikit_learn():
  gold = np.asarray([[1, 0, 0], [1, 1, 0], [0, 0, 0]])
  predicted = np.asarray([[1, 0, 0], [0, 1, 0], [1, 0, 0]])
  # class 0: TP 1, 2 labelled, 2 predicted -> 2/4; class 1: 1; class 2 neither labelled nor predicted -> 0
  assert metrics.multi_label_scores(gold, predicted) == {"micro_f1": 4 / 6, "macro_f1": 0.5, "subset_accuracy": 1 / 3}
  rng = np.random.default_rng(0)
  gold, predicted = rng.random((40, 5)) < 0.3, rng.random((40, 5)) < 0.3
  predicted[:, 4] = gold[:, 4] = False  # a class neither labelled nor predicted
  ours = metrics.multi_label_scores(gold, predicted)
  assert ours["micro_f1"] == pytest.approx(sklearn.metrics.f1_score(gold, predicted, average="micro"))
  assert ours["macro_f1"] == pytest.approx(sklearn.metrics.f1_score(gold, predicted, average="macro",
                                                                    zero_division=0))
  assert ours["subset_accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(gold, predicted))


def test_each_class_gets_the_threshold_of_its_best_f1_by_hand():
  gold = np.asarray([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]])
  probabilities = np.asarray([[0.9, 0.6, 0.7, 0.9], [0.8, 0.6, 0.2, 0.6], [0.3, 0.2, 0.1, 0.5], [0.1, 0.4, 0.4, 0.4]])
  # class 0: t=0.9 F1 2/3, 0.8 2/4, 0.3 4/5, 0.1 4/6; class 1: the two rows at 0.6 go together (2/3 beats 2/4, 2/5);
  # class 2 has no positive: 0.5 kept; class 3: 0.9 and 0.4 both give 2/3, the higher wins
  thresholds = metrics.best_thresholds(gold, probabilities)
  np.testing.assert_array_equal(thresholds, [0.3, 0.6, 0.5, 0.9])
  tuned = metrics.multi_label_scores(gold, probabilities >= thresholds)
  assert tuned["macro_f1"] == pytest.approx((4 / 5 + 2 / 3 + 0 + 2 / 3) / 4)


# ------------------------------------------------------------------------------------- reading

def write_cells(path, cells):
  path.write_text("text\tlabel\n" + "".join(f"row {i}\t{cell}\n" for i, cell in enumerate(cells)))


def test_label_cells_give_multi_hot_rows_and_the_sorted_union_of_the_train_files_classes(tmp_path):
  write_cells(tmp_path / "train.tsv", ["10|2", "", "1", " "])
  task = task_of(classification, f"multi_label=true,data={tmp_path}")
  assert task.labels == ("1", "2", "10") and task.metric_name == "micro_f1"
  assert [ex.label for ex in task.read_examples(str(tmp_path / "train.tsv"), True)] == [
      (0, 1, 1), (0, 0, 0), (1, 0, 0), (0, 0, 0)]
  ordered = task_of(classification, f"multi_label=true,data={tmp_path},labels=10|2|1")
  assert ordered.labels == ("10", "2", "1") and ordered.dummy_batch(2)["label"].shape == (2, 3)
  assert ordered.hf_head.problem_type == "multi_label_classification"


@pytest.mark.parametrize("cell, message", [
    ("a|sport", r"dev.tsv:3: unknown label 'sport'; expected one of \['a', 'b', 'sports'\]"),
    ("a| sports", r"dev.tsv:3: unknown label ' sports' \(did you mean 'sports'\?\)"),
    ("b|a|b", r"dev.tsv:3: label 'b\|a\|b' names class 'b' twice; list each class once"),
    ("a||b", r"dev.tsv:3: label 'a\|\|b' has an empty class between its '\|' separators"),
    ("b|", r"dev.tsv:3: label 'b\|' has an empty class"),
    ("a|b\x07", r"dev.tsv:3: label 'b\\x07' holds the control character '\\x07'")],
    ids=["unknown", "spaced", "twice", "empty", "trailing", "control"])
def test_a_bad_label_cell_is_one_line_naming_file_and_line(tmp_path, cell, message):
  write_cells(tmp_path / "dev.tsv", ["a", cell])
  task = task_of(classification, "multi_label=true,labels=a|b|sports")
  with pytest.raises(InputError, match=message) as refused:
    task.read_examples(str(tmp_path / "dev.tsv"), True)
  assert "\n" not in str(refused.value)


def test_settings_that_cannot_be_multi_label_are_refused(tmp_path):
  with pytest.raises(InputError, match=r"name 'a\|b' holds the separator: .* rename the class"):
    task_of(classification, "multi_label=true", labels=("a|b", "c"))
  with pytest.raises(InputError, match="data.regression=True has one output, multi-label classification one per"):
    task_of(classification, "multi_label=true,regression=true")
  with pytest.raises(InputError, match=r"names one class; a classifier needs two or more"):
    task_of(classification, "multi_label=true,labels=a")
  write_cells(tmp_path / "train.tsv", ["a", "", "a"])
  with pytest.raises(InputError, match=r"train.tsv: column 'label' has 1 distinct label\(s\) \['a'\]; a classifier "
                                       r"needs two or more \(a row may list several, separated by '\|'\)"):
    task_of(classification, f"multi_label=true,data={tmp_path}").labels


def test_a_train_file_that_names_no_class_is_refused_and_a_dev_file_may(tmp_path):
  """Every target all zeros trained a classifier to predict no class, with nothing said (issue #48)."""
  write_cells(tmp_path / "train.tsv", ["", " ", ""])
  write_cells(tmp_path / "dev.tsv", ["", ""])
  task = task_of(classification, f"multi_label=true,data={tmp_path},labels=a|b")
  with pytest.raises(InputError) as refused:
    task.read_examples(str(tmp_path / "train.tsv"), True)
  assert str(refused.value) == (f"{tmp_path / 'train.tsv'}: no row names a class (column 'label' is empty on all 3 "
                                "rows); a classifier trained on it learns to predict none: label the rows (classes "
                                "separated by '|'), or point data.label_column at the column that holds them.")
  assert [ex.label for ex in task.read_examples(str(tmp_path / "dev.tsv"), True)] == [(0, 0), (0, 0)]


def test_heads_for_one_class_per_row_and_for_several_are_not_read_as_each_other():
  single, multi = (task_of(classification, f"labels=a|b{arg}") for arg in ("", ",multi_label=true"))
  with pytest.raises(InputError, match=r"--workdir=RUN holds a head trained for task=multi_label_classification, "
                                       r"labels=a\|b, not for this run's task=classification"):
    check_identity(single, multi.identity(), "--workdir=RUN")
  converted = HFHead(SEQUENCE_CLASSIFICATION, ("a", "b"), 2, "single_label_classification").identity()
  check_identity(single, converted, "--workdir=HF")
  with pytest.raises(InputError, match=r"--workdir=HF holds a head trained for .*problem_type=single_label_classific"
                                       r"ation, .* fine-tune from it \(--config.init_checkpoint: its head, of another "
                                       r"problem_type, then starts afresh\)"):
    check_identity(multi, converted, "--workdir=HF")


def test_length_buckets_keep_as_many_classes_as_positions_whole():
  features = {"input_ids": np.ones((2, 16), np.int32), "label": np.ones((2, 16), np.int32)}
  cut = buckets.cut(features, 4, 16)
  assert cut["input_ids"].shape == (2, 4) and cut["label"].shape == (2, 16)


def test_predictions_take_the_thresholds_saved_with_the_weights(tmp_path):
  task = task_of(classification, "multi_label=true,labels=a|b|c")
  write_cells(tmp_path / "dev.tsv", ["a", "b|c"])
  split = task.gold_split(str(tmp_path / "dev.tsv"))
  probabilities = np.asarray([[0.55, 0.3, 0.05], [0.45, 0.3, 0.9]])
  task.use_tuning(str(tmp_path))  # no thresholds saved there: 0.5 for every class
  task.write_predictions(split, probabilities, str(tmp_path / "at_half.jsonl"))
  assert [row["label"] for row in json_lines(tmp_path / "at_half.jsonl")] == ["a", "c"]
  (tmp_path / THRESHOLDS_FILE).write_text(json.dumps({"labels": ["a", "b", "c"], "thresholds": [0.6, 0.3, 0.95]}))
  task.use_tuning(str(tmp_path))
  task.write_predictions(split, probabilities, str(tmp_path / "tuned.jsonl"))
  rows = json_lines(tmp_path / "tuned.jsonl")
  assert rows[0] == {"id": "0", "label": "b", "probabilities": {"a": 0.55, "b": 0.3, "c": 0.05}}
  assert rows[1]["label"] == "b"
  np.testing.assert_array_equal(task.read_predictions(str(tmp_path / "tuned.jsonl"), split), probabilities)
  (tmp_path / THRESHOLDS_FILE).write_text(json.dumps({"labels": ["c", "b", "a"], "thresholds": [0.6, 0.3, 0.95]}))
  with pytest.raises(InputError, match=f"{THRESHOLDS_FILE} holds no thresholds for the classes \\['a', 'b', 'c'\\]"):
    task.use_tuning(str(tmp_path))


# ------------------------------------------------------------------------------------- a tiny run

@pytest.fixture(scope="module")
def run(shared_data, tmp_path_factory):
  """24 steps of a 2-layer H=32 model on 96 keyword-labelled rows (train TSV, dev JSON lines), dev scored at the
  end."""
  root = tmp_path_factory.mktemp("multi_label")
  data = root / "data"
  data.mkdir()
  rng = random.Random(0)
  (data / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{c}\n" for t, c in keyword_rows(rng, 96)))
  dev = keyword_rows(rng, 32)
  (data / "dev.jsonl").write_text("".join(json.dumps({"sentence": t, "label": c}) + "\n" for t, c in dev))
  config = classification.get_config(f"size=tiny,data={data},spm={spm(shared_data)},text=sentence,multi_label=true")
  config.model.update(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64)
  config.data.max_seq_length = 16
  config.allow_random_init = True
  config.train.update(num_train_steps=24, global_batch_size=16, warmup_steps=2, eval_every=24, micro_batch_size=0,
                      learning_rate=3e-3)
  config.checkpoint.update(every=24, async_save=False)
  config.log.every = 12
  workdir = root / "run"
  quietly(finetune.train, config, Run(str(workdir)))
  best = read_best(Run(str(workdir)))
  return types.SimpleNamespace(config=config, workdir=workdir, best=best, dev=dev,
                               weights=workdir / "best" / f"step_{best['step']}")


@pytest.mark.slow
def test_training_selects_by_micro_f1_and_keeps_the_tuned_thresholds(run):
  best = run.best
  assert (best["metric"], best["value"], set(best["metrics"])) == ("micro_f1", best["metrics"]["micro_f1"], METRICS)
  assert best["metrics"]["tuned_macro_f1"] >= best["metrics"]["macro_f1"]  # 0.5 is among each class's candidates
  labelled = np.mean([multi_hot(cell) for _, cell in run.dev])
  assert best["metrics"]["micro_f1"] > 2 * labelled / (1 + labelled)  # learnt: beats predicting every class
  saved = json.loads((run.weights / THRESHOLDS_FILE).read_text())
  assert saved["labels"] == sorted(CLASSES)
  dev = json_lines(run.weights / "dev_predictions.jsonl")
  probabilities = np.asarray([list(row["probabilities"].values()) for row in dev])
  gold = [multi_hot(cell) for _, cell in run.dev]
  for c, threshold in enumerate(saved["thresholds"]):  # a class's own dev probability, or 0.5
    assert threshold == 0.5 or np.min(np.abs(probabilities[:, c] - threshold)) <= 5e-7
  tuned = metrics.multi_label_scores(gold, probabilities >= np.asarray(saved["thresholds"]) - 1e-6)
  assert {f"tuned_{k}": v for k, v in tuned.items()} == pytest.approx(
      {k: v for k, v in best["metrics"].items() if k.startswith("tuned_")})
  for row in dev:
    assert list(row["probabilities"]) == sorted(CLASSES)
    assert row["label"] == chosen(row["probabilities"], saved["thresholds"])


@pytest.mark.slow
def test_eval_scores_the_best_checkpoint_again(run):
  printed = json.loads(quietly(finetune.evaluate, run.config, Run(str(run.workdir))).splitlines()[-1])
  assert printed.pop("weights") == f"best checkpoint (step {run.best['step']})"
  assert printed == pytest.approx(run.best["metrics"])


@pytest.mark.slow
def test_predict_chooses_with_the_thresholds_saved_with_the_best_checkpoint(run, tmp_path):
  """The dev texts: their labels are the best checkpoint's dev predictions', some other than at 0.5 (the tuned
  scores differ from the untuned ones)."""
  assert run.best["metrics"]["tuned_micro_f1"] != run.best["metrics"]["micro_f1"]
  texts = tmp_path / "in.tsv"
  texts.write_text("sentence\n" + "".join(f"{text}\n" for text, _ in run.dev))
  args = job_kinds.RunArgs(input=str(texts), output=str(tmp_path / "out.jsonl"))
  quietly(finetune.predict, run.config, Run(str(run.workdir)), args)
  rows, dev = json_lines(args.output), json_lines(run.weights / "dev_predictions.jsonl")
  assert [(row["id"], row["label"]) for row in rows] == [(row["id"], row["label"]) for row in dev]
  np.testing.assert_allclose(*([list(row["probabilities"].values()) for row in out] for out in (rows, dev)), atol=2e-6)
  assert any(row["label"] != chosen(row["probabilities"], [0.5] * len(CLASSES)) for row in rows)


@pytest.mark.slow
@pytest.mark.hf
def test_the_export_gives_transformers_our_logits_probabilities_and_loss(run, tmp_path):
  torch = require_module("torch", extra="hf")
  transformers = require_module("transformers", extra="hf")
  quietly(convert.convert, None, "hf", str(run.workdir), str(tmp_path / "hf"))
  exported = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert (exported["architectures"], exported["problem_type"], exported["id2label"], exported["label2id"]) == (
      ["AlbertForSequenceClassification"], "multi_label_classification", {"0": "animals", "1": "food", "2": "sports"},
      {"animals": 0, "food": 1, "sports": 2})
  pipeline = transformers.pipeline("text-classification", model=str(tmp_path / "hf"), top_k=None)
  scored = pipeline([text for text, _ in run.dev])  # the exported tokenizer, and a sigmoid per class
  for row, theirs in zip(json_lines(run.weights / "dev_predictions.jsonl"), scored, strict=True):
    assert {s["label"]: s["score"] for s in theirs} == pytest.approx(row["probabilities"], abs=1e-5)
  task = get_task(run.config)
  split = task.load_split("dev", make_tokenizer(run.config))
  ours = np.asarray(jax.jit(task.predictor(task.build_model(model_config_from(run.config))))(
      store.load_pretrained(str(run.weights))[1], split.features)["logits"])
  inputs = {name: torch.tensor(split.features[name], dtype=torch.long) for name in MODEL_INPUTS}
  with torch.no_grad():
    theirs = pipeline.model(**inputs, labels=torch.tensor(split.features["label"], dtype=torch.float32))
  np.testing.assert_allclose(theirs.logits.numpy(), ours, atol=1e-5)
  assert float(theirs.loss) == pytest.approx(float(binary_cross_entropy(ours, split.features["label"])[0]), abs=1e-5)
