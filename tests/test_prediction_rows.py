"""`--mode=predict --output=PATH.jsonl` of a GLUE run: a JSON line per example with every class's probability and
logit (the TSV keeps GLUE's submission format); a .jsonl --output of a task whose predictions are JSON is refused
before anything runs. The run behind them warns once of its warmup longer than the run."""
import functools
import json
import types

import numpy as np
import pytest

from albert_jax import prediction
from albert_jax.errors import InputError
from tests.helpers import TINY_RUN, finetune_cli, glue_data, spm, squad_task

# XLA at -O0 (tests.helpers.cpu_env): the predictions are compared only with one another.
cli = functools.partial(finetune_cli, fast_compile=True)


@pytest.fixture(scope="module")
def run(shared_data, tmp_path_factory):
  """RTE fine-tuned 2 steps with train.warmup_steps=10, then its dev split predicted as JSON lines and as the TSV,
  and a file of two pairs as JSON lines."""
  root = tmp_path_factory.mktemp("predict")
  data = glue_data(shared_data, "rte", root / "glue")
  config = f"experiments/glue.py:task=rte,size=tiny,data={data},spm={spm(shared_data)}"
  overrides = [*TINY_RUN, "--config.train.num_train_steps=2", "--config.train.warmup_steps=10"]
  trained = cli(config, root / "run", *overrides)
  assert trained.returncode == 0, trained.stderr
  (root / "pairs.tsv").write_text("id\ttext_a\ttext_b\nfirst\tA cat sat.\tA cat sat down.\n"
                                  "second\tIt rained.\tThe street is dry.\n")
  predicted = {output: cli(config, root / "run", *overrides, mode="predict", extra=extra)
               for output, extra in (("dev.jsonl", ["--split=dev", f"--output={root / 'dev.jsonl'}"]),
                                     ("dev.tsv", ["--split=dev", f"--output={root / 'dev.tsv'}"]),
                                     ("pairs.jsonl", [f"--input={root / 'pairs.tsv'}",
                                                      f"--output={root / 'pairs.jsonl'}"]))}
  for result in predicted.values():
    assert result.returncode == 0, result.stderr
  return types.SimpleNamespace(root=root, trained=trained)


def rows(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_the_warmup_warning_is_printed_once(run):
  assert run.trained.stdout.count("WARNING: train.warmup_steps=10 > train.num_train_steps=2") == 1, \
      run.trained.stdout


@pytest.mark.slow
def test_predict_to_jsonl_writes_every_class_s_probability_and_logit(run):
  dev = rows(run.root / "dev.jsonl")
  tsv = [line.split("\t") for line in (run.root / "dev.tsv").read_text().splitlines()[1:]]
  assert [row["id"] for row in dev] == [index for index, _ in tsv] and len(dev) == 23  # 24 lines: a header
  for row, (_, label) in zip(dev, tsv):
    assert set(row) == {"id", "label", "probabilities", "logits"} and row["label"] == label
    classes = ["entailment", "not_entailment"]
    logits = np.array([row["logits"][name] for name in classes])
    probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    np.testing.assert_allclose([row["probabilities"][name] for name in classes], probabilities, rtol=1e-12)
    assert row["label"] == classes[int(logits.argmax())]
  assert [row["id"] for row in rows(run.root / "pairs.jsonl")] == ["first", "second"]


def test_a_jsonl_output_of_a_task_that_writes_json_is_refused():
  with pytest.raises(InputError) as refused:
    prediction.check_output(squad_task(1), "/tmp/answers.jsonl")
  assert str(refused.value) == ("--output=/tmp/answers.jsonl: squad_v1 predictions are written as .json, not JSON "
                                "lines; name the output /tmp/answers.json.")
  prediction.check_output(squad_task(1), "/tmp/answers.json")
