"""Length buckets (albert_jax/buckets.py): parsing, assignment, epochs that see every example once in a shuffled
order that resumes exactly, and batches cut to their bucket."""
import json
import shutil

import jax
import numpy as np
import pytest

from albert_jax import buckets
from albert_jax.engine import BatchSplit
from albert_jax.errors import InputError
from tests.helpers import TINY_RUN, assert_trees_equal, final_params, finetune_cli as cli, glue_data, spm


def features_of_lengths(lengths, max_len=16, choices=None):
  """Rows whose attention mask covers `lengths` tokens (input ids count the row), labels the row index."""
  n = len(lengths)
  shape = (n, max_len) if choices is None else (n, choices, max_len)
  mask = np.zeros(shape, np.int32)
  for i, length in enumerate(lengths):
    mask[i, ..., :length] = 1
  return {"input_ids": mask * (np.arange(n)[:, None] if choices is None else np.arange(n)[:, None, None]),
          "attention_mask": mask, "token_type_ids": np.zeros(shape, np.int32), "labels": np.arange(n)}


def split_of(global_batch, process_count=1, process_index=0):
  return BatchSplit(global_batch, global_batch // process_count, 1, 1, process_count, process_index)


@pytest.mark.parametrize("spec, expected", [
    ("64,128,256,512", (64, 128, 256, 512)),
    ("256, 64,128", (64, 128, 256, 512)),     # sorted, max_seq_length added
    ("64,1024", (64, 512)),                   # longer than max_seq_length: dropped
    ("none", (512,)), ("", (512,)), (None, (512,)), ("None", (512,)),
    (128, (128, 512)),
])
def test_parse(spec, expected):
  assert buckets.parse(spec, 512) == expected


@pytest.mark.parametrize("spec, message", [
    ("64;128", "is not a comma-separated list of lengths"),
    ("1,64", "every length must be at least 2"),
    ("0", "every length must be at least 2"),
])
def test_parse_refuses_by_name(spec, message):
  with pytest.raises(InputError, match=f"data.length_buckets={spec!r}.*{message}"):
    buckets.parse(spec, 512)


def test_each_row_goes_to_the_smallest_bucket_that_holds_it():
  features = features_of_lengths([1, 4, 5, 8, 9, 16])
  assert buckets.row_lengths(features).tolist() == [1, 4, 5, 8, 9, 16]
  assert buckets.assign(buckets.row_lengths(features), (4, 8, 16)).tolist() == [0, 0, 1, 1, 2, 2]
  choices = features_of_lengths([3, 7], choices=2)   # a multiple-choice row: its longest choice
  choices["attention_mask"][0, 1, :] = 0
  assert buckets.row_lengths(choices).tolist() == [3, 7]


def test_cut_keeps_per_row_values_whole():
  features = features_of_lengths([2, 3], max_len=16)
  cut = buckets.cut(features, 4, 16)
  assert cut["input_ids"].shape == (2, 4) and cut["attention_mask"].shape == (2, 4)
  assert cut["labels"].tolist() == [0, 1]
  square = {"input_ids": np.zeros((16, 16), np.int32), "labels": np.arange(16)}  # rows == positions: labels whole
  assert buckets.cut(square, 4, 16)["labels"].shape == (16,)


def test_an_epoch_sees_every_row_once_in_batches_of_one_bucket():
  rng = np.random.default_rng(0)
  lengths = rng.integers(2, 17, size=203)
  features = features_of_lengths(lengths)
  bucket_lengths = (4, 8, 12, 16)
  batches = buckets.BucketedBatches(features, bucket_lengths, split_of(8), seed=3)
  seen = []
  for _ in range(batches.steps_per_epoch):
    batch = next(batches)
    width = batch["input_ids"].shape[1]
    assert width in bucket_lengths and batch["input_ids"].shape[0] == 8
    assert buckets.row_lengths(batch).max() <= width  # every row fits the bucket it was cut to
    seen += batch["labels"].tolist()
  assert len(seen) == len(set(seen)) == batches.steps_per_epoch * 8
  assert len(lengths) - len(seen) < 8            # at most one batch's worth left out
  left_out = set(range(len(lengths))) - set(seen)
  assert all(lengths[i] > 12 for i in left_out)  # and only from the longest bucket
  # The next epoch is another order of the same rows.
  second = [r for _ in range(batches.steps_per_epoch) for r in next(batches)["labels"].tolist()]
  assert second != seen and len(set(second)) == len(second)


def test_a_bucket_smaller_than_a_batch_is_carried_into_the_next():
  features = features_of_lengths([2, 2, 2] + [10] * 13)   # 3 short rows: never a batch of 8 of their own
  batches = buckets.BucketedBatches(features, (4, 16), split_of(8), seed=0)
  assert batches.steps_per_epoch == 2
  seen = sorted(r for _ in range(2) for r in next(batches)["labels"].tolist())
  assert {0, 1, 2} <= set(seen) and len(seen) == 16


def test_batch_order_mixes_buckets_in_proportion():
  """Over many epochs, the share of short-bucket batches among the first batches matches their share overall."""
  features = features_of_lengths([3] * 96 + [12] * 32)   # 12 short batches, 4 long ones of 8
  batches = buckets.BucketedBatches(features, (4, 16), split_of(8), seed=1)
  first_widths = []
  for _ in range(200):
    first_widths.append(next(batches)["input_ids"].shape[1])
    for _ in range(batches.steps_per_epoch - 1):
      next(batches)
  assert 0.65 < np.mean(np.array(first_widths) == 4) < 0.85   # 12 / 16 = 0.75


def test_resume_continues_exactly_mid_epoch_and_across_processes():
  features = features_of_lengths(np.random.default_rng(1).integers(2, 17, size=100))
  run = buckets.BucketedBatches(features, (8, 16), split_of(8), seed=5)
  for _ in range(7):
    next(run)
  state = run.get_state()
  expected = [next(run) for _ in range(20)]            # crosses into the next epoch
  resumed = buckets.BucketedBatches(features, (8, 16), split_of(8), seed=5)
  resumed.set_state(state)
  for want in expected:
    got = next(resumed)
    assert all(np.array_equal(got[k], want[k]) for k in want)
  halves = [buckets.BucketedBatches(features, (8, 16), split_of(8, 2, i), seed=5) for i in range(2)]
  for half in halves:
    half.set_state(state)
  assert np.concatenate([next(h)["labels"] for h in halves]).tolist() == expected[0]["labels"].tolist()


def test_too_few_rows_for_a_batch_is_refused():
  with pytest.raises(InputError, match="fewer than train.global_batch_size=8"):
    buckets.BucketedBatches(features_of_lengths([3] * 5), (4, 16), split_of(8), seed=0)


# ------------------------------------------------------------------------------------ through fine-tuning runs

def rte_config(root, spm_model, *overrides):
  """A tiny RTE run at sequence length 128 in buckets 32 and 64 (RTE pairs average about 70 tokens)."""
  from albert_jax.cli import experiment_config
  return experiment_config(["test", f"--config=experiments/glue.py:task=rte,size=tiny,data={root},spm={spm_model}",
                            *TINY_RUN, "--config.data.max_seq_length=128", "--config.data.length_buckets=32,64",
                            *overrides])


@pytest.mark.slow
def test_a_bucketed_run_compiles_one_step_per_bucket_resumes_exactly_and_predicts_as_unbucketed(shared_data,
                                                                                                   tmp_path):
  from albert_jax import engine, feature_batches, finetune, prediction
  from albert_jax.model_config import model_config_from
  from albert_jax.tasks import get_task, make_tokenizer
  from albert_jax.weights import store
  root, spm_model = glue_data(shared_data, "rte", tmp_path / "glue"), spm(shared_data)
  spec = f"experiments/glue.py:task=rte,size=tiny,data={root},spm={spm_model}"
  bucketed = ["--config.data.max_seq_length=128", "--config.data.length_buckets=32,64"]
  straight = cli(spec, tmp_path / "straight", *TINY_RUN, *bucketed, fast_compile=True)
  assert straight.returncode == 0, straight.stderr
  # One compile per batch shape the 4 steps used, as BucketedBatches draws them, and the longest's first, whose
  # memory is checked before the run writes (`host_memory.check_compiled`).
  config = rte_config(root, spm_model)
  task = get_task(config)
  train = task.load_split("train", make_tokenizer(config))
  order = buckets.BucketedBatches(train.features, (32, 64, 128), split_of(8), config.seed)
  widths = [next(order)["input_ids"].shape[1] for _ in range(4)]
  compiles = [line for line in straight.stdout.splitlines() if line.startswith("Compiling the train step")]
  assert len(compiles) == len(set(widths) | {128}) > 1 and "; inputs " not in compiles[0], (widths, compiles)
  # Resumed from its checkpoint of step 2, mid-epoch: the same weights as the straight run, bit for bit.
  shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
  shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "4")
  resumed = cli(spec, tmp_path / "resumed", *TINY_RUN, *bucketed, fast_compile=True)
  assert resumed.returncode == 0 and "Resumed from step 2" in resumed.stdout, resumed.stderr
  assert_trees_equal(final_params(tmp_path / "straight"), final_params(tmp_path / "resumed"))
  # The dev split predicted in buckets and padded to 128: the same labels, probabilities within 1e-5.
  model = task.build_model(model_config_from(config))
  dev = task.load_split("dev", make_tokenizer(config))
  s = engine.setup(config, finetune.make_job(task, model))
  weights = json.load(open(tmp_path / "straight" / "best" / "best.json"))["weights"]
  with s.context():
    params = s.replicate(store.load_pretrained(weights)[1])
    logits = [prediction.predict_features(task.predictor(model), params, dev.features, s,
                                          lengths=lengths)["logits"]
              for lengths in ((128,), feature_batches.length_buckets(config, task))]
  assert len(set(buckets.assign(buckets.row_lengths(dev.features), (32, 64, 128)).tolist())) > 1
  probabilities = [jax.nn.softmax(np.asarray(x, np.float64), -1) for x in logits]
  np.testing.assert_array_equal(probabilities[0].argmax(-1), probabilities[1].argmax(-1))
  np.testing.assert_allclose(probabilities[0], probabilities[1], atol=1e-5)


def test_tasks_with_outputs_per_token_keep_the_full_length():
  from albert_jax import feature_batches
  from albert_jax.tasks import TaskSettings, get_task
  config = rte_config("/nowhere", "/nowhere.model")
  assert feature_batches.length_buckets(config, get_task(config)) == (32, 64, 128)
  for task in ("squad_v1", "token_classification"):
    assert feature_batches.length_buckets(config, get_task(TaskSettings(task=task))) == (128,)
  config.data.length_buckets = "none"
  assert feature_batches.length_buckets(config, get_task(config)) == (128,)
