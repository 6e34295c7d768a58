"""RACE: the whole dev set featurizes, the option/question rule, the scorer against a hand count, bad input."""
import json
import subprocess
import sys

import numpy as np
import pytest

from albert_jax.tasks import get_task
from albert_jax.errors import InputError
from albert_jax.tasks.race import RaceExample, qa_text
from experiments import race


def race_task(data="", max_seq_length=512, max_qa_length=128):
  config = race.get_config(f"data={data}")
  config.data.max_seq_length, config.data.max_qa_length = max_seq_length, max_qa_length
  return get_task(config)


@pytest.fixture(scope="module")
def dev(shared_data, tokenizer):
  task = race_task(shared_data / "race")
  return task, task.load_split("dev", tokenizer)


def test_all_dev_questions_featurize(dev, tokenizer):
  task, split = dev
  f = split.features
  assert len(split.examples) == 4887 and f["input_ids"].shape == (4887, 4, 512) and f["label"].shape == (4887,)
  levels = [ex.level for ex in split.examples]
  assert levels.count("middle") == 1436 and levels.count("high") == 3451
  assert (f["input_ids"][:, :, 0] == tokenizer.cls_id).all()
  # Exactly two [SEP]s per option; the qa segment is at most 128 tokens + [SEP].
  assert ((f["input_ids"] == tokenizer.sep_id).sum(-1) == 2).all()
  assert (f["token_type_ids"].sum(-1) <= 129).all()
  ex = next(e for e in split.examples if "_" in e.question)
  i = split.examples.index(ex)
  qa = tokenizer.encode(qa_text(ex.question, ex.options[2]))[-128:]
  row = f["input_ids"][i, 2][f["attention_mask"][i, 2] == 1].tolist()
  assert row[-len(qa) - 1:-1] == qa and row[-1] == tokenizer.sep_id


def test_qa_rule_and_truncation(tokenizer):
  assert qa_text("John is a great _ singer.", "pop") == "John is a great pop singer."
  assert qa_text("Who wrote it?", "Tom") == "Who wrote it? Tom"
  task = race_task(max_seq_length=32, max_qa_length=16)
  ex = RaceExample("x-0", "", "first words " * 50, "which one " * 80 + "_ ?", ["a", "b", "c", "d"], 1)
  f, _ = task.featurize([ex], tokenizer)
  assert f["input_ids"].shape == (1, 4, 32) and f["attention_mask"].all()
  article = tokenizer.encode(ex.article)
  qa = tokenizer.encode(qa_text(ex.question, "a"))[-16:]  # the LAST qa tokens: "... one a ?"
  expected = [tokenizer.cls_id, *article[:32 - 3 - 16], tokenizer.sep_id, *qa, tokenizer.sep_id]
  assert f["input_ids"][0, 0].tolist() == expected
  with pytest.raises(ValueError, match="max_qa_length=128 leaves no room"):
    race_task(max_seq_length=128)


def test_scorer_matches_hand_count(dev, tmp_path, shared_data):
  task, split = dev
  # A fixed prediction file: "A" everywhere, except the gold answer on every third question.
  predictions = {ex.qid: "ABCD"[ex.label] if i % 3 == 0 else "A" for i, ex in enumerate(split.examples)}
  path = tmp_path / "answers.json"
  task.write_predictions(split, predictions, str(path))
  right = {"middle": 0, "high": 0}
  total = {"middle": 0, "high": 0}
  gold_files = sorted((shared_data / "race" / "dev").glob("*/*.txt"))
  for file in gold_files:
    level = file.parent.name
    passage = json.loads(file.read_text())
    for q, answer in enumerate(passage["answers"]):
      total[level] += 1
      right[level] += predictions[f"{passage['id']}-{q}"] == answer
  scores = task.score(split, task.read_predictions(str(path), split))
  assert scores["accuracy_middle"] == right["middle"] / total["middle"]
  assert scores["accuracy_high"] == right["high"] / total["high"]
  assert scores["accuracy"] == pytest.approx(sum(right.values()) / sum(total.values()))
  out = subprocess.run([sys.executable, "-m", "albert_jax.evaluate", "--task=race",
                        f"--data={shared_data / 'race' / 'dev'}", f"--predictions={path}"],
                       capture_output=True, text=True, check=True)
  assert json.loads(out.stdout.strip().splitlines()[-1]) == pytest.approx(scores)
  logits = np.zeros((len(split.examples), 4))
  logits[np.arange(len(logits)), split.features["label"]] = 1
  assert task.score(split, task.postprocess(split, {"logits": logits}))["accuracy"] == 1.0


def test_prediction_file_refusals(dev, tmp_path, shared_data):
  task, split = dev
  path = tmp_path / "answers.json"
  squad = {"56be4db0acb8001400a502ec": "Denver Broncos"}
  path.write_text(json.dumps(squad))
  with pytest.raises(InputError) as error:
    task.read_predictions(str(path), split)
  assert str(error.value) == (f"{path}:id 56be4db0acb8001400a502ec: 'Denver Broncos' is not one of the letters A, "
                              "B, C, D; is this the predictions file of this task?")
  qids = [ex.qid for ex in split.examples]
  path.write_text(f'{{"{qids[0]}": "A", "{qids[0]}": "B"}}')
  with pytest.raises(InputError, match=rf"answers.json:id {qids[0]}: given twice, as 'A' and 'B'; keep one.$"):
    task.read_predictions(str(path), split)
  path.write_text(json.dumps({qids[0]: "A", "high99999.txt-0": "B"}))
  with pytest.raises(InputError, match=r"answers.json: 1 id\(s\) are not in .*dev, e.g. high99999.txt-0; score"):
    task.read_predictions(str(path), split)
  path.write_text(json.dumps({q: "ABCD"[ex.label] for q, ex in zip(qids[2:], split.examples[2:])}))
  scores = task.score(split, task.read_predictions(str(path), split))
  assert scores["missing"] == 2 and scores["accuracy"] == (len(qids) - 2) / len(qids)


def test_bad_race_input(tmp_path, tokenizer):
  folder = tmp_path / "dev" / "high"
  folder.mkdir(parents=True)
  passage = {"id": "high1.txt", "article": "Text.", "questions": ["Q?"], "options": [["a", "b", "c", "d"]],
             "answers": ["E"]}
  (folder / "1.txt").write_text(json.dumps(passage))
  task = race_task(tmp_path)
  with pytest.raises(InputError, match=r"high/1.txt:1 \(question 0\): unknown answer 'E'"):
    task.load_split("dev", tokenizer)
  passage.update(answers=["A"], options=[["a", "b", "c"]])
  (folder / "1.txt").write_text(json.dumps(passage))
  with pytest.raises(InputError, match="3 options"):
    task.load_split("dev", tokenizer)
  with pytest.raises(FileNotFoundError, match=r"split 'test': .*test not found; .* holds dev \(a split is named"):
    task.load_split("test", tokenizer)
  (tmp_path / "test").mkdir()
  with pytest.raises(FileNotFoundError, match="neither middle/ nor high/"):
    task.load_split("test", tokenizer)
  user = tmp_path / "mine.jsonl"
  user.write_text(json.dumps({"article": "Tom has a cat.", "question": "Tom has a _.",
                              "options": ["cat", "dog", "cow", "pig"]}) + "\n")
  split = task.read_user_file(str(user), tokenizer)
  assert split.features["input_ids"].shape == (1, 4, 512) and "label" not in split.features
