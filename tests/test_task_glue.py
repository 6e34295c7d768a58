"""GLUE: readers on every provided file, clear input errors, the pair truncation rule, submission files and the
standalone scorer."""
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from albert_jax.tasks import get_task
from albert_jax.errors import InputError
from experiments import glue

# (task, file, labelled, examples): the counts of shared/data/README.md (= the official split sizes).
FILES = [("cola", "CoLA/train.tsv", 8551), ("cola", "CoLA/dev.tsv", 1043), ("cola", "CoLA/in_domain_dev.tsv", 527),
         ("cola", "CoLA/out_of_domain_dev.tsv", 516), ("sst-2", "SST-2/train.tsv", 67349),
         ("sst-2", "SST-2/dev.tsv", 872), ("mrpc", "MRPC/train.tsv", 3668), ("mrpc", "MRPC/dev.tsv", 408),
         ("sts-b", "STS-B/train.tsv", 5749), ("sts-b", "STS-B/dev.tsv", 1500), ("rte", "RTE/train.tsv", 2490),
         ("rte", "RTE/dev.tsv", 277), ("wnli", "WNLI/train.tsv", 635), ("wnli", "WNLI/dev.tsv", 71),
         ("qnli", "QNLI/dev.tsv", 5463)]


def task_for(name, data="", max_seq_length=128):
  config = glue.get_config(f"task={name},size=tiny,data={data}")
  config.data.max_seq_length = max_seq_length
  return get_task(config)


@pytest.mark.parametrize("name,file,count", FILES)
def test_reads_every_provided_file(shared_data, name, file, count):
  examples = task_for(name).read_examples(str(shared_data / "glue" / file), labeled=True)
  assert len(examples) == count
  spec = task_for(name).spec
  labels = [ex.label for ex in examples]
  if spec.is_regression:
    assert min(labels) >= 0 and max(labels) <= 5
  else:
    assert set(labels) == set(range(len(spec.labels)))
  pair = name not in ("cola", "sst-2")
  assert all(ex.text_a for ex in examples) and all(bool(ex.text_b) == pair for ex in examples)


def test_mrpc_columns_and_bom(shared_data):
  ex = task_for("mrpc").read_examples(str(shared_data / "glue/MRPC/dev.tsv"), labeled=True)[0]
  assert ex.label == 1 and ex.text_a.startswith("He said the foodservice pie business")
  assert ex.text_b.startswith('" The foodservice pie business does not fit')


def _write(tmp_path, name, text):
  path = tmp_path / name
  path.write_text(text, encoding="utf-8")
  return str(path)


def test_errors_name_file_and_line(tmp_path):
  rte = task_for("rte")
  path = _write(tmp_path, "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\n")
  with pytest.raises(InputError, match=r"dev.tsv:3: 3 tab-separated fields but the header \(line 1\) has 4"):
    rte.read_examples(path, labeled=True)
  path = _write(tmp_path, "dev2.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tcontradiction\n")
  with pytest.raises(InputError, match=r"dev2.tsv:2: unknown label 'contradiction' for rte"):
    rte.read_examples(path, labeled=True)
  path = _write(tmp_path, "sts.tsv", "\t".join(["h"] * 10) + "\n" + "\t".join(["x"] * 9 + ["high"]) + "\n")
  with pytest.raises(InputError, match=r"sts.tsv:2: label 'high' is not a finite number"):
    task_for("sts-b").read_examples(path, labeled=True)
  with pytest.raises(ValueError, match="Unknown GLUE task 'foo'"):
    task_for("foo")
  with pytest.raises(ValueError, match="no split 'dev_mismatched'"):
    rte.split_path("dev_mismatched")


@pytest.mark.parametrize("name,file,line,message", [
    ("mrpc", "MRPC/dev.tsv", 5, "6 tab-separated fields but the header (line 1) has 5"),
    ("cola", "CoLA/dev.tsv", 10, "5 tab-separated fields but CoLA files have 4")])
def test_stray_tab_in_a_sentence_is_refused(shared_data, tmp_path, name, file, line, message):
  lines = (shared_data / "glue" / file).read_bytes().split(b"\n")
  last = lines[line - 1].rsplit(b"\t", 1)   # the last column is a sentence in both files
  words = last[1].split(b" ")
  lines[line - 1] = last[0] + b"\t" + b" ".join(words[:2]) + b"\t" + b" ".join(words[2:])
  path = tmp_path / "dev.tsv"
  path.write_bytes(b"\n".join(lines))
  with pytest.raises(InputError) as error:
    task_for(name).read_examples(str(path), labeled=True)
  assert str(error.value) == f"{path}:{line}: {message}; a tab inside the text? Replace it by a space on that line."


def test_prediction_file_refusals(shared_data, tmp_path):
  task = task_for("rte")
  split = task.gold_split(str(shared_data / "glue/RTE/dev.tsv"))
  rows = [f"{i}\tentailment" for i in range(len(split.examples))]
  cases = {
      "no_header": ("\n".join(rows), ":1: the first line must be the header 'index<TAB>prediction', got ['0', "),
      "conflict": ("\n".join(["index\tprediction", *rows, "3\tnot_entailment"]),
                   f":{len(rows) + 2}: index 3 has another prediction on line 5; keep one."),
      "extra": ("\n".join(["index\tprediction", *rows, "900\tentailment", "901\tentailment"]),
                f":{len(rows) + 2}: 2 index(es) are not in {split.path}, e.g. 900; score against the gold file"),
      "fields": ("\n".join(["index\tprediction", "0\tentailment\tx"]), ":2: 3 tab-separated fields, expected 2"),
  }
  for name, (text, message) in cases.items():
    path = _write(tmp_path, f"{name}.tsv", text + "\n")
    with pytest.raises(InputError) as error:
      task.read_predictions(path, split)
    assert str(error.value).startswith(path + message), (name, str(error.value))
  same = _write(tmp_path, "same.tsv", "\n".join(["index\tprediction", *rows, "3\tentailment"]) + "\n")
  assert task.score(split, task.read_predictions(same, split)) == {
      "accuracy": sum(ex.label == 0 for ex in split.examples) / len(split.examples)}


def test_mnli_splits_and_test_files(tmp_path, tokenizer):
  header = "\t".join(f"c{i}" for i in range(12))
  row = lambda label: "\t".join(["0", "1", "2", "fiction", "(", "(", "(", "(", "The cat sat.", "A cat sat.", "x",
                                 label])
  _write(tmp_path, "dev_matched.tsv", f"{header}\n{row('neutral')}\n{row('entailment')}\n")
  _write(tmp_path, "dev_mismatched.tsv", f"{header}\n{row('contradiction')}\n")
  test_header = "\t".join(f"t{i}" for i in range(10))
  _write(tmp_path, "test_matched.tsv", test_header + "\n" + "\t".join(["17"] + ["x"] * 7 + ["a", "b"]) + "\n")
  mnli = task_for("mnli")
  mnli.settings = dataclasses.replace(mnli.settings, path=str(tmp_path))
  assert [ex.label for ex in mnli.load_split("dev", tokenizer).examples] == [2, 1]
  assert mnli.load_split("dev_mismatched", tokenizer).features["label"].tolist() == [0]
  test = mnli.load_split("test", tokenizer)
  assert "label" not in test.features and test.examples[0].guid == "17"
  out = tmp_path / "MNLI-m.tsv"
  mnli.write_predictions(test, np.array([1]), str(out))
  assert out.read_text() == "index\tprediction\n17\tentailment\n"
  assert mnli.submission_name("test_mismatched") == "MNLI-mm.tsv"


def test_pair_truncation_pops_from_end_of_longer(tokenizer):
  task = task_for("rte", max_seq_length=16)
  a, b = "one two three four five six seven eight nine ten", "alpha beta gamma"
  from albert_jax.tasks.glue import GlueExample
  features, _ = task.featurize([GlueExample("0", a, b, 0)], tokenizer)
  ids = features["input_ids"][0].tolist()
  ta, tb = tokenizer.encode(a), tokenizer.encode(b)
  room = 16 - 3
  while len(ta) + len(tb) > room:
    (ta if len(ta) > len(tb) else tb).pop()
  assert ids == [tokenizer.cls_id, *ta, tokenizer.sep_id, *tb, tokenizer.sep_id][:16]
  assert features["token_type_ids"][0].tolist() == [0] * (len(ta) + 2) + [1] * (len(tb) + 1)
  assert features["attention_mask"][0].sum() == 16


def test_featurize_real_dev_and_score_roundtrip(shared_data, tokenizer, tmp_path):
  task = task_for("sts-b", data=str(shared_data / "glue"), max_seq_length=128)
  split = task.load_split("dev", tokenizer)
  assert split.features["input_ids"].shape == (1500, 128) and split.features["label"].dtype == np.float32
  assert (split.features["input_ids"][:, 0] == tokenizer.cls_id).all()
  scores = split.features["label"] + np.cos(np.arange(1500)).astype(np.float32)
  predictions = task.postprocess(split, {"logits": scores[:, None]})
  metrics = task.score(split, predictions)
  assert task.metric_name == "pearson" and set(metrics) == {"pearson", "spearman"}
  path = tmp_path / "STS-B.tsv"
  task.write_predictions(split, predictions, str(path))
  result = subprocess.run([sys.executable, "-m", "albert_jax.evaluate", "--task=sts-b",
                           f"--data={shared_data / 'glue/STS-B/dev.tsv'}", f"--predictions={path}"],
                          capture_output=True, text=True, check=True)
  assert json.loads(result.stdout.strip().splitlines()[-1]) == pytest.approx(metrics, abs=1e-6)


@pytest.mark.parametrize("arguments, message", [
    (["--task=sst-2", "--data={glue}/SST-2", "--predictions={glue}/SST-2/dev.tsv"],
     "--data={glue}/SST-2 is a folder; pass a file."),
    (["--task=sst-2", "--data={glue}/SST-2/dev.tsv", "--predictions={tmp}/missing.tsv"],
     "--predictions={tmp}/missing.tsv does not exist."),
    (["--task=race", "--data={glue}/SST-2/dev.tsv", "--predictions={glue}/SST-2/dev.tsv"],
     "--data={glue}/SST-2/dev.tsv is a file; pass a RACE split folder (with middle/ and high/)."),
    (["--task=ax", "--data=x", "--predictions=y"],
     "Unknown task 'ax'; choose a GLUE task (cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, rte, wnli), squad_v1, "
     "squad_v2 or race.")])
def test_the_scorer_names_a_wrong_path_or_task_in_one_line(shared_data, tmp_path, arguments, message):
  """A folder as --data, a missing --predictions file, a file where RACE needs a folder, and AX (which has no public
  labels): each refused in one line that names it."""
  fill = lambda text: text.format(glue=shared_data / "glue", tmp=tmp_path)
  result = subprocess.run([sys.executable, "-m", "albert_jax.evaluate", *map(fill, arguments)],
                          capture_output=True, text=True)
  assert result.returncode == 1 and result.stderr.strip() == f"evaluate: error: {fill(message)}", result.stderr


def test_user_file(tmp_path, tokenizer):
  path = _write(tmp_path, "mine.tsv", "id\ttext_a\ttext_b\nq1\tA man sings.\tSomeone sings.\n")
  split = task_for("rte").read_user_file(path, tokenizer)
  assert split.examples[0].guid == "q1" and "label" not in split.features
  path = _write(tmp_path, "mine.jsonl", '{"text_a": "great film"}\n{"text_a": "awful"}\n')
  assert task_for("sst-2").read_user_file(path, tokenizer).features["input_ids"].shape == (2, 128)
  bad = _write(tmp_path, "bad.jsonl", '{"text_a": "x"}\n{"sentence": "y"}\n')
  with pytest.raises(InputError, match=r"bad.jsonl:2: missing field 'text_a'"):
    task_for("sst-2").read_user_file(bad, tokenizer)
