"""Users' own files read exactly or refused by line: empty labels, CoNLL columns, repeated columns, ids, label
order; the GLUE submission's errors in one line; embedding without a label set; POS tag sets scored by accuracy."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from albert_jax import finetune, glue_submission
from albert_jax.errors import InputError
from albert_jax.run import Run
from albert_jax.run.layout import HEAD_FILE
from albert_jax.tasks.classification import label_order
from albert_jax.weights.resolve import resolve
from experiments import classification, glue, multiple_choice, token_classification
from tests.helpers import REPO, TINY_RUN, finetune_cli as cli, spm, task_of as _task


def _refused(message):
  return pytest.raises(InputError, match="^" + re.escape(message) + "$")


# --- empty labels ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, line", [
    ("train.tsv", "text\tlabel\ngood\t1\nbad\t\nfine\t0\n", 3),
    ("train.csv", "text,label\ngood,1\nbad,\nfine,0\n", 3),
    ("train.jsonl", '{"text": "good", "label": 1}\n{"text": "bad", "label": ""}\n{"text": "fine", "label": 0}\n', 2),
    ("train.tsv", "text\tlabel\ngood\t1\nbad\t  \nfine\t0\n", 3)])
def test_an_empty_label_is_refused_with_its_line(tmp_path, name, text, line):
  """Refused naming its line, not made a class "" of its own (train file) or an unknown label "" (data.labels
  given)."""
  (tmp_path / name).write_text(text)
  message = (f"{tmp_path / name}:{line}: missing label: column 'label' is empty; every row of train and dev needs its "
             "label (unlabelled rows belong in the test file).")
  with _refused(message):
    _task(classification, f"data={tmp_path}").labels
  with _refused(message):
    _task(classification, f"data={tmp_path},labels=0|1").read_examples(str(tmp_path / name), labeled=True)
  with _refused(message):  # a regression's empty score is named the same way
    _task(classification, f"data={tmp_path},regression=true").read_examples(str(tmp_path / name), labeled=True)
  unlabelled = _task(classification, f"data={tmp_path},labels=0|1").read_user_examples(str(tmp_path / name))
  assert [ex.text_a for ex in unlabelled] == ["good", "bad", "fine"]  # a file to predict needs no label


# --- CoNLL columns ---------------------------------------------------------------------------------------------

def test_conll_columns_are_split_on_spaces_and_tabs_only(tmp_path):
  """str.split() also cut at U+00A0, U+202F, U+3000: `New\\xa0York B-LOC` lost `York`."""
  path = tmp_path / "train.txt"
  path.write_text("-DOCSTART- -X- O\r\n\r\nNew\xa0York NNP B-LOC\r\nis\tVBZ\tO\r\n \t\r\n"
                  "Tokyo\u3000Tower  B-LOC\n10\u202f000 O\n")
  task = _task(token_classification, f"data={tmp_path}")
  sentences = task.read_examples(str(path), labeled=True)
  assert [s.words for s in sentences] == [["New\xa0York", "is"], ["Tokyo\u3000Tower", "10\u202f000"]]
  assert [s.tags for s in sentences] == [["B-LOC", "O"], ["B-LOC", "O"]]
  assert [s.words for s in task.read_user_examples(str(path))] == [s.words for s in sentences]
  word = "New\xa0York"
  path.write_text(word + "\n")
  with _refused(f"{path}:1: a word without a tag ({word!r}); CoNLL lines are `word ... tag` (tag in the last "
                "column), with a blank line between sentences."):
    task.read_examples(str(path), labeled=True)


# --- repeated columns ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text", [
    ("train.tsv", "sentence\tlabel\tsentence\na\tpos\tb\n"),
    ("train.csv", "sentence,label,sentence\na,pos,b\n")])
def test_a_column_named_twice_is_refused(tmp_path, name, text):
  """dict(zip(header, fields)) kept the last column of the name silently: text b read instead of a."""
  (tmp_path / name).write_text(text)
  with _refused(f"{tmp_path / name}:1: column(s) ['sentence'] appear more than once in the header "
                "['sentence', 'label', 'sentence']; rename or drop the repeats."):
    _task(classification, f"data={tmp_path},text=sentence").labels
  with _refused(f"{tmp_path / name}:1: column(s) ['sentence'] appear more than once in the header "
                "['sentence', 'label', 'sentence']; rename or drop the repeats."):
    _task(classification, "labels=neg|pos,text=sentence").read_user_examples(str(tmp_path / name))


def test_a_json_field_given_twice_is_refused_and_unnamed_csv_columns_may_repeat(tmp_path):
  path = tmp_path / "train.jsonl"
  path.write_text('{"text": "a", "label": "pos"}\n{"text": "a", "label": "pos", "text": "b"}\n')
  with _refused(f"{path}:2: field 'text' appears twice in the object; keep one."):
    _task(classification, f"data={tmp_path}").labels
  path.unlink()
  (tmp_path / "train.csv").write_text("text,label,,\ngood,pos,,\nbad,neg,,\n")  # a spreadsheet's empty columns
  assert _task(classification, f"data={tmp_path}").labels == ("neg", "pos")


# --- ids -------------------------------------------------------------------------------------------------------

def _mc(record):
  return json.dumps({"context": "c", "question": "q", "options": ["a", "b"], "answer": 0, **record}) + "\n"


@pytest.mark.parametrize("records, message", [
    ([{"id": "q1"}, {"id": "q2"}, {"id": "q1"}], "3: id 'q1' is also the id of line 1; give every example its own id."),
    ([{"id": 1}, {}], "2: id '1' (the row number of a line without id) is also the id of line 1; give every example "
                      "its own id."),
    ([{}, {"id": "0"}], "2: id '0' is also the id of line 1 (the row number of a line without id); give every "
                        "example its own id."),
    ([{"id": 1}, {"id": "1"}], "2: id '1' is also the id of line 1; give every example its own id."),
    ([{"id": None}], "1: field 'id' should be str or int, got NoneType"),
    ([{"id": 1.5}], "1: field 'id' should be str or int, got float")])
def test_multiple_choice_ids_are_unique_and_typed(tmp_path, records, message):
  """Predictions are keyed by id: a repeat overwrote another question's, and `"id": null` became "None"."""
  path = tmp_path / "dev.jsonl"
  path.write_text("".join(_mc(r) for r in records))
  task = _task(multiple_choice, f"data={tmp_path}", max_seq_length=128)
  with _refused(f"{path}:{message}"):
    task.read_examples(str(path), labeled=True)
  with _refused(f"{path}:{message}"):
    task.read_user_examples(str(path))
  path.write_text(_mc({"id": "q1"}) + _mc({}) + _mc({"id": 7}))
  assert [ex.qid for ex in task.read_examples(str(path), labeled=True)] == ["q1", "1", "7"]


def test_glue_user_file_ids_are_unique_and_typed(tmp_path):
  path = tmp_path / "mine.tsv"
  path.write_text("id\ttext_a\na\tone\nb\ttwo\na\tthree\n")
  with _refused(f"{path}:4: id 'a' is also the id of line 2; give every example its own id."):
    _task(glue, "task=sst-2").read_user_examples(str(path))
  path = tmp_path / "mine.jsonl"
  path.write_text(json.dumps({"text_a": "one"}) + "\n" + json.dumps({"id": 0, "text_a": "two"}) + "\n")
  with _refused(f"{path}:2: id '0' is also the id of line 1 (the row number of a line without id); give every "
                "example its own id."):
    _task(glue, "task=sst-2").read_user_examples(str(path))
  path.write_text(json.dumps({"id": None, "text_a": "one"}) + "\n")
  with _refused(f"{path}:1: field 'id' should be str or int, got NoneType"):
    _task(glue, "task=sst-2").read_user_examples(str(path))
  path.write_text(json.dumps({"id": "x", "text_a": "one"}) + "\n" + json.dumps({"text_a": "two"}) + "\n")
  assert [ex.guid for ex in _task(glue, "task=sst-2").read_user_examples(str(path))] == ["x", "1"]


def test_classification_and_tagging_ids_are_unique(tmp_path):
  path = tmp_path / "dev.csv"
  path.write_text("key,text,label\nk1,a,pos\nk2,b,neg\nk1,c,pos\n")
  with _refused(f"{path}:4: id 'k1' is also the id of line 2; give every example its own id."):
    _task(classification, "labels=neg|pos,id=key").read_examples(str(path), labeled=True)
  path = tmp_path / "mine.jsonl"
  path.write_text(json.dumps({"id": "s", "tokens": ["a"]}) + "\n" + json.dumps({"id": "s", "tokens": ["b"]}) + "\n")
  with _refused(f"{path}:2: id 's' is also the id of line 1; give every example its own id."):
    _task(token_classification, "labels=B-X|O").read_user_examples(str(path))
  path.write_text(json.dumps({"id": None, "tokens": ["a"]}) + "\n")
  with _refused(f"{path}:1: field 'id' should be str or int, got NoneType"):
    _task(token_classification, "labels=B-X|O").read_user_examples(str(path))


def test_a_prediction_file_that_predicts_an_id_twice_is_refused(tmp_path):
  """Multiple choice and tagging kept the last row silently (classification already refused)."""
  gold = tmp_path / "dev.jsonl"
  gold.write_text(_mc({"id": "q1"}) + _mc({"id": "q2"}))
  task = _task(multiple_choice, f"data={tmp_path}", max_seq_length=128)
  predictions = tmp_path / "predictions.jsonl"
  predictions.write_text("".join(json.dumps({"id": i, "probabilities": [0.5, 0.5]}) + "\n" for i in ("q1", "q2", "q1")))
  with _refused(f"{predictions}:3: id 'q1' is also the id of line 1; keep one row per question."):
    task.read_predictions(str(predictions), task.gold_split(str(gold)))


# --- label order -----------------------------------------------------------------------------------------------

def test_integer_labels_are_ordered_numerically_by_an_ascii_rule(tmp_path):
  """"+1" sorts as the number 1, not as a string; "²" (which passes str.isdigit()) is not taken for a number."""
  assert label_order({"10", "2", "+1", "-3", "0"}) == ("-3", "0", "+1", "2", "10")
  assert label_order({"1", "01", "+1"}) == ("+1", "01", "1")  # equal numbers: by their text, the same every run
  assert label_order({"²", "1", "10"}) == ("1", "10", "²")
  assert label_order({"١", "2"}) == ("2", "١")  # an Arabic-Indic digit is no ASCII integer
  assert label_order({"1.5", "10", "2"}) == ("1.5", "10", "2")
  (tmp_path / "train.tsv").write_text("text\tlabel\na\t²\nb\t1\nc\t10\n")
  assert _task(classification, f"data={tmp_path}").labels == ("1", "10", "²")
  (tmp_path / "train.tsv").write_text("text\tlabel\na\t+1\nb\t-1\nc\t0\n")
  assert _task(classification, f"data={tmp_path}").labels == ("-1", "0", "+1")


# --- glue_submission's errors ----------------------------------------------------------------------------------

def _run(path, task="glue", files=()):
  path.mkdir(parents=True)
  if task:
    (path / "config.json").write_text(json.dumps({"task": task}))
  for name, count in files:
    (path / name).write_text("index\tprediction\n" + "".join(f"{i}\tentailment\n" for i in range(count)))
  return str(path)


@pytest.mark.parametrize("setup, flags, message", [
    (lambda p: _run(p, files=[("RTE.tsv", 3)]), [], "No run has CoLA.tsv, SST-2.tsv, MRPC.tsv, STS-B.tsv, QQP.tsv, "
     "MNLI-m.tsv, MNLI-mm.tsv, QNLI.tsv, WNLI.tsv, AX.tsv; the GLUE server needs all 11 files."),
    (lambda p: _run(p, files=[("RTE.tsv", 3)]), ["--allow_partial"],
     "RTE.tsv: 3 predictions but the GLUE test set has 3000; predict the full official test file (or pass "
     "--no_check_counts for a trial folder)."),
    (lambda p: _run(p, task=None), [], "config.json not found; --runs takes fine-tuning workdirs of "
     "experiments/glue.py."),
    (lambda p: str(p), [], "config.json not found; --runs takes fine-tuning workdirs of experiments/glue.py."),
    (lambda p: _run(p, task="classification"), [], "is a 'classification' run, not a GLUE one; leave it out of "
     "--runs.")])
def test_glue_submission_reports_its_errors_in_one_line(tmp_path, setup, flags, message):
  run = setup(tmp_path / "run")
  with pytest.raises(SystemExit) as exit_:
    glue_submission.main(["--runs", run, "--out", str(tmp_path / "out"), *flags])
  assert exit_.value.code.startswith("glue_submission: error: ") and message in exit_.value.code
  assert "\n" not in exit_.value.code


def test_glue_submission_command_line_prints_one_error_line(tmp_path):
  run = _run(tmp_path / "run", files=[("RTE.tsv", 3)])
  result = subprocess.run([sys.executable, "-m", "albert_jax.glue_submission", "--runs", run, "--out",
                           str(tmp_path / "out"), "--allow_partial"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 1 and result.stdout == ""
  assert result.stderr == (f"glue_submission: error: {run}/RTE.tsv: 3 predictions but the GLUE test set has 3000; "
                           "predict the full official test file (or pass --no_check_counts for a trial folder).\n")


def test_glue_submission_keeps_the_traceback_of_an_error_not_ours(tmp_path, monkeypatch):
  """A bug (a library's error, not a message of ours) still shows where it happened."""
  run = _run(tmp_path / "run", files=[("RTE.tsv", 3)])
  monkeypatch.setattr(glue_submission, "dev_score", lambda run: float("x"))
  with pytest.raises(ValueError, match="could not convert string to float"):
    glue_submission.main(["--runs", run, "--out", str(tmp_path / "out")])


# --- embedding needs no label set ------------------------------------------------------------------------------

def test_embed_with_a_classification_config_needs_no_train_file(shared_data, tmp_path):
  """The backbone alone embeds; building the classifier head read the train file for its classes and stopped
  with "train.tsv not found ... set --config.data.labels"."""
  import flax.linen as nn
  import jax
  from albert_jax import embed, job_kinds
  from albert_jax.model import AlbertModel, init_params
  from albert_jax.model_config import model_config_from
  from albert_jax.tasks import make_tokenizer
  from albert_jax.tasks.base import stack_packed
  from albert_jax.tasks.sequence import pack_text
  from albert_jax.weights import store
  config = classification.get_config(f"size=tiny,data={tmp_path / 'no_data'},spm={spm(shared_data)}")
  config.model.num_hidden_layers, config.data.max_seq_length, config.train.global_batch_size = 2, 32, 8
  model_config = model_config_from(config)
  backbone = nn.unbox(init_params(AlbertModel(model_config), jax.random.key(1)))
  store.save_pretrained(str(tmp_path / "converted"), model_config, {"albert": backbone})
  config.init_checkpoint = str(tmp_path / "converted")
  texts = ["a wonderful film", "", "the city at night"]
  (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
  embed.embed(config, Run(str(tmp_path / "run")), job_kinds.RunArgs(input=str(tmp_path / "texts.txt"),
                                                               output=str(tmp_path / "out.npy")),
              job_kinds.kind_for(config))
  tokenizer = make_tokenizer(config)
  features = stack_packed([pack_text(tokenizer, text, None, 32) for text in texts], (3,))
  expected = embed.embed_fn(AlbertModel(model_config), "mean")(backbone, features)["embedding"]
  np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=1e-5, atol=1e-6)  # those very weights


# --- token classification: the metric of the tag set -----------------------------------------------------------

@pytest.mark.parametrize("labels, metric", [
    ("B-PER|I-PER|O", "f1"), ("B-LOC|E-LOC|I-LOC|S-LOC|O", "f1"), ("B-X|I-X|L-X|U-X|O", "f1"), ("I-ORG|O", "f1"),
    ("DT|NN|VBZ", "accuracy"), ("NOUN|PROPN|-LRB-", "accuracy"), ("B-PER|NN|O", "accuracy"), ("O", "accuracy"),
    ("B|I|O", "accuracy"), ("B-|O", "accuracy")])
def test_tag_sets_other_than_entity_schemes_select_by_accuracy(labels, metric):
  assert _task(token_classification, f"labels={labels}").metric_name == metric


def test_pos_tags_are_scored_by_word_accuracy_alone_and_bilou_as_iobes(tmp_path):
  (tmp_path / "train.txt").write_text("The DT\ncat NN\nsat VBD\n\nA DT\ndog NN\n")
  task = _task(token_classification, f"data={tmp_path}")
  assert task.labels == ("DT", "NN", "VBD") and task.metric_name == "accuracy"
  split = task.gold_split(str(tmp_path / "train.txt"))
  predicted = finetune_predictions([["DT", "NN", "NN"], ["DT", "VBD"]])
  assert task.score(split, predicted) == {"accuracy": 0.6}
  # BILOU: two one-word places, then one of two words; read as IOBES (L- = E-, U- = S-), which entity_scores knows
  (tmp_path / "train.txt").write_text("Paris U-LOC\nRome U-LOC\nare O\n\nNew B-LOC\nYork L-LOC\n")
  task = _task(token_classification, f"data={tmp_path}")
  assert task.metric_name == "f1"
  split = task.gold_split(str(tmp_path / "train.txt"))
  scores = task.score(split, finetune_predictions([["B-LOC", "L-LOC", "O"], ["B-LOC", "L-LOC"]]))
  # predicted: LOC(0-1) twice, right in the second sentence only (gold: LOC(0), LOC(1) | LOC(0-1))
  assert scores == {"precision": 0.5, "recall": pytest.approx(1 / 3), "f1": pytest.approx(0.4), "accuracy": 0.6}


def finetune_predictions(tags):
  from albert_jax.tasks.token_classification import TagPredictions
  return TagPredictions(tags, [[None] * len(t) for t in tags])


def test_eval_and_predict_choose_the_metric_of_the_recorded_tag_set(shared_data, tmp_path):
  """The metric follows the tag set, which the run records (head.json): a workdir without its train file gets
  the same metric as training (and the recorded order), so its scores mean what they meant."""
  run = tmp_path / "run"
  run.mkdir()
  (run / HEAD_FILE).write_text(json.dumps({"task": "token_classification", "task_name": "",
                                                    "labels": ["NN", "DT"]}))
  config = token_classification.get_config(f"size=tiny,data={tmp_path / 'gone'},spm={spm(shared_data)}")
  config.data.max_seq_length = 32
  task = finetune._task_and_model(config, resolve(str(run), config, flag="--workdir"))[0]
  assert task.labels == ("NN", "DT") and task.metric_name == "accuracy"
  finetune.check_identity(task, finetune.recorded_identity(Run(str(run))), "run")  # the head is this run's


@pytest.mark.slow
def test_a_pos_tagger_trains_and_selects_by_accuracy(shared_data, tmp_path):
  rng = np.random.default_rng(0)
  words = {"DT": ("the", "a"), "NN": ("cat", "dog", "film"), "VBD": ("sat", "ran", "ended")}
  (tmp_path / "data").mkdir()
  for split, count in (("train", 120), ("dev", 20)):
    sentences = [[(rng.choice(words[tag]), tag) for tag in ("DT", "NN", "VBD")] for _ in range(count)]
    (tmp_path / "data" / f"{split}.txt").write_text("".join("".join(f"{w} {t}\n" for w, t in s) + "\n"
                                                            for s in sentences))
  config = f"experiments/token_classification.py:size=tiny,data={tmp_path / 'data'},spm={spm(shared_data)}"
  result = cli(config, tmp_path / "run", *TINY_RUN, fast_compile=True)  # XLA at -O0: no value is compared
  assert result.returncode == 0, result.stdout + result.stderr
  best = json.load(open(tmp_path / "run" / "best" / "best.json"))
  assert best["metric"] == "accuracy" and set(best["metrics"]) == {"accuracy"}
  assert best["head"]["labels"] == ["DT", "NN", "VBD"]
  out = cli(config, tmp_path / "run", *TINY_RUN, mode="eval", fast_compile=True)
  assert out.returncode == 0, out.stdout + out.stderr
  assert set(json.loads(out.stdout.strip().splitlines()[-1])) == {"weights", "accuracy"}
