"""SQuAD on the real v1.1 dev set: exact alignment, windows, gold answers -> token positions -> text, the v2
null-answer path end to end on unanswerable questions built from v1.1 dev, prediction files and the scorer."""
import copy
import json
import subprocess
import sys

import numpy as np
import pytest

from albert_jax.tasks.alignment import align, normalize_with_offsets
from albert_jax.errors import InputError, MissingFileError
from albert_jax.tasks.squad import SquadExample, null_odds_path
from data_pipeline.tokenization import preprocess_text
from tests.helpers import oracle_logits, squad_task, v2_dataset
from tests.squad_official import official_v2


@pytest.fixture(scope="module")
def v1_dev(shared_data, tokenizer):
  task = squad_task(1, shared_data / "squad")
  return task, task.load_split("dev", tokenizer)


def test_alignment_reproduces_preprocessing_and_tokens(squad_json, tokenizer):
  contexts = [p["context"] for a in squad_json["data"] for p in a["paragraphs"]]
  for context in contexts[::4]:
    normalized, spans = normalize_with_offsets(context)
    assert normalized == preprocess_text(context)
    assert len(spans) == len(normalized)
    aligned = align(tokenizer, context)
    assert aligned.ids == tokenizer.encode(context)
    assert (np.diff(aligned.start) >= 0).all() and (aligned.end >= aligned.start).all()
  text = "Ｓtraße ``quoted'' naïve 1999,2000 \u200bzero"
  aligned = align(tokenizer, text)
  pieces = [p.replace("\u2581", "") for p in tokenizer.tokenize(text)]
  assert len(pieces) == len(aligned.ids)
  assert [preprocess_text(text[s:e]) for s, e in zip(aligned.start, aligned.end) if e > s] == [p for p in pieces if p]


@pytest.mark.slow
def test_gold_answers_survive_featurize_and_decode(v1_dev):
  """Every first gold answer -> token positions -> windows -> oracle logits -> n-best decoding -> text, scored
  with the official v1.1 rules against all gold answers. Misses: answers starting/ending inside a token
  ("8" of "18", "gold" of "golden") and the few answers longer than max_answer_length=30 tokens."""
  task, split = v1_dev
  assert len(split.examples) == 10570 and split.num_features > 10570
  assert split.features["input_ids"].shape[1] == 384
  scores = task.score(split, task.postprocess(split, oracle_logits(split)))
  assert scores["exact_match"] >= 99.0, scores   # measured: 99.65 EM, 99.70 F1
  assert scores["f1"] >= 99.0


def test_windows_and_max_context(v1_dev, tokenizer):
  _, split = v1_dev
  info = split.info
  for index in np.unique(info["example_index"])[:300]:
    rows = info["example_index"] == index
    # Every context token is the max-context token of exactly one window, and owned tokens are in order.
    assert info["max_context"][rows].sum() == len(align(tokenizer, split.examples[index].context).ids)
    owned = info["token_start_char"][rows][info["max_context"][rows]]
    assert (np.diff(owned) >= 0).all()
  long = np.bincount(info["example_index"])
  assert long.max() > 1  # some contexts need several windows at 384 tokens
  f = split.features
  q_len = np.argmax(f["input_ids"] == 3, axis=1)  # first [SEP]
  assert (q_len <= 64 + 1).all()
  assert ((f["token_type_ids"] == 1).sum(1) > 0).all()


def test_squad_v2_null_answer_end_to_end(squad_json, tokenizer, tmp_path):
  dataset = v2_dataset(squad_json)
  (tmp_path / "dev-v2.0.json").write_text(json.dumps(dataset))
  task = squad_task(2, tmp_path)
  split = task.load_split("dev", tokenizer)
  impossible = np.array([ex.is_impossible for ex in split.examples])
  assert impossible.sum() == (~impossible).sum() > 500
  rows = np.array([split.examples[i].is_impossible for i in split.info["example_index"]])
  assert (split.features["start_positions"][rows] == 0).all() and (split.features["end_positions"][rows] == 0).all()

  predictions = task.postprocess(split, oracle_logits(split))
  scores = task.score(split, predictions)
  assert scores["NoAns_exact"] == 100.0 and scores["HasAns_exact"] >= 98.5, scores  # measured 98.93
  assert all(predictions.null_odds[ex.qid] > 0 for ex in split.examples if ex.is_impossible)

  # Noisy logits: the scores equal the official v2 evaluation of the written files, threshold included.
  logits = oracle_logits(split)
  noise = np.sin(np.arange(logits["start_logits"].size)).reshape(logits["start_logits"].shape) * 12
  noisy = {"start_logits": logits["start_logits"] + noise, "end_logits": logits["end_logits"] - noise}
  predictions = task.postprocess(split, noisy)
  path = str(tmp_path / "predictions.json")
  task.write_predictions(split, predictions, path)
  answers = json.loads(open(path).read())
  odds = json.loads(open(null_odds_path(path)).read())
  ours = task.score(split, predictions)
  official = official_v2(dataset["data"], answers, odds, 0.0)
  assert ours["missing"] == 0
  assert {k: v for k, v in ours.items() if not k.endswith("total") and k != "missing"} == pytest.approx(official,
                                                                                                        abs=1e-9)
  assert 0 < ours["best_f1"] < 100 and ours["best_f1"] >= ours["f1"] - 1e-9
  result = subprocess.run([sys.executable, "-m", "albert_jax.evaluate", "--task=squad_v2",
                           f"--data={tmp_path / 'dev-v2.0.json'}", f"--predictions={path}"],
                          capture_output=True, text=True, check=True)
  assert json.loads(result.stdout.strip().splitlines()[-1]) == pytest.approx(ours)


def test_the_v2_scorer_names_its_missing_null_odds_file_and_refuses_a_nan_threshold(tmp_path, squad_json):
  """The odds file missing was reported as a missing data file ("check --config.data.path"); a nan threshold
  compares false with every null odds, so every question was answered."""
  from albert_jax import evaluate
  gold = tmp_path / "dev-v2.0.json"
  gold.write_text(json.dumps(v2_dataset(squad_json, 1)))
  task = squad_task(2, tmp_path)
  split = task.gold_split(str(gold))
  path = tmp_path / "predictions.json"
  path.write_text(json.dumps({ex.qid: "" for ex in split.examples}))
  with pytest.raises(MissingFileError) as error:
    task.read_predictions(str(path), split)
  assert str(error.value) == (f"{tmp_path / 'predictions.null_odds.json'} not found: SQuAD v2 answers are scored with "
                              f"their null odds, which --mode=predict writes there beside {path}; keep the two files "
                              "together.")
  with pytest.raises(InputError, match=r"^data.null_score_diff_threshold=nan \(evaluate: --null_threshold\) is not "
                                       "a finite number"):
    evaluate.evaluate("squad_v2", str(gold), str(path), float("nan"))


def test_bad_squad_input(tmp_path, squad_json):
  data = copy.deepcopy(squad_json["data"][:1])
  qa = data[0]["paragraphs"][0]["qas"][0]
  qa["answers"][0]["answer_start"] = 10_000
  (tmp_path / "dev-v1.1.json").write_text(json.dumps({"data": data}))
  with pytest.raises(InputError, match=rf"dev-v1.1.json:question {qa['id']}: answer .* is not in its context"):
    squad_task(1, tmp_path).read_examples(str(tmp_path / "dev-v1.1.json"))
  qa["answers"], qa["is_impossible"] = [], True
  (tmp_path / "dev-v1.1.json").write_text(json.dumps({"data": data}))
  with pytest.raises(InputError, match="unanswerable question"):
    squad_task(1, tmp_path).read_examples(str(tmp_path / "dev-v1.1.json"))
  with pytest.raises(ValueError, match="max_query_length=64 leaves no room"):
    squad_task(1, max_seq_length=64)


def _refusal(read, *args):
  with pytest.raises(InputError) as error:
    read(*args)
  return str(error.value)


def test_prediction_file_refusals_and_missing_answers(tmp_path, squad_json):
  (tmp_path / "dev-v1.1.json").write_text(json.dumps({"data": squad_json["data"][:1]}))
  task = squad_task(1, tmp_path)
  split = task.gold_split(str(tmp_path / "dev-v1.1.json"))
  gold = {ex.qid: ex.answers[0] for ex in split.examples}
  first, second = list(gold)[:2]
  path = tmp_path / "predictions.json"
  read = lambda text: (path.write_text(text), task.read_predictions(str(path), split))[1]
  assert _refusal(read, json.dumps(list(gold.values()))) == (
      f"{path}: a JSON list, expected an object {{id: an answer text}}; pass the file write_predictions wrote.")
  assert _refusal(read, "{}").startswith(f"{path}: an empty object, expected an object")
  assert _refusal(read, json.dumps({first: 3})) == (
      f"{path}:id {first}: 3 is not an answer text; is this the predictions file of this task?")
  assert _refusal(read, f'{{"{first}": "a", "{second}": "b", "{first}": "c"}}') == (
      f"{path}:id {first}: given twice, as 'a' and 'c'; keep one.")
  assert _refusal(read, json.dumps({**gold, "no-such-id": "x"})) == (
      f"{path}: 1 id(s) are not in {split.path}, e.g. no-such-id; score against the gold file these predictions "
      "are for.")
  # Two questions unanswered: they score 0, as in the official v1.1 script, and the result counts them.
  answers = {qid: text for qid, text in gold.items() if qid not in (first, second)}
  text = json.dumps(answers)[:-1] + f', "{list(answers)[0]}": {json.dumps(list(answers.values())[0])}}}'
  scores = task.score(split, read(text))   # a repeated id with the same answer is harmless
  assert scores == {"exact_match": 100.0 * (len(gold) - 2) / len(gold), "f1": 100.0 * (len(gold) - 2) / len(gold),
                    "missing": 2}


def test_v2_null_odds_must_cover_the_answers(tmp_path, squad_json):
  (tmp_path / "dev-v2.0.json").write_text(json.dumps({"data": squad_json["data"][:1]}))
  task = squad_task(2, tmp_path)
  split = task.gold_split(str(tmp_path / "dev-v2.0.json"))
  qids = [ex.qid for ex in split.examples]
  path = tmp_path / "predictions.json"
  path.write_text(json.dumps({q: "x" for q in qids}))
  odds = tmp_path / "predictions.null_odds.json"
  odds.write_text(json.dumps({q: -1.0 for q in qids[1:]}))
  assert _refusal(task.read_predictions, str(path), split) == (
      f"{odds}: no null odds for 1 answered question(s), e.g. {qids[0]}; pass the file written with {path}.")
  odds.write_text(json.dumps({q: True for q in qids}))
  assert "True is not a number (the null odds)" in _refusal(task.read_predictions, str(path), split)
  for constant in ("NaN", "Infinity", "-Infinity"):  # what json.dumps writes for a non-finite float
    odds.write_text(json.dumps({q: float(constant) for q in qids}))
    assert _refusal(task.read_predictions, str(path), split) == (
        f"{odds}: holds {constant}, not a finite number; predictions of a model whose outputs went non-finite cannot "
        "be scored: predict again from a checkpoint before the divergence.")


def test_user_file_and_short_windows(tmp_path, tokenizer):
  context = " ".join(f"Sentence number {i} talks about topic {i * 7}." for i in range(40))
  (tmp_path / "q.jsonl").write_text(json.dumps({"id": "u1", "question": "What about topic 70?",
                                                "context": context}) + "\n")
  task = squad_task(1, max_seq_length=64, doc_stride=16, max_query_length=16)
  split = task.read_user_file(str(tmp_path / "q.jsonl"), tokenizer)
  assert "start_positions" not in split.features and split.num_features > 5
  windows = split.info["token_start_char"]
  firsts = [row[row >= 0][0] for row in windows]
  assert firsts == sorted(firsts) and len(set(firsts)) == len(firsts)
  # The span decoder maps the chosen tokens back to the original characters.
  start = np.full(windows.shape, -5.0)
  end = start.copy()
  target = context.index("topic 70")
  for r in range(len(windows)):
    hits = np.flatnonzero(windows[r] == target)
    if hits.size and split.info["max_context"][r, hits[0]]:
      start[r, hits[0]], end[r, hits[0] + 1] = 5.0, 5.0
  assert task.postprocess(split, {"start_logits": start, "end_logits": end}).answers == {"u1": "topic 70"}


def test_example_without_answer_is_unlabelled():
  assert not SquadExample("q", "?", "c", []).labeled
  assert SquadExample("q", "?", "c", [], is_impossible=True).labeled
