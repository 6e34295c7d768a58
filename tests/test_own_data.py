"""Your own data: classification (TSV/CSV/JSONL, pairs, collected labels, regression), token classification
(CoNLL, first sub-token, entity F1) and multiple choice (JSONL, masked options) through
`python -m albert_jax.main` with a tiny random model on a few hundred generated examples; `--mode=embed`."""
import csv
import functools
import json
import random
import re

import numpy as np
import pytest

from albert_jax.tasks import metrics
from albert_jax.errors import InputError
from data_pipeline import train_spm
from data_pipeline.sources import Source
from data_pipeline.tokenization import Tokenizer
from experiments import classification, multiple_choice, token_classification
from tests.helpers import ALICE, SMALL_RUN, TINY_RUN, finetune_cli, pretrain_cli, small_tmpfs, spm, task_of as _task

# XLA at -O0 (tests.helpers.cpu_env): no result here is compared with one compiled otherwise.
cli = functools.partial(finetune_cli, fast_compile=True)
pretraining = functools.partial(pretrain_cli, fast_compile=True)

WORDS = ("the film was long and the cast seemed tired while music played over every scene of the city at night "
         "people walked home through rain").split()
MOODS = {"positive": ("wonderful", "great"), "negative": ("awful", "boring"), "neutral": ("average", "plain")}


def sentences(rng, count):
  for _ in range(count):
    mood = rng.choice(sorted(MOODS))
    words = rng.sample(WORDS, 6) + [rng.choice(MOODS[mood])]
    rng.shuffle(words)
    yield mood, " ".join(words)


def classification_data(root, count=240):
  rng = random.Random(0)
  rows = [(f"id{i}", text, " ".join(rng.sample(WORDS, 4)), mood) for i, (mood, text) in
          enumerate(sentences(rng, count))]
  root.mkdir(parents=True)
  with open(root / "train.tsv", "w") as f:
    f.write("id\tsentence\tcontext\tlabel\n" + "".join("\t".join(r) + "\n" for r in rows[:200]))
  with open(root / "dev.jsonl", "w") as f:
    f.writelines(json.dumps({"id": i, "sentence": s, "context": c, "label": m}) + "\n" for i, s, c, m in rows[200:])
  with open(root / "test.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["id", "sentence", "context"])
    writer.writerows([(i, s + ', "quoted"', c) for i, s, c, _ in rows[200:210]])
  return root


def test_a_bad_test_file_stops_the_run_before_training(shared_data, tmp_path):
  """The test split is read before the first step: a file predicted only after hours of training would fail then."""
  data = classification_data(tmp_path / "data")
  (data / "test.csv").write_text("sentence,context\na film,the city\n")  # no `id` column, which the config names
  result = cli(f"experiments/classification.py:size=tiny,data={data},spm={spm(shared_data)},text=sentence,"
               "text_pair=context,id=id", tmp_path / "run", *TINY_RUN)
  assert result.returncode == 1 and "test.csv" in result.stderr and "id" in result.stderr, result.stderr
  assert not (tmp_path / "run" / "checkpoints").exists() and "step 2/4" not in result.stdout


@pytest.mark.slow
def test_classification_trains_predicts_with_probabilities_and_embeds(shared_data, tmp_path):
  data = classification_data(tmp_path / "data")
  config = (f"experiments/classification.py:size=tiny,data={data},spm={spm(shared_data)},text=sentence,"
            "text_pair=context,id=id")
  result = cli(config, tmp_path / "run", *TINY_RUN)
  assert result.returncode == 0, result.stdout + result.stderr
  best = json.load(open(tmp_path / "run" / "best" / "best.json"))
  assert best["metric"] == "accuracy" and "macro_f1" in best["metrics"]
  assert "predicting split test: 10 rows predicted in " in result.stderr   # the progress of writing predictions
  rows = [json.loads(line) for line in open(tmp_path / "run" / "test_predictions.jsonl")]
  assert [r["id"] for r in rows] == [f"id{i}" for i in range(200, 210)]
  for r in rows:  # labels collected from train, sorted; probabilities of every class sum to 1
    assert list(r["probabilities"]) == ["negative", "neutral", "positive"]
    assert r["label"] == max(r["probabilities"], key=r["probabilities"].get)
    assert abs(sum(r["probabilities"].values()) - 1) < 1e-4
  texts = tmp_path / "texts.txt"
  texts.write_text("a wonderful film\n\nthe city at night\n")
  out = cli(config, tmp_path / "run", *TINY_RUN, mode="embed",
            extra=[f"--input={texts}", f"--output={tmp_path / 'pooled.npy'}", "--pooling=pooled"])
  assert out.returncode == 0, out.stdout + out.stderr
  vectors = np.load(tmp_path / "pooled.npy")
  assert vectors.shape == (3, 64) and vectors.dtype == np.float32 and np.abs(vectors).max() <= 1  # tanh pooler
  assert f"embedding {texts}: 3 rows predicted in " in out.stderr


def conll_data(root, count=200):
  rng = random.Random(2)
  names, places = ("john smith", "mary jones", "ann lee"), ("new york", "paris", "rome")
  root.mkdir(parents=True)
  for split, n in (("train", count), ("dev", 40)):
    with open(root / f"{split}.txt", "w") as f:
      f.write("-DOCSTART- -X- -X- O\n\n")
      for _ in range(n):
        words = [(w, "O") for w in rng.sample(WORDS, 5)]
        for kind, choices in (("PER", names), ("LOC", places)):
          entity = rng.choice(choices).split()
          at = rng.randrange(len(words) + 1)
          words[at:at] = [(w, ("B-" if j == 0 else "I-") + kind) for j, w in enumerate(entity)]
        f.write("".join(f"{w} NN O {t}\n" for w, t in words) + "\n")
  return root


@pytest.mark.slow
def test_token_classification_trains_and_tags_words(shared_data, tmp_path):
  data = conll_data(tmp_path / "data")
  config = f"experiments/token_classification.py:size=tiny,data={data},spm={spm(shared_data)}"
  result = cli(config, tmp_path / "run", *TINY_RUN)
  assert result.returncode == 0, result.stdout + result.stderr
  best = json.load(open(tmp_path / "run" / "best" / "best.json"))
  assert best["metric"] == "f1" and {"precision", "recall", "accuracy"} <= set(best["metrics"])
  rows = [json.loads(line) for line in open(best["weights"] + "/dev_predictions.jsonl")]
  assert len(rows) == 40 and all(len(r["tags"]) == len(r["tokens"]) == len(r["probabilities"]) for r in rows)
  assert list(rows[0]["probabilities"][0]) == ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
  user = tmp_path / "mine.jsonl"
  user.write_text(json.dumps({"id": "s1", "tokens": ["mary", "jones", "visited", "paris"]}) + "\n")
  out = cli(config, tmp_path / "run", *TINY_RUN, mode="predict",
            extra=[f"--input={user}", f"--output={tmp_path / 'tags.jsonl'}"])
  assert out.returncode == 0, out.stdout + out.stderr
  assert len(json.loads((tmp_path / "tags.jsonl").read_text())["tags"]) == 4
  assert f"predicting {user}: 1 rows predicted in " in out.stderr


@pytest.mark.slow
def test_multiple_choice_trains_with_masked_options(shared_data, tmp_path):
  rng = random.Random(3)
  (tmp_path / "data").mkdir()
  for split, count in (("train", 200), ("dev", 40)):
    with open(tmp_path / "data" / f"{split}.jsonl", "w") as f:
      for i in range(count):
        mood, text = next(sentences(rng, 1))
        options = sorted(MOODS)[:2 + i % 2]  # 2 or 3 options: the third is padding for every other question
        answer = options.index(mood) if mood in options else 0
        f.write(json.dumps({"id": f"q{i}", "context": text, "question": "how does it feel?", "options": options,
                            "answer": answer}) + "\n")
  config = f"experiments/multiple_choice.py:size=tiny,data={tmp_path / 'data'},spm={spm(shared_data)},choices=3"
  result = cli(config, tmp_path / "run", *TINY_RUN, "--config.data.max_qa_length=16")
  assert result.returncode == 0, result.stdout + result.stderr
  best = json.load(open(tmp_path / "run" / "best" / "best.json"))
  rows = [json.loads(line) for line in open(best["weights"] + "/dev_predictions.jsonl")]
  assert [len(r["probabilities"]) for r in rows[:4]] == [2, 3, 2, 3]
  assert rows[0]["answer"] in (0, 1) and abs(sum(rows[0]["probabilities"]) - 1) < 1e-4


# --- in-process -------------------------------------------------------------------------------------------------

def test_entity_scores_by_hand():
  """Gold: PER(0-1), LOC(3) | ORG(0). Predicted: PER(0-1) right; LOC(3-4) wrong span; an I-ORG that starts a chunk
  (IOB1 rule) of type ORG at 0 right; a stray MISC. Precision 2/4, recall 2/3, F1 4/7; words 7/10 right (I-LOC,
  I-ORG, B-MISC wrong)."""
  gold = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-ORG", "O", "O", "O", "O"]]
  pred = [["B-PER", "I-PER", "O", "B-LOC", "I-LOC"], ["I-ORG", "O", "B-MISC", "O", "O"]]
  assert metrics.entities(pred[0]) == {("PER", 0, 1), ("LOC", 3, 4)}
  assert metrics.entities(["B-PER", "I-LOC", "E-LOC", "S-PER"]) == {("PER", 0, 0), ("LOC", 1, 2), ("PER", 3, 3)}
  scores = metrics.entity_scores(gold, pred)
  assert scores["precision"] == 0.5 and scores["recall"] == pytest.approx(2 / 3)
  assert scores["f1"] == pytest.approx(4 / 7) and scores["accuracy"] == pytest.approx(0.7)


def test_labels_come_from_config_or_sorted_train_file(tmp_path):
  (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": "x", "label": label}) + "\n"
                                                for label in (10, 2, 2, 1)))
  assert _task(classification, f"data={tmp_path}").labels == ("1", "2", "10")
  assert _task(classification, f"data={tmp_path},labels=10|2|1").labels == ("10", "2", "1")
  with pytest.raises(InputError, match="unknown label '10'.*data.labels"):
    _task(classification, f"data={tmp_path},labels=1|2").read_examples(str(tmp_path / "train.jsonl"), True)
  with pytest.raises(FileNotFoundError, match="--config.data.labels"):
    _task(classification, f"data={tmp_path / 'none'}").labels
  with pytest.raises(ValueError, match=r"data.labels=\['pos'\] names one class; a classifier needs two or more"):
    _task(classification, f"data={tmp_path},labels=pos")  # trained with loss 0 and accuracy 1.0 before
  (tmp_path / "train.csv").write_text("text,label\n")
  with pytest.raises(ValueError, match="keep one"):
    _task(classification, f"data={tmp_path}").split_path("train")


def test_csv_quoting_and_column_errors(tmp_path):
  path = tmp_path / "dev.csv"
  path.write_text('text,label\n"a, quoted ""text""",pos\nplain,neg\n')
  task = _task(classification, "labels=neg|pos")
  examples = task.read_examples(str(path), labeled=True)
  assert [(ex.text_a, ex.label) for ex in examples] == [('a, quoted "text"', 1), ("plain", 0)]
  with pytest.raises(InputError, match="dev.csv:2: missing field 'sentence'"):
    _task(classification, "labels=neg|pos,text=sentence").read_examples(str(path), labeled=True)


def test_only_the_first_sub_token_of_a_word_is_tagged(shared_data, tmp_path):
  tokenizer = Tokenizer(str(spm(shared_data)))
  (tmp_path / "train.txt").write_text("Unbelievably B-X\nlong O\n\nyes O\n")
  task = _task(token_classification, f"data={tmp_path}")
  split = task.load_split("train", tokenizer)
  pieces = [len(tokenizer.encode(w)) for w in ("Unbelievably", "long")]
  assert pieces[0] > 1
  expected = [-1, 0, *[-1] * (pieces[0] - 1), 1, *[-1] * (pieces[1] - 1), -1]  # [CLS] words [SEP]
  assert split.features["label"][0, :len(expected)].tolist() == expected
  assert split.info["word_index"][0, :len(expected)].tolist() == [-1, 0, *[-1] * (pieces[0] - 1), 1,
                                                                 *[-1] * (pieces[1] - 1), -1]
  assert task.labels == ("B-X", "O") and len(split.examples) == 2


def test_regression_reads_numbers_scores_and_round_trips(tmp_path):
  path = tmp_path / "dev.csv"
  path.write_text("text,score\na,0.5\nb,4.5\nc,2\n")
  task = _task(classification, "regression=true,label=score")
  split = task.gold_split(str(path))
  assert [ex.label for ex in split.examples] == [0.5, 4.5, 2.0] and task.num_outputs == 1
  predictions = np.asarray([1.0, 4.0, 3.0])
  task.write_predictions(split, predictions, str(tmp_path / "out.jsonl"))
  np.testing.assert_allclose(task.read_predictions(str(tmp_path / "out.jsonl"), split), predictions)
  assert set(task.score(split, predictions)) == {"pearson", "spearman", "mse"}
  # a nan is refused like a word, not trained and scored as nan; float() alone reads "1_000" as 1000 and the
  # Arabic-Indic digits "١٢" as 12
  for bad in ("high", "nan", "1_000", "\u0661\u0662", "infinity"):
    with pytest.raises(InputError, match=f"'{bad}' is not a finite number"):
      path.write_text(f"text,score\na,{bad}\n")
      task.gold_split(str(path))


def test_mean_pooling_averages_the_unmasked_tokens():
  import jax
  from albert_jax import embed
  from albert_jax.model import AlbertModel, init_params
  from albert_jax.model_config import model_config_from
  model = AlbertModel(model_config_from(classification.get_config("size=tiny")))
  params = jax.jit(lambda key: init_params(model, key))(jax.random.key(0))  # op by op it takes twice as long
  batch = {"input_ids": np.asarray([[2, 10, 11, 3, 0, 0]]), "attention_mask": np.asarray([[1, 1, 1, 1, 0, 0]]),
           "token_type_ids": np.zeros((1, 6), np.int32)}
  sequence, pooled = model.apply({"params": params}, **batch, deterministic=True)
  mean = embed.embed_fn(model, "mean")(params, batch)["embedding"]
  np.testing.assert_allclose(mean, np.asarray(sequence)[:, :4].mean(1), rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(embed.embed_fn(model, "pooled")(params, batch)["embedding"], pooled)


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
  (tmp_path / "train.tsv").write_bytes("text\tlabel\ngood\tpos\ncaf\xe9\tneg\n".encode("latin-1"))
  with pytest.raises(InputError, match=r"train.tsv:3: not UTF-8 \(byte 0xe9 at column 4\)"):
    _task(classification, f"data={tmp_path}").labels


@pytest.mark.slow
def test_embed_with_a_pretraining_config_writes_the_file_it_names(tmp_path):
  """Pretraining configs carry no data.do_lower_case; the output lands under its exact name, folders made."""
  corpus = tmp_path / "corpus.txt"  # enough text for the 300 pieces of SMALL_RUN's vocabulary
  corpus.write_text(ALICE.read_text()[:200_000])
  model = train_spm.train(Source(str(corpus), format="paragraphs"), str(tmp_path / "m.model"), vocab_size=300)
  steps = ["--config.train.num_train_steps=2", "--config.checkpoint.every=2"]
  assert pretraining(tmp_path / "pt", *SMALL_RUN, *steps).returncode == 0
  texts, output = tmp_path / "texts.txt", tmp_path / "new" / "vectors"
  texts.write_text("Alice was beginning to get very tired\n\nof sitting by her sister\n")
  result = pretraining(tmp_path / "pt", *SMALL_RUN, *steps, "--mode=embed", f"--input={texts}",
                       f"--output={output}", f"--config.data.spm_model={model}")
  assert result.returncode == 0, result.stdout + result.stderr
  assert "loading its newest checkpoint (step 2)" in result.stdout and f"to {output}\n" in result.stdout
  assert np.load(output).shape == (3, 64)
  texts.write_text("Alice was beginning\rto get very tired\r")  # old Mac line ends: not one text of two lines
  result = pretraining(tmp_path / "pt", *SMALL_RUN, *steps, "--mode=embed", f"--input={texts}",
                       f"--output={output}.cr", f"--config.data.spm_model={model}")
  assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith(
      f"error: {texts}:1: a carriage return (\\r) inside the line"), result.stderr
  assert not (tmp_path / "new" / "vectors.cr").exists()
  no_input = pretraining(tmp_path / "pt", *SMALL_RUN, *steps, "--mode=embed", f"--output={output}.none")
  assert no_input.returncode == 1 and no_input.stderr.strip().splitlines() == [
      "error: --mode=embed needs --input=FILE (one text per line) and --output=PATH.npy."], no_input.stderr
  texts.write_text("Alice was beginning to get very tired\n" * 2000)
  with small_tmpfs(tmp_path / "disk", "64k") as disk:
    full = pretraining(tmp_path / "pt", *SMALL_RUN, *steps, "--mode=embed", f"--input={texts}",
                       f"--output={disk}/vectors.npy", f"--config.data.spm_model={model}")
    assert list(disk.iterdir()) == []  # no partial file left
  assert full.returncode == 1 and "Traceback" not in full.stderr, full.stderr
  assert full.stderr.strip().splitlines()[-1] == (f"error: Writing --output={disk}/vectors.npy failed (No space "
                                                  "left on device); free space, or pass an --output elsewhere, and "
                                                  "rerun."), full.stderr


@pytest.mark.parametrize("record, message", [
    ({"context": "c", "question": "q", "options": ["a", "b"], "answer": True},
     "field 'answer' should be int, got bool"),
    ({"context": "c", "question": "q", "options": ["a", None], "answer": 0}, "option null is not text"),
    ({"context": "c", "question": "q", "options": ["a", {"x": 1}], "answer": 0}, 'option {"x": 1} is not text')])
def test_multiple_choice_fields_are_typed(tmp_path, record, message):
  """`"answer": true` is not taken as option 1, nor null or an object as the option texts "None" and "{'x': 1}"."""
  path = tmp_path / "train.jsonl"
  path.write_text(json.dumps(record) + "\n")
  with pytest.raises(InputError, match=re.escape(f"train.jsonl:1: {message}")):
    _task(multiple_choice, f"data={tmp_path}", max_seq_length=128).read_examples(str(path), True)
