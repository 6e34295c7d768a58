"""`python -m bench.finetune_buckets`: fine-tuning with length buckets against every batch padded to
max_seq_length, side by side on the GLUE files.

1. Step speed per task (`--tasks`; SST-2: single sentences, 14 tokens on average; QNLI and RTE: pairs, 52 and 71),
   the tiny model at sequence length 512 as the original's GLUE recipes pad: the same train step compiled for each
   bucket the task's rows fall in and for the full length, timed in interleaved blocks; examples/s over an epoch =
   global batch x batches per epoch / the sum of each batch's median step time, against global batch / the
   full-length step's median.
2. The same SST-2 training run twice (same seed and steps), bucketed and not, through `albert_jax.main`: wall time
   and the best dev accuracy of each.
3. Prediction of SST-2 dev with the bucketed run's best weights, bucketed and not: the labels must be identical
   and the probabilities within 1e-5.

  python -m bench.finetune_buckets --glue DIR/glue --spm DIR/albert_spm/spiece.model
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import jax
import numpy as np

from bench import common

MODULE = "bench.finetune_buckets"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "..", "shared", "data")
RECIPE = ["--config.allow_random_init=True", "--config.model.max_position_embeddings=512",
          "--config.train.global_batch_size=32", "--config.train.learning_rate=3e-4", "--config.train.warmup_steps=100"]


def glue_config(task: str, args: argparse.Namespace, buckets_spec: str):
  from albert_jax.cli import experiment_config
  config = experiment_config(["bench", f"--config=experiments/glue.py:task={task},size=tiny,data={args.glue},"
                                       f"spm={args.spm}", *RECIPE,
                              f"--config.data.length_buckets={buckets_spec}"])
  return config


def step_speeds(task: str, split_name: str, args: argparse.Namespace) -> dict:
  """Median step time per batch length, interleaved, and the examples/s each way over one epoch's batch mix."""
  from albert_jax import buckets, engine, feature_batches, finetune
  from albert_jax.model_config import model_config_from
  from albert_jax.tasks import get_task, make_tokenizer
  config = glue_config(task, args, args.buckets)
  task_obj = get_task(config)
  examples = task_obj.read_examples(task_obj.split_path(split_name), labeled=True)[:args.max_rows or None]
  features, _ = task_obj.featurize(examples, make_tokenizer(config))
  model = task_obj.build_model(model_config_from(config))
  job = finetune.make_job(task_obj, model)
  s = engine.setup(config, job)
  lengths = feature_batches.length_buckets(config, task_obj)
  epoch = buckets.BucketedBatches(features, lengths, s.split, config.seed)
  per_bucket = {length: 0 for length in lengths}
  batches: dict[int, list] = {}
  for _ in range(epoch.steps_per_epoch):
    batch = next(epoch)
    width = batch["input_ids"].shape[-1]
    per_bucket[width] += 1
    if len(batches.setdefault(width, [])) < args.block:
      batches[width].append(batch)
  full = lengths[-1]
  unbucketed = feature_batches.FeatureBatches(features, s.split, config.seed)
  batches[full] = [next(unbucketed) for _ in range(args.block)]
  times: dict[int, list[float]] = {width: [] for width in batches}
  with s.context():
    state = s.create_state(jax.random.key(0))
    rng = jax.device_put(jax.random.key(1), s.replicated)
    steps = {width: s.compile_train_step(group[0]) for width, group in batches.items()}
    for block in range(args.blocks + 1):                  # block 0 warms up and is not kept
      for width, group in batches.items():
        for batch in group:
          global_batch = s.global_batch(batch)
          start = time.perf_counter()
          state, metrics = steps[width](state, global_batch, rng)
          jax.block_until_ready(metrics["loss"])
          if block:
            times[width].append(time.perf_counter() - start)
  median = {width: float(np.median(t)) for width, t in times.items()}
  g = s.split.global_batch
  bucketed_seconds = sum(per_bucket[w] * median[w] for w in per_bucket if per_bucket[w])
  bucketed = g * epoch.steps_per_epoch / bucketed_seconds
  padded = g / median[full]
  token_counts = buckets.row_lengths(features)
  return {"task": task, "split": split_name, "rows": int(len(token_counts)), "buckets": list(lengths),
          "mean_tokens": float(token_counts.mean()), "padding_fraction_at_full": float(1 - token_counts.mean() / full),
          "batches_per_epoch_by_length": {str(w): n for w, n in per_bucket.items()},
          "median_step_s_by_length": {str(w): m for w, m in median.items()},
          "steps_timed_per_length": {str(w): len(t) for w, t in times.items()},
          "examples_per_s_bucketed": bucketed, "examples_per_s_padded": padded, "speedup": bucketed / padded}


def train_run(workdir: str, buckets_spec: str, args: argparse.Namespace) -> dict:
  cmd = [sys.executable, "-m", "albert_jax.main",
         f"--config=experiments/glue.py:task=sst-2,size=tiny,data={args.glue},spm={args.spm}", f"--workdir={workdir}",
         *RECIPE, f"--config.data.length_buckets={buckets_spec}", f"--config.train.num_train_steps={args.train_steps}",
         f"--config.train.eval_every={args.train_steps // 2}", f"--config.checkpoint.every={args.train_steps}",
         "--config.compilation_cache_dir=none"]
  start = time.perf_counter()
  result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
  seconds = time.perf_counter() - start
  if result.returncode:
    raise SystemExit(f"{' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
  best = json.loads((open(os.path.join(workdir, "best", "best.json")).read()))
  compiles = sum(line.startswith("Compiling the train step") for line in result.stdout.splitlines())
  return {"length_buckets": buckets_spec, "wall_s": seconds, "best_step": best["step"],
          "best_dev_accuracy": best["value"], "train_step_compiles": compiles, "weights": best["weights"]}


def prediction_check(weights: str, args: argparse.Namespace) -> dict:
  from albert_jax import engine, feature_batches, finetune, prediction
  from albert_jax.model_config import model_config_from
  from albert_jax.tasks import get_task, make_tokenizer
  from albert_jax.weights import store
  config = glue_config("sst-2", args, args.buckets)
  task = get_task(config)
  split = task.load_split("dev", make_tokenizer(config))
  model = task.build_model(model_config_from(config))
  s = engine.setup(config, finetune.make_job(task, model))
  params = store.load_pretrained(weights)[1]
  probabilities = {}
  with s.context():
    params = s.replicate(params)
    for name, lengths in (("padded", (config.data.max_seq_length,)),
                          ("bucketed", feature_batches.length_buckets(config, task))):
      start = time.perf_counter()
      logits = prediction.predict_features(task.predictor(model), params, split.features, s,
                                           lengths=lengths)["logits"]
      probabilities[name] = (jax.nn.softmax(np.asarray(logits, np.float64), -1), time.perf_counter() - start)
  (padded, padded_s), (bucketed, bucketed_s) = probabilities["padded"], probabilities["bucketed"]
  return {"examples": int(len(padded)), "labels_identical": bool((padded.argmax(-1) == bucketed.argmax(-1)).all()),
          "max_abs_probability_difference": float(np.abs(padded - bucketed).max()),
          "seconds_padded": padded_s, "seconds_bucketed": bucketed_s}


def main(argv=None) -> dict:
  p = common.parser(__doc__)
  p.add_argument("--glue", default=os.path.join(DATA, "glue"), help="the GLUE folder (SST-2/, MNLI/, ...)")
  p.add_argument("--spm", default=os.path.join(DATA, "albert_spm", "spiece.model"))
  p.add_argument("--buckets", default="64,128,256,512")
  p.add_argument("--blocks", type=int, default=3, help="interleaved timing blocks (each --block steps per length)")
  p.add_argument("--tasks", default="sst-2:train,qnli:dev,rte:train", help="GLUE task:split pairs timed in part 1")
  p.add_argument("--max-rows", type=int, default=8192, help="rows of each split featurized for part 1 (0: all)")
  p.add_argument("--train-steps", type=int, default=1000, help="steps of each SST-2 training run (0: skip part 2)")
  p.add_argument("--workdir", default="/tmp/bench_finetune_buckets")
  args = p.parse_args(argv)
  speeds = [step_speeds(*spec.split(":"), args) for spec in args.tasks.split(",")]
  common.print_table(speeds, [("task", "task", ""), ("mean tokens", "mean_tokens", ".1f"),
                              ("padding at 512", "padding_fraction_at_full", ".1%"),
                              ("examples/s padded", "examples_per_s_padded", ".1f"),
                              ("examples/s bucketed", "examples_per_s_bucketed", ".1f"),
                              ("speed-up", "speedup", ".2f")],
                     "train step, tiny model, batch 32, seq 512: every batch padded to 512 vs length buckets")
  runs, predictions = [], None
  if args.train_steps:
    runs = [train_run(os.path.join(args.workdir, name), spec, args)
            for name, spec in (("padded", "none"), ("bucketed", args.buckets))]
    common.print_table(runs, [("length_buckets", "length_buckets", ""), ("wall s", "wall_s", ".0f"),
                              ("best dev accuracy", "best_dev_accuracy", ".4f"), ("best step", "best_step", "d"),
                              ("step compiles", "train_step_compiles", "d")],
                       f"SST-2, {args.train_steps} steps from random weights, same seed")
    predictions = prediction_check(runs[1]["weights"], args)
    print(f"SST-2 dev predictions, bucketed vs padded: labels identical {predictions['labels_identical']}, "
          f"max |probability difference| {predictions['max_abs_probability_difference']:.2e}", flush=True)
  payload = {"speeds": speeds, "training_runs": runs, "predictions": predictions, "recipe": RECIPE,
             "args": {k: v for k, v in vars(args).items() if k in ("buckets", "blocks", "block", "max_rows",
                                                                     "train_steps")}}
  common.write_json(args, "finetune_buckets", MODULE, payload)
  return payload


if __name__ == "__main__":
  main()
