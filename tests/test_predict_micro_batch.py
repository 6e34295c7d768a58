"""Prediction runs `train.micro_batch_size` rows per data-parallel device per call (not the whole global batch:
the memory of one accumulation step of training). Batching, padding, sharding and order change no bit: the outputs
equal the model applied to the same rows, `micro` at a time, on one device. Across micro batch sizes the numbers
agree to float32 rounding only: XLA's CPU matmul kernels accumulate in another order for another row count (max
difference 1e-8 here), as any two batch sizes do."""
import jax
import numpy as np
import pytest

from albert_jax import engine, finetune, prediction
from albert_jax.model_config import model_config_from
from albert_jax.tasks import get_task
from experiments import glue


def _setup(config, task, model):
  return engine.setup(config, finetune.make_job(task, model), devices=jax.devices()[:4])


def test_prediction_runs_micro_batches_with_identical_outputs():
  config = glue.get_config("task=mnli,size=tiny")
  config.data.max_seq_length = 16
  config.train.global_batch_size = 16
  task = get_task(config)
  model = task.build_model(model_config_from(config))
  rng = np.random.default_rng(0)
  features = {"input_ids": rng.integers(5, 1000, (23, 16)).astype(np.int32),
              "attention_mask": (np.arange(16) < rng.integers(4, 17, (23, 1))).astype(np.int32),
              "token_type_ids": (np.arange(16) >= 8).astype(np.int32)[None].repeat(23, 0)}
  host_params = jax.device_get(task.init_params(model, jax.random.key(0)))
  apply = jax.jit(task.predictor(model))
  outputs, calls = {}, {}
  for micro, per_device in ((0, 4), (1, 1)):  # 0: the whole global batch at once (4 per device), 1: one row
    config.train.micro_batch_size = micro
    s = _setup(config, task, model)
    calls[micro] = prediction.prediction_split(s.split).global_batch
    with s.context():
      outputs[micro] = prediction.predict_features(task.predictor(model), s.replicate(host_params),
                                                   features, s)["logits"]
    padded = {k: np.concatenate([v, v[:per_device]]) for k, v in features.items()}  # the last chunk filled up
    reference = np.concatenate([apply(host_params, {k: v[i:i + per_device] for k, v in padded.items()})["logits"]
                                for i in range(0, 23, per_device)])[:23]
    np.testing.assert_array_equal(outputs[micro], reference)
  assert calls == {0: 16, 1: 4} and outputs[0].shape == (23, 3)
  np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-7)


def test_a_micro_batch_that_does_not_divide_over_processes_is_refused():
  split = engine.BatchSplit(global_batch=12, micro_batch=1, data_parallel=3, accumulation_steps=4, process_count=2,
                            process_index=0)
  with pytest.raises(ValueError, match="do not divide over 2 processes"):
    prediction.prediction_split(split)
