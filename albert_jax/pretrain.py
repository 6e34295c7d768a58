"""Pretraining as an engine `Job`: the MLM + sentence-order (or next-sentence) losses, the data named by
`data.kind`, synthetic batches for smoke tests and benchmarks, held-out evaluation and `--mode=eval`.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shlex
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils

from albert_jax import checkpointing, console, engine, families, flops, loop, metrics as metrics_lib, storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.model import AlbertForPreTraining, dummy_inputs
from albert_jax.model_config import model_config_from
from albert_jax.run import Run, config as run_config, provenance
from albert_jax.weights import loading, record
from albert_jax.weights.resolve import resolve_init_checkpoint
from data_pipeline import records
from data_pipeline.examples import ExampleConfig
from data_pipeline.masking import num_prediction_slots
from data_pipeline.wordpiece import load_tokenizer


def pretraining_totals(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Normalisers over the WHOLE global batch, so accumulated micro-batch gradients equal the full-batch ones."""
  return {"mlm_weight": batch["masked_lm_weights"].astype(jnp.float32).sum() + 1e-5,
          "examples": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}


def mlm_sums(logits: jax.Array, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The MLM head's sums over the masked positions of `batch`: Σ w·nll, Σ w and Σ w·correct."""
  ids, weights = batch["masked_lm_ids"], batch["masked_lm_weights"].astype(jnp.float32)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, ids)
  # "The label's logit is the largest" instead of argmax: the max is shared with the softmax, where a separate
  # argmax over V=30000 cost 3% of a small model's CPU step (ties, measure zero, count as correct).
  correct = jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0] >= logits.max(-1)
  return {"mlm_loss_sum": (nll * weights).sum(), "mlm_weight": weights.sum(), "mlm_correct": (correct * weights).sum()}


def pretraining_loss(model, sentence_task: str, params: Any, batch: dict[str, jax.Array],
                     rng: jax.Array, totals: dict[str, jax.Array], deterministic: bool = False):
  """MLM loss Σ(w·nll)/(Σw + 1e-5) plus the SOP/NSP cross-entropy (1:1, as the original). Returns (loss, sums)."""
  out = model.apply({"params": params}, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                    batch["masked_lm_positions"], deterministic=deterministic, rngs={"dropout": rng})
  sums = mlm_sums(out["mlm_logits"], batch)
  loss = sums["mlm_loss_sum"] / totals["mlm_weight"]
  if sentence_task != "none":
    labels = batch["sentence_order_label"].reshape(-1)
    sentence_nll = optax.softmax_cross_entropy_with_integer_labels(out["sop_logits"], labels)
    sums.update(sentence_loss_sum=sentence_nll.sum(),
                sentence_correct=(out["sop_logits"].argmax(-1) == labels).sum(), sentence_positives=labels.sum(),
                examples=jnp.asarray(labels.shape[0], jnp.float32))
    loss = loss + sums["sentence_loss_sum"] / totals["examples"]
  return loss, sums


def mlm_metrics(sums: dict[str, float]) -> dict[str, float]:
  """`mlm_sums` added over steps or batches -> the MLM loss and accuracy."""
  return {"mlm_loss": sums["mlm_loss_sum"] / max(sums["mlm_weight"], 1e-5),
          "mlm_accuracy": sums["mlm_correct"] / max(sums["mlm_weight"], 1e-5)}


def summarize_pretraining(sentence_task: str, sums: dict[str, float]) -> dict[str, float]:
  """Sums over steps or batches -> the reported losses and accuracies; the sentence-level metrics are named after
  the task that produced them (`sop_*` or `nsp_*`)."""
  out = mlm_metrics(sums)
  sentence_loss = 0.0
  if "examples" in sums:
    sentence_loss = sums["sentence_loss_sum"] / sums["examples"]
    out[f"{sentence_task}_loss"] = sentence_loss
    out[f"{sentence_task}_accuracy"] = sums["sentence_correct"] / sums["examples"]
  out["loss"] = out["mlm_loss"] + sentence_loss
  return out


class SyntheticBatches:
  """Random pretraining batches, a pure function of (seed, step): for smoke tests and benchmarks. The global batch
  is the same whatever the process count; each process takes its own rows."""

  position_is_global = True  # the same on every process: a resume on another process count is exact

  def __init__(self, data_config, split: engine.BatchSplit, vocab_size: int, seed: int):
    self.config, self.split, self.vocab_size, self.seed = data_config, split, vocab_size, seed
    self.position = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = synthetic_batch(self.config, self.split.global_batch, self.vocab_size, (self.seed, self.position))
    self.position += 1
    return {k: self.split.local(v) for k, v in batch.items()}

  def get_state(self) -> dict[str, int]:
    return {"position": self.position}

  def set_state(self, state: dict[str, int]) -> None:
    self.position = int(state["position"])


def prediction_slots(data_config) -> int:
  """The MLM head's rows per sequence: `max_predictions_per_seq`, or with 0 (no cap) the masking budget."""
  return num_prediction_slots(data_config.max_seq_length, data_config.max_predictions_per_seq,
                              data_config.masked_lm_prob)


def synthetic_batch(data_config, rows: int, vocab_size: int, seed: Any) -> dict[str, np.ndarray]:
  """One random batch of `rows` examples with the shapes and dtypes of real pretraining batches."""
  rng = np.random.default_rng(seed)
  s = data_config.max_seq_length
  p = prediction_slots(data_config)
  positions = np.sort(rng.permuted(np.tile(np.arange(1, s), (rows, 1)), axis=1)[:, :p], axis=1)
  return {"input_ids": rng.integers(5, vocab_size, (rows, s), dtype=np.int32),
          "attention_mask": np.ones((rows, s), np.int32),
          "token_type_ids": (np.arange(s)[None] >= s // 2).astype(np.int32).repeat(rows, 0),
          "masked_lm_positions": positions.astype(np.int32),
          "masked_lm_ids": rng.integers(5, vocab_size, (rows, p), dtype=np.int32),
          "masked_lm_weights": np.ones((rows, p), np.float32),
          "sentence_order_label": rng.integers(0, 2, (rows,), dtype=np.int32)}


def pretraining_batches(config, split_name: str, split: engine.BatchSplit, run: Run):
  """The iterator named by `data.kind` for `split_name` ("train" or "eval")."""
  kind = config.data.kind
  if kind == "synthetic":
    return SyntheticBatches(config.data, split, config.model.vocab_size,
                            config.seed + (0 if split_name == "train" else 1))
  if kind not in ("prepared", "tiny"):
    raise InputError(f"data.kind={kind!r}; choose 'prepared', 'tiny' or 'synthetic'.")
  from data_pipeline import loader
  data_config = run_data(config, run).data
  if kind == "tiny" and jax.process_count() > 1:
    _build_tiny_dataset_on_process_0_first(data_config)
  batches = loader.make_pretraining_iterator(data_config, split=split_name, global_batch_size=split.global_batch,
                                             seed=config.seed, vocab_size=config.model.vocab_size)
  global_position = loader.position_is_global(data_config)
  if kind == "tiny":  # bundled and built the same way every time
    return LoaderPosition(batches, global_position, config.get("resume_with_changes", False))
  return PreparedDataPosition(batches, global_position, config.data.path, config.get("resume_with_changes", False))


def run_data(config: ml_collections.ConfigDict, run: Run | None) -> ml_collections.ConfigDict:
  """`config` with the data `run` reads: for the bundled corpus (data.kind=tiny), data.path made the folder it is
  built in (`record.tiny_data_dir`: inside the run's folder by default); `config` itself otherwise."""
  if config.data.kind != "tiny" or run is None:
    return config
  config = copy.deepcopy(config)
  config.data.path = record.tiny_data_dir(config.data.path, run)
  return config


def _build_tiny_dataset_on_process_0_first(data_config: ml_collections.ConfigDict) -> None:
  """Processes sharing a disk would build the bundled dataset into the same files at once: process 0 builds it
  while the others wait, then they reuse it (a host with a disk of its own builds its own copy)."""
  from data_pipeline.tiny import ensure_tiny_dataset, tokenizer_kind
  if jax.process_index() == 0:
    ensure_tiny_dataset(data_config.path, tokenizer_kind(data_config))
  multihost_utils.sync_global_devices("albert_jax_tiny_dataset")


class LoaderPosition:
  """The loader's iterator, declaring whether its saved position is the same on every process
  (`loader.position_is_global`: full_sentences packing), which lets `loop` resume it on another process count."""

  def __init__(self, batches, position_is_global: bool, resume_with_changes: bool = False):
    self.batches, self.position_is_global = batches, position_is_global
    self.resume_with_changes = resume_with_changes

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self.batches)

  def get_state(self) -> dict[str, Any]:
    return self.batches.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    """The saved position; with resume_with_changes, one this loader refuses (saved with another data.packing, a
    change that flag lets through) is left behind: the data is read from its start, said."""
    try:
      self.batches.set_state(state)
    except InputError:
      if not self.resume_with_changes:
        raise
      print("The saved data position belongs to other data settings (data.packing); reading the data from its start "
            "(resume_with_changes).", flush=True)


class PreparedDataPosition(LoaderPosition):
  """The loader's iterator, its saved position tagged with the preparation it is a position in (the sha256 of
  its manifest): a resume on data prepared again into the same folder (other inputs, other shards) is refused,
  where the position alone would silently continue somewhere in other data."""

  def __init__(self, batches, position_is_global: bool, path: str, resume_with_changes: bool):
    super().__init__(batches, position_is_global, resume_with_changes)
    self.path = path
    self.manifest_sha256 = hashlib.sha256((storage.path(path) / "manifest.json").read_bytes()).hexdigest()

  def get_state(self) -> dict[str, Any]:
    return {"loader": self.batches.get_state(), "manifest_sha256": self.manifest_sha256}

  def set_state(self, state: dict[str, Any]) -> None:
    if "manifest_sha256" not in state:  # a checkpoint written before positions were tagged
      super().set_state(state)
      return
    if state["manifest_sha256"] == self.manifest_sha256:
      super().set_state(state["loader"])
      return
    if not self.resume_with_changes:
      raise InputError(f"The data at {self.path} is not the preparation this run's checkpoint was reading (its "
                       "manifest.json changed: prepared again with other inputs or settings?), so the saved position "
                       "means nothing there. Point data.path at the data the run was trained on, use a new "
                       "--workdir, or pass --config.resume_with_changes=True to go on with this data from its start.")
    print(f"The data at {self.path} changed since the checkpoint; reading it from its start "
          "(resume_with_changes).", flush=True)


def checked_model_config(config: ml_collections.ConfigDict):
  """The model of a pretraining `config`, with its family, sequence length and masking and sentence settings
  checked: refused by name before any work."""
  families.check_model_family(config)
  model_config = model_config_from(config)
  model_config.check_seq_length(config.data.max_seq_length, config.data.max_predictions_per_seq)
  ExampleConfig.from_config(config.data)
  return model_config


def data_fields(config: ml_collections.ConfigDict, run: Run | None) -> dict[str, Any]:
  """The `engine.Job` fields that every pretraining objective takes from the masked batches of `data.kind`: the
  batches, their example, their length, the held-out evaluation and the inputs a run records (provenance)."""
  return dict(batches=lambda split_name, split: pretraining_batches(config, split_name, split, run),
              example_batch=lambda rows: synthetic_batch(config.data, rows, config.model.vocab_size, 0),
              tokens_per_example=config.data.max_seq_length,
              evaluate=lambda step, params, s, writer: _log_evaluation(step, evaluate(config, s, params), writer),
              inputs=provenance.pretraining_inputs(run_data(config, run)))


def make_job(config: ml_collections.ConfigDict, run: Run | None = None) -> engine.Job:
  """Pretraining of `config` as an engine job (data read for `run` only when batches are asked for)."""
  model_config = checked_model_config(config)
  seq_len = config.data.max_seq_length
  model = AlbertForPreTraining(model_config)
  sentence_task = config.data.sentence_task
  loss_fn = lambda params, batch, rng, totals, deterministic=False: pretraining_loss(
      model, sentence_task, params, batch, rng, totals, deterministic)
  return engine.Job(
      init_params=lambda rng: model.init(rng, **dummy_inputs(1, seq_len))["params"],
      loss_fn=loss_fn, totals_fn=pretraining_totals,
      summarize=lambda sums, steps: summarize_pretraining(sentence_task, sums),
      flops_per_token=flops.train_flops_per_token(model_config, seq_len, prediction_slots(config.data)),
      **data_fields(config, run))


def _log_evaluation(step: int, metrics: dict[str, float], writer) -> None:
  writer.write(step, metrics, "eval/")
  if jax.process_index() == 0:
    print(f"held-out eval at step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()), flush=True)


def check_data(config: ml_collections.ConfigDict) -> None:
  """Data that cannot feed the run is refused at start-up, before anything is written into the workdir or built:
  another vocabulary than the model's (the bundled corpus's is fixed; a preparation's is in its manifest), and
  for a run that evaluates (train.eval_every > 0), a preparation without held-out documents, which would otherwise
  stop it at the first evaluation, steps (on a pod, hours) after the last checkpoint."""
  from data_pipeline import loader, tiny
  kind, vocab_size = config.data.kind, config.model.vocab_size
  if kind == "tiny" and vocab_size != tiny.VOCAB_SIZE:
    raise InputError(f"The bundled tiny corpus has a {tiny.VOCAB_SIZE}-piece vocabulary but the model has "
                     f"vocab_size={vocab_size}; set --config.model.vocab_size={tiny.VOCAB_SIZE}, or train on "
                     "data.kind=synthetic or prepared data of that vocabulary.")
  if kind != "prepared":
    return
  manifest = loader.check_preparation(config.data.path, vocab_size, config.data.get("spm_model"))
  if config.train.eval_every and not manifest["splits"].get("eval", {}).get("documents"):
    raise InputError(f"The preparation at {config.data.path} has no held-out ('eval') documents, and "
                     f"train.eval_every={config.train.eval_every} evaluates on them. Prepare the data with a larger "
                     "--eval_fraction (or more documents), or pass --config.train.eval_every=0 to train without "
                     "held-out evaluation.")


def check_data_tokenizer(config: ml_collections.ConfigDict, weights) -> None:
  """Prepared data that the tokenizer of the weights continued from (`weights.tokenizer`) did not write is refused:
  their ids would mean other pieces to the model."""
  if config.data.kind != "prepared" or weights.tokenizer is None:
    return
  model_file, manifest = weights.tokenizer[0], records.read_manifest(config.data.path)
  if load_tokenizer(model_file).sha256 != manifest["tokenizer"]["sha256"]:
    prepared_with = manifest["tokenizer"]["model"]
    raise InputError(f"{weights.named} was trained with the tokenizer {model_file}, but the data at "
                     f"{config.data.path} was prepared with another (its copy: {prepared_with}); prepare the corpus "
                     f"with the model's own: python -m data_pipeline.prepare --spm_model={model_file} ...")


def warm_start_from(config: ml_collections.ConfigDict, weights, job: engine.Job) -> Callable:
  """The warm start of `job` from `weights` (`loading.warm_start`: the backbone required, heads the model has taken
  where the weights hold them)."""
  return loading.warm_start(weights.params, job.init_params)


def train(config: ml_collections.ConfigDict, run: Run, args=None, job_for=make_job,
          warm_start_for=warm_start_from) -> dict[str, float]:
  """Pretrains from scratch, a warm start, or the run's latest checkpoint. Returns the last logged metrics.
  init_checkpoint's weights give the model and tokenizer the command line leaves unset (`args.overrides`; a
  released RoBERTa or BERT folder is continued on data prepared with its own tokenizer, `check_data_tokenizer`).
  A warm start's weights are loaded and checked first: refused, they leave the run's folder as it was. `job_for`:
  (config, run) -> the objective's job (a family's own objective passes its `make_job`); `warm_start_for`:
  (config, the resolved init_checkpoint, the job) -> its warm start (ELECTRA's takes its generator too)."""
  weights = resolve_init_checkpoint(config, args and args.overrides)
  # The model and tokenizer the weights fix (on a resume too, as the run recorded them); init_checkpoint names the
  # conversion of another format's weights.
  config = weights.config if weights else config
  resuming = run_config.latest_step(run) is not None
  if weights and not resuming:  # a warm start; a resume goes on from its own weights
    provenance.check_reader(weights.run, weights.named, config)
    check_data_tokenizer(config, weights)
  check_data(config)
  job = job_for(config, run)
  if resuming:
    provenance.check_resume(run, job.inputs, config)
  elif weights:
    job = dataclasses.replace(job, warm_start=warm_start_for(config, weights, job))
  engine.check_training_config(config)
  last = loop.fit(config, run, job)
  latest = run_config.latest_step(run)
  console.say_done(f"checkpoint {os.path.join(run.checkpoints, str(latest))}", _fine_tuning_command(run.workdir))
  return last


def _fine_tuning_command(workdir: str) -> str:
  """The command that fine-tunes GLUE RTE from the run in `workdir` (DATA/glue: the GLUE folder, whose "not found"
  names the download command): its model, and its tokenizer where it recorded one, are taken from there
  (`record.take_recorded`). The experiment file by its absolute path, so the line runs from any folder."""
  spm = "" if record.recorded_tokenizer(workdir) else ",spm=SPM"
  glue = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "glue.py")
  return (f"{console.python()} -m albert_jax.main --config {shlex.quote(f'{glue}:task=rte,data=DATA/glue{spm}')} "
          f"--workdir {workdir.rstrip('/')}_rte --config.init_checkpoint={workdir}")


def evaluate(config, s: engine.Setup, params) -> dict[str, float]:
  """MLM and sentence-task metrics over `train.eval_batches` batches of the held-out documents (the same batches
  each time). `<task>_majority_accuracy` is what always answering the commoner label scores on them: chance, which
  is above 0.5 where one-sentence chunks (always label 1, a random B) are common, as at short sequence lengths."""
  eval_iter = s.job.batches("eval", s.split)
  total: dict[str, float] = {}
  for _ in range(config.train.eval_batches):
    total = metrics_lib.add(total, metrics_lib.fetch(s.eval_step(params, s.global_batch(next(eval_iter)))))
  metrics = s.job.summarize(total, config.train.eval_batches)
  if "sentence_positives" in total:
    positives = total["sentence_positives"] / total["examples"]
    metrics[f"{config.data.sentence_task}_majority_accuracy"] = max(positives, 1 - positives)
  return metrics


def evaluate_checkpoint(config: ml_collections.ConfigDict, run: Run, args=None, job_for=make_job
                        ) -> dict[str, float]:
  """`--mode=eval`: the held-out metrics of the run's latest checkpoint, also printed as one JSON line."""
  record.check_same_function(run.workdir, config.model, "--workdir")
  provenance.check_reader(run, f"--workdir={run.workdir}", config,
                          provenance.pretraining_inputs(run_data(config, run)))
  if run_config.latest_step(run) is None:  # asked before `setup` opens checkpoints/, which would create it
    raise MissingFileError(f"No checkpoint in {storage.absolute(run.checkpoints)}; train first (--mode=train).")
  s = engine.setup(config, job_for(config, run))
  ckpt = checkpointing.Checkpointer(run.checkpoints, 1, 1)
  step, params = ckpt.restore_newest_intact(ckpt.restore_params)
  with s.context():
    params = s.replicate(params)
    result = {"step": step, **evaluate(config, s, params)}
  print(json.dumps(result), flush=True)
  return result
