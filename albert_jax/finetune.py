"""Fine-tuning, evaluation and prediction for GLUE, SQuAD and RACE as an engine `Job`.

Selection rule (reported in `workdir/best/best.json`): the dev split is scored every `train.eval_every` steps and
the best checkpoint by the task's metric is kept in `workdir/best/` with its dev predictions, as the original's
README numbers (google-research/albert#56); `albert_jax.seeds` repeats a recipe over seeds for the paper's medians.
The final state stays in `workdir/checkpoints/` (resumable like pretraining).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable

import flax.linen as nn
import jax

from albert_jax import console, engine, loop, prediction, storage
from albert_jax.errors import InputError
from albert_jax.feature_batches import length_buckets, training_batches
from albert_jax.head_identity import (check_head_trained_for, check_identity, describe, head_trained_for,
                                      task_for_weights)
from albert_jax.model_config import model_config_from
from albert_jax.run import Run, config as run_config, provenance
from albert_jax.run.best import recorded_identity
from albert_jax.run.best_keeper import BestKeeper
from albert_jax.run.lock import WorkdirLock
from albert_jax.tasks import Split, get_task, make_tokenizer
from albert_jax.weights import loading, store
from albert_jax.weights.resolve import Weights, resolve, resolve_init_checkpoint


def _warm_start(config, task, model, weights: Weights | None):
  """`weights`: config.init_checkpoint's, required unless random initialisation was asked for explicitly. A head
  recorded as trained for other classes or another order than `task`'s is not kept (it would start from swapped
  classes): it starts afresh, said in one line. Weights that do not fit `model` are refused here
  (`loading.warm_start`)."""
  if weights is None:
    if config.allow_random_init:
      print("WARNING: fine-tuning from RANDOM weights (allow_random_init=True).", flush=True)
      return None
    raise InputError("No pretrained weights: set --config.init_checkpoint=DIR (an `albert_jax.convert` output or a "
                     "pretraining workdir). Fine-tuning from random weights silently gives useless scores "
                     "(google-research/albert#132); pass --config.allow_random_init=True if that is intended.")
  provenance.check_reader(weights.run, weights.named, config)
  loaded = weights.params
  if set(loaded) - {"albert"} and not head_trained_for(task, weights.head):
    if jax.process_index() == 0:
      print(f"{weights.named} holds a head trained for {describe(weights.head)}, not for "
            f"this run's {describe(task.identity())}: it starts afresh.", flush=True)
    loaded = {"albert": loaded["albert"]}
  return loading.warm_start(loaded, lambda rng: task.init_params(model, rng))


def make_job(task, model, train_batches: Callable[[engine.BatchSplit], Any] | None = None,
             evaluate: Callable | None = None, warm_start: Callable | None = None,
             inputs: dict[str, str] | None = None) -> engine.Job:
  """Fine-tuning of `task` as an engine job. Task losses are micro-batch means, so a micro batch's share of the
  global loss is its mean times its fraction of the rows (static shapes: a Python float). `train_batches`: the
  training data's batches for a BatchSplit (`feature_batches.training_batches`); `inputs`: the files a training run
  is made from (`provenance.fine_tuning_inputs`), which the loop records."""

  def loss_fn(params, batch, rng, totals, deterministic=False):
    loss, metrics = task.loss_and_metrics(model, params, batch, rng, deterministic)
    share = batch["input_ids"].shape[0] / totals["examples"]
    return loss * share, {**{k: v * share for k, v in metrics.items()}, "loss": loss * share}

  def batches(split_name, split):
    if train_batches is None:
      raise InputError(f"No {split_name} data: this fine-tuning job was built for evaluation or prediction only.")
    return train_batches(split)

  example = task.dummy_batch(1)
  return engine.Job(init_params=lambda rng: task.init_params(model, rng), loss_fn=loss_fn,
                    totals_fn=lambda batch: {"examples": batch["input_ids"].shape[0]},
                    summarize=lambda sums, steps: {k: v / steps for k, v in sums.items()}, batches=batches,
                    example_batch=task.dummy_batch, tokens_per_example=math.prod(example["input_ids"].shape[1:]),
                    tokens_per_row=lambda batch: math.prod(batch["input_ids"].shape[1:]),
                    evaluate=evaluate, warm_start=warm_start, inputs=inputs or {})


def _task_and_model(config, weights: Weights | None = None, warm_start: bool = False):
  """`weights`: those the run reads (eval/predict: the workdir's; training: init_checkpoint's, with `warm_start`).
  When the config names no class order, the one recorded with them is used (`head_identity.task_for_weights`); by
  a warm start only for the train file's classes: a head for other classes starts afresh (`_warm_start`)."""
  task = task_for_weights(get_task(config), weights.head if weights else None, warm_start)
  tokenizer = make_tokenizer(config)
  model_config = model_config_from(config)
  tokenizer.check_vocab(model_config.vocab_size)
  return task, tokenizer, model_config, task.build_model(model_config, tokenizer.pair_layout)


def train(config, run: Run, args=None) -> None:
  """`--mode=train`: fine-tunes from init_checkpoint's weights, keeps the best dev checkpoint, then predicts the test
  splits with it."""
  weights = resolve_init_checkpoint(config, args and args.overrides)
  config = weights.config if weights else config
  if config.train.eval_batches:  # the metrics (SQuAD's, RACE's, MCC, F1) are defined over the whole split
    raise InputError(f"train.eval_batches={config.train.eval_batches} limits pretraining's held-out evaluation; "
                     "fine-tuning scores the whole dev split. Leave it at 0; to evaluate less often, raise "
                     "train.eval_every.")
  engine.check_training_config(config)  # before head.json or anything is written
  task, tokenizer, model_config, model = _task_and_model(config, weights, warm_start=True)
  train_split = task.load_split("train", tokenizer)
  dev_splits = {name: task.load_split(name, tokenizer) for name in task.eval_splits}
  # Read now, so that a bad test file stops the run before training rather than after it.
  test_splits = [task.load_split(name, tokenizer) for name in task.test_splits
                 if storage.path(task.split_path(name)).exists()]
  lengths = length_buckets(config, task)
  inputs = provenance.fine_tuning_inputs(config, task)  # checked by a resume, recorded with the run's config
  warm_start = _warm_start(config, task, model, weights)  # weights refused before the workdir is written
  with WorkdirLock(run, owner=jax.process_index() == 0):  # best/ of a run still going is not ours to prune
    start = run_config.latest_step(run) or 0  # the checkpoint step this run continues from; 0: a fresh start
    if start:
      check_identity(task, recorded_identity(run), f"Workdir {run.workdir} (checkpoint step {start})")
      provenance.check_resume(run, inputs, config)
    keeper = BestKeeper(run, task, model_config, start, config.train.get("early_stopping_patience", 0),
                        config.train.eval_every)
    stopped_early = keeper.stops_early(start)  # a rerun of a run that stopped early trains no further
    if jax.process_index() == 0:
      storage.write_atomic(run.head, json.dumps(task.identity(), indent=2))

  def train_batches(split):
    return training_batches(train_split.features, lengths, split, config.seed)

  def score_dev(step, params, s, writer):
    metrics, predictions = prediction.evaluate_splits(task, model, params, dev_splits, s, lengths)
    writer.write(step, metrics, "dev/")
    keeper.update(step, metrics, params, predictions)
    if jax.process_index() == 0:
      print(f"dev at step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()) +
            f" (best: step {keeper.record['step']}, {keeper.record['metric']} {keeper.record['value']:.4f})",
            flush=True)
    return keeper.stops_early(step)

  job = make_job(task, model, train_batches, score_dev, warm_start, inputs)
  if not stopped_early:
    loop.fit(config, run, job)
  best = keeper.record  # the same on every process, without waiting for process 0's best.json
  if best is None:
    return
  if test_splits:
    task.use_tuning(best["weights"])
    s = engine.setup(config, job)
    with s.context():
      params = s.replicate(store.load_pretrained(best["weights"])[1])
      for split in test_splits:
        path = prediction.predict_split_file(s, task, model, params, split,
                                             run.predictions(task.submission_name(split.name)), lengths)
        print(f"Test predictions (best checkpoint): {path}", flush=True)
  print(json.dumps(best), flush=True)
  workdir, python = run.workdir, console.python()
  prefix = workdir.rstrip('/')
  console.say_done(f"best checkpoint {best['weights']} ({best['metric']} {best['value']:.4f})",
                   f"{python} -m albert_jax.main --workdir {workdir} --mode=predict --split=dev "
                   f"--output={prefix}_dev.tsv && {python} -m albert_jax.convert --to=hf --src={workdir} "
                   f"--dst={prefix}_hf")


def predict_test(config, run: Run, args=None) -> None:
  """`--mode=train` with train.num_train_steps=0, a prediction-only task (GLUE AX uses the MNLI model as it is):
  the test split predicted with init_checkpoint's weights as they are, refused unless their head was trained for
  the task."""
  weights = resolve_init_checkpoint(config, args and args.overrides)
  if weights is None:
    raise InputError("num_train_steps=0 predicts with an already fine-tuned model: set --config.init_checkpoint "
                     "to it (for AX, the MNLI run's workdir: its best checkpoint is used).")
  config = weights.config
  task, tokenizer, _, model = _task_and_model(config, weights)
  check_head_trained_for(task, weights.head, weights.named)  # refused, naming both and the fix
  params = loading.merge_init_params(
      jax.device_get(nn.unbox(task.init_params(model, jax.random.key(0)))), weights.params, required_prefix="",
      head_fix="num_train_steps=0 predicts with a model fine-tuned for this task: set --config.init_checkpoint "
               "to that run's workdir (for AX, the MNLI run's).")[0]
  print(f"Wrote {_predict_split(config, run, task, model, params, task.load_split('test', tokenizer))}", flush=True)


def _predict_split(config, run: Run, task, model, params, split: Split, output: str | None = None,
                   label: str | None = None) -> str:
  """`predict_split_file` of one split with `params` (host arrays), into `output`, by default into the run's folder
  under the benchmark's file name."""
  s = engine.setup(config, make_job(task, model))
  with s.context():
    return prediction.predict_split_file(s, task, model, s.replicate(params), split,
                                         output or run.predictions(task.submission_name(split.name)),
                                         length_buckets(config, task), label)


def _trained_params(config, run: Run, weights: Weights, task, model, splits: tuple[str, ...] = ()):
  """The run's best (else latest) weights (`weights`, resolved from its workdir), refused unless their head was
  trained for `task` as it is now (a pretraining run has none), their model is config.model's, and the tokenizer
  and the files of `splits` are those the run recorded."""
  workdir, best = run.workdir, weights.best
  check_identity(task, weights.head, f"--workdir={workdir}")
  provenance.check_reader(run, f"--workdir={workdir}", config, provenance.fine_tuning_inputs(config, task, splits))
  task.use_tuning(weights.folder)
  which = f"best checkpoint (step {best['step']})" if best else "latest checkpoint"
  params = weights.params
  loading.check_params(jax.eval_shape(lambda: nn.unbox(task.init_params(model, jax.random.key(0)))), params,
                       required_prefix="", name=f"--workdir={workdir}",
                       head_fix="Pass the --workdir of a run fine-tuned for this task; pretrained weights "
                                "are what fine-tuning starts from (--config.init_checkpoint).")
  return params, which


def evaluate(config, run: Run, args=None) -> None:
  """`--mode=eval`: scores the dev splits with the best (else latest) weights and writes their predictions into the
  run's folder, or into the folder `--output` names (then the run's folder is only read)."""
  weights = resolve(run.workdir, config, args and args.overrides, flag="--workdir")
  config = weights.config
  task, tokenizer, _, model = _task_and_model(config, weights)
  params, which = _trained_params(config, run, weights, task, model, task.eval_splits)
  s = engine.setup(config, make_job(task, model))
  with s.context():
    splits = {name: task.load_split(name, tokenizer) for name in task.eval_splits}
    metrics, predictions = prediction.evaluate_splits(task, model, s.replicate(params), splits, s,
                                                      length_buckets(config, task))
    if jax.process_index() == 0:
      for name, (split, split_predictions) in predictions.items():
        file_name = task.predictions_name(name)
        task.write_predictions(split, split_predictions, os.path.join(args.output, file_name)
                               if args and args.output else run.predictions(file_name))
  print(json.dumps({"weights": which, **metrics}), flush=True)


def predict(config, run: Run, args) -> None:
  """`--mode=predict`: the best (else latest) weights on the user's own file (`--input`), written to `--output`,
  or on a named split of the task (`--split`), written to `--output` or the workdir under the benchmark's name."""
  input_path, output_path = args.input, args.output
  if bool(args.split) == bool(input_path) or (input_path and not output_path):
    raise InputError("--mode=predict needs --input=FILE (your TSV/JSONL) and --output=PATH, or --split=NAME (a "
                     "split of the task: test, dev, test_mismatched, ax, ...) with an optional --output.")
  weights = resolve(run.workdir, config, args.overrides, flag="--workdir")
  config = weights.config
  task, tokenizer, _, model = _task_and_model(config, weights)
  if output_path:
    prediction.check_output(task, output_path)
  params, which = _trained_params(config, run, weights, task, model)
  if args.split:
    path = _predict_split(config, run, task, model, params, task.load_split(args.split, tokenizer), output_path)
    print(f"Wrote predictions for split {args.split} ({which}) to {path}", flush=True)
    return
  split = task.read_user_file(input_path, tokenizer)
  _predict_split(config, run, task, model, params, split, output_path, f"predicting {input_path}")
  if jax.process_index() == 0:
    print(f"Wrote predictions for {len(split.examples)} examples ({which}) to {output_path}", flush=True)
