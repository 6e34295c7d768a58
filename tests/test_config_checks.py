"""Config values that would crash later or mislead, refused in one line before anything is compiled or written, the
same in every mode: batch sizes, sequence and prediction lengths, the mesh's shape; and `--fit`'s advice when even
the smallest setting does not fit."""
import re

import jax
import ml_collections
import numpy as np
import pytest

from albert_jax import engine, seeds
from albert_jax.errors import InputError
from albert_jax.model_config import ModelConfig
from albert_jax.tasks.base import AT_LEAST_ONE, TaskSettings
from albert_jax.tasks.race import RaceTask
from albert_jax.tasks.squad import SquadTask
from data_pipeline.pair_layout import BERT, ROBERTA
from experiments.common import pretraining_config
from tests.cli_forks import run_each
from tests.helpers import SMALL_RUN, TINY_RUN, compile_cli, compile_env, cpu_env, glue_data, require_module, spm

FORM = "(('data', -1), ('fsdp', 1), ('tensor', 1))"
PRETRAINING = "--config=experiments/pretrain_tiny.py:synthetic"


def last_line(result) -> str:
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  return result.stderr.strip().splitlines()[-1]


def refused(command_lines: dict, env: dict[str, str]) -> dict:
  """{key: finished process} of each command line in `command_lines` ({key: arguments}), all run for the start-up
  of one process (tests.cli_forks)."""
  return dict(zip(command_lines, run_each(list(command_lines.values()), env)))


COMPILE_REFUSALS = [
    (["--config.train.micro_batch_size=-1"], "train.micro_batch_size=-1 must be positive"),
    (["--config.train.global_batch_size=-8", "--fit"], "train.global_batch_size=-8 must be positive"),
    (["--config.train.max_micro_batch_size=-1", "--fit"], "train.max_micro_batch_size=-1 must be positive"),
    (["--config.train.num_train_steps=0"], "train.num_train_steps=0 must be positive"),
    (["--config.data.max_seq_length=0"], "data.max_seq_length=0 leaves no room for [CLS] A [SEP] B [SEP]"),
    (["--config.data.ngram=0"], "data.ngram=0 must be at least 1"),
]


@pytest.fixture(scope="module")
def compile_refusals() -> dict:
  return refused({tuple(args): [PRETRAINING, "--mode=compile", "--topology=v3-8", *args]
                  for args, _ in COMPILE_REFUSALS}, compile_env())


@pytest.mark.parametrize("args, message", COMPILE_REFUSALS)
def test_compile_refuses_what_train_refuses(compile_refusals, args, message):
  assert last_line(compile_refusals[tuple(args)]).startswith(f"error: {message}")


@pytest.mark.parametrize("sizes, message", [
    (dict(global_batch_size=0), "train.global_batch_size=0 must be positive"),
    (dict(micro_batch_size=-1), "train.micro_batch_size=-1 must be positive"),   # 16 % -1 == 0 passed
    (dict(max_micro_batch_size=-1), "train.max_micro_batch_size=-1 must be positive"),
])
def test_batch_split_refuses_sizes_below_zero(sizes, message):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
  train = ml_collections.ConfigDict({"global_batch_size": 16, "micro_batch_size": 0, "max_micro_batch_size": 0,
                                     **sizes})
  with pytest.raises(ValueError, match=re.escape(message)):
    engine.batch_split(train, mesh, 1, 0)


LENGTH_REFUSALS = [
    ("describe", "max_seq_length=-5", "data.max_seq_length=-5 leaves no room for [CLS] A [SEP] B [SEP]; give "
                                      "--config.data.max_seq_length=5 or more."),
    ("describe", "max_seq_length=256", "data.max_seq_length=256 exceeds model.max_position_embeddings=32"),
    ("describe", "max_predictions_per_seq=-1", "data.max_predictions_per_seq=-1 must be from 0"),
    ("describe", "max_predictions_per_seq=32", "data.max_predictions_per_seq=32 must be from 0 (masked_lm_prob of "
                                               "the tokens) to 31"),
    ("train", "max_seq_length=0", "data.max_seq_length=0 leaves no room for [CLS]"),
    ("train", "max_predictions_per_seq=-1", "data.max_predictions_per_seq=-1 must be from 0"),
]


@pytest.fixture(scope="module")
def length_refusals(tmp_path_factory) -> dict:
  """{(mode, override): (finished process, the workdir it was given)}."""
  root = tmp_path_factory.mktemp("lengths")
  workdirs = {(mode, override): root / f"run{i}" for i, (mode, override, _) in enumerate(LENGTH_REFUSALS)}
  results = refused({key: [PRETRAINING, f"--workdir={workdirs[key]}", *SMALL_RUN, f"--mode={key[0]}",
                           f"--config.data.{key[1]}"] for key in workdirs}, cpu_env(1))
  return {key: (results[key], workdirs[key]) for key in workdirs}


@pytest.mark.parametrize("mode, override, message", LENGTH_REFUSALS)
def test_lengths_the_model_cannot_take_are_refused_before_anything_is_written(length_refusals, mode, override,
                                                                              message):
  result, workdir = length_refusals[mode, override]
  assert last_line(result).startswith(f"error: {message}")
  assert not workdir.exists()


@pytest.mark.parametrize("length, pretraining, pair_layout, refused", [
    (2, False, None, "[CLS] text [SEP]"), (3, False, None, None),   # [CLS][SEP] holds no text
    (4, False, BERT, "[CLS] A [SEP] B [SEP]"), (5, False, BERT, None),
    (5, False, ROBERTA, "[CLS] A [SEP] [SEP] B [SEP]"), (6, False, ROBERTA, None),  # <s> A </s></s> B </s>
    (4, True, None, "[CLS] A [SEP] B [SEP]"), (5, True, None, None),
])
def test_a_sequence_length_that_holds_no_text_is_refused(length, pretraining, pair_layout, refused):
  model = ModelConfig(vocab_size=97, max_position_embeddings=32)
  check = lambda: model.check_seq_length(length, 0 if pretraining else None, pair_layout=pair_layout)
  if refused is None:
    check()
    return
  with pytest.raises(ValueError, match=re.escape(f"data.max_seq_length={length} leaves no room for {refused}; give "
                                                 f"--config.data.max_seq_length={length + 1} or more")):
    check()


@pytest.mark.parametrize("rate, message", [
    (5e-324, "train.learning_rate=5e-324 is 0 in float32 (below its smallest normal number, 1.17549e-38), so nothing "
             "would train"),
    (1e-39, "train.learning_rate=1e-39 is 0 in float32 (below its smallest normal number, 1.17549e-38), so nothing "
            "would train"),
    (1e39, "train.learning_rate=1e+39 is infinite in float32 (beyond 3.40282e+38)"),
    (float("nan"), "train.learning_rate=nan is not a finite number"),
    (float("inf"), "train.learning_rate=inf is not a finite number"),
    (-1e-5, "train.learning_rate=-1e-05 is negative (that is gradient ascent)"),
    (0.0, None), (1e-37, None), (1e30, None),     # 0: a frozen run
])
def test_a_learning_rate_that_is_0_or_infinite_in_float32_is_refused(rate, message):
  config = pretraining_config("tiny")
  config.train.learning_rate = rate
  if message is None:
    engine.check_training_config(config)
    return
  with pytest.raises(ValueError, match=re.escape(f"{message}; give a positive rate such as 1e-4")):
    engine.check_training_config(config)


@pytest.mark.parametrize("value, message", [
    ("5e-324", "--learning_rates: 5e-324 is 0 in float32"),
    ("1e-40", "--learning_rates: 1e-40 is 0 in float32"),
    ("1e39", "--learning_rates: 1e+39 is infinite in float32"),
])
def test_a_grid_rate_that_is_0_or_infinite_in_float32_is_refused(value, message):
  with pytest.raises(ValueError, match=re.escape(message)) as refusal:
    seeds.parse_learning_rates(["1e-5", value])
  assert str(refusal.value).endswith("; list rates such as 1e-5,2e-5,3e-5.")


def test_fine_tuning_lengths_and_rates_that_train_nothing_are_refused_before_anything_is_written(shared_data,
                                                                                                  tmp_path):
  """RTE's pairs need 5 positions, SST-2's single sentences 3; pretraining's rates the same as fine-tuning's. A
  step count below 0 is refused (0 alone is a prediction-only task)."""
  data = glue_data(shared_data, "rte", glue_data(shared_data, "sst-2", tmp_path / "glue"))
  glue = lambda task: [f"--config=experiments/glue.py:task={task},size=tiny,data={data},spm={spm(shared_data)}",
                       *TINY_RUN]
  cases = {
      "rte": (glue("rte") + ["--config.data.max_seq_length=4"],
              "data.max_seq_length=4 leaves no room for [CLS] A [SEP] B [SEP]; give --config.data.max_seq_length=5"),
      "sst-2": (glue("sst-2") + ["--config.data.max_seq_length=2"],
                "data.max_seq_length=2 leaves no room for [CLS] text [SEP]; give --config.data.max_seq_length=3"),
      "rate": (glue("sst-2") + ["--config.train.learning_rate=5e-324"], "train.learning_rate=5e-324 is 0 in"),
      "steps": (glue("sst-2") + ["--config.train.num_train_steps=-1"], "train.num_train_steps=-1 must be positive"),
      "pretraining": ([PRETRAINING, *SMALL_RUN, "--config.train.learning_rate=1e-45"], "train.learning_rate=1e-45 is "),
  }
  workdirs = {name: tmp_path / name for name in cases}
  results = refused({name: [*args, f"--workdir={workdirs[name]}"] for name, (args, _) in cases.items()}, cpu_env(1))
  for name, (_, message) in cases.items():
    assert last_line(results[name]).startswith(f"error: {message}"), name
    assert not workdirs[name].exists(), name


@pytest.mark.parametrize("field", list(AT_LEAST_ONE))
@pytest.mark.parametrize("value", [0, -5])
def test_a_task_count_of_0_or_less_is_refused_naming_what_it_would_do(field, value):
  """Each count of the task settings (SQuAD's stride and lengths, the beam, RACE's question length, the options):
  0 or less trained or predicted nothing, and a doc_stride of 0 never finished windowing a context."""
  with pytest.raises(InputError) as refusal:
    TaskSettings(task="squad_v1", **{field: value})
  assert str(refusal.value) == (f"data.{field}={value} {AT_LEAST_ONE[field]}; give --config.data.{field}=1 or "
                                "more.")
  assert getattr(TaskSettings(task="squad_v1", **{field: 1}), field) == 1


@pytest.mark.parametrize("name, task, field", [("squad_v1", SquadTask, "max_query_length"),
                                               ("race", RaceTask, "max_qa_length")])
def test_a_question_that_leaves_no_room_for_the_text_names_the_longest_that_fits(name, task, field):
  with pytest.raises(InputError) as refusal:
    task(TaskSettings(task=name, max_seq_length=128, **{field: 125}))
  assert str(refusal.value).endswith(f"in data.max_seq_length=128; give --config.data.{field}=124 or less.")
  assert getattr(task(TaskSettings(task=name, max_seq_length=128, **{field: 124})).settings, field) == 124


MALFORMED_MESHES = [
    ("shape", "data=8"),                                         # a string, not pairs
    ("shape", "(('data', 0), ('fsdp', 1), ('tensor', 1))"),      # divided by zero
    ("shape", "(('data', -1), ('fsdp', -2), ('tensor', 1))"),    # passed the product check
    ("dcn_shape", "(('data', 0), ('fsdp', 1), ('tensor', 1))"),
]


@pytest.fixture(scope="module")
def mesh_refusals(tmp_path_factory) -> dict:
  return refused({(field, value): [PRETRAINING, f"--workdir={tmp_path_factory.mktemp('mesh')}", *SMALL_RUN,
                                   f"--config.mesh.{field}={value}"] for field, value in MALFORMED_MESHES},
                 cpu_env(8))


@pytest.mark.parametrize("field, value", MALFORMED_MESHES)
def test_a_malformed_mesh_names_the_field_the_form_and_the_rule(mesh_refusals, field, value):
  line = last_line(mesh_refusals[field, value])
  assert line.startswith(f"error: mesh.{field}=") and "each size positive or -1" in line
  assert f'--config.mesh.{field}="{FORM}"' in line


@pytest.mark.tpu
def test_fit_names_a_sharded_mesh_when_replicated_parameters_do_not_fit():
  """1.3 B parameters with LAMB's two moments and the gradient: ~20 GiB on every v3 core (16 GiB) of a data-only
  mesh; more slices would not help, sharding them over the slice's 8 cores does."""
  require_module("libtpu", extra="tpu")
  big = ["--topology=v3-8", "--fit", "--config.model.hidden_size=10240", "--config.model.intermediate_size=40960",
         "--config.model.num_attention_heads=16", "--config.model.num_hidden_layers=1",
         "--config.model.scan_unroll=1", "--config.train.global_batch_size=8"]
  result, report = compile_cli(*big)
  assert result.returncode == 3 and report["fits"] is False, result.stderr
  sharded = "(('data', 1), ('fsdp', -1), ('tensor', 1))"
  advice = result.stderr.strip().splitlines()[-1]
  assert f'--config.mesh.shape="{sharded}"' in advice and "--config.model.dtype=bfloat16" in advice
  assert "--num_slices" not in advice
  result, report = compile_cli(*big, f"--config.mesh.shape={sharded}")
  assert result.returncode == 0 and report["fits"] is True, result.stderr
