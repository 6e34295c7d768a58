"""Command line: `python -m albert_jax.main --config experiments/pretrain_large.py --workdir=DIR [--mode=...]`.

Thin, after flax `examples/lm1b/main.py`: flags, `jax.distributed.initialize()` on several hosts, then one call.
"""
from __future__ import annotations

import os

from absl import app, flags, logging
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment file: `file.py` or `file.py:arg`.", lock_config=True)
flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and the resolved config go.")
flags.DEFINE_enum("mode", "train", ["train", "eval", "describe", "predict"], "What to run.")
flags.DEFINE_string("input", None, "--mode=predict: the user's TSV/JSONL file.")
flags.DEFINE_string("output", None, "--mode=predict: where predictions are written.")
flags.DEFINE_bool("multihost", None, "Call jax.distributed.initialize() (default: when the environment names a "
                  "coordinator or several TPU hosts).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process runs off TPU).")
flags.DEFINE_integer("num_processes", None, "Process count (with --coordinator_address).")
flags.DEFINE_integer("process_id", None, "This process's index (with --coordinator_address).")
flags.mark_flags_as_required(["config"])


def _initialize_distributed() -> None:
  import jax
  several_tpu_hosts = "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if FLAGS.coordinator_address:
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  elif FLAGS.multihost or (FLAGS.multihost is None and several_tpu_hosts):
    jax.distributed.initialize()


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not FLAGS["verbosity"].present:  # absl INFO chatter (orbax, jax backends) unless --verbosity=0 is given
    logging.set_verbosity(logging.WARNING)
  config = FLAGS.config
  if FLAGS.mode == "describe":
    from albert_jax import describe, train
    describe.print_description(train.model_config_from(config), config.data.max_seq_length,
                               config.data.get("max_predictions_per_seq"))
    return
  if not FLAGS.workdir:
    raise app.UsageError("--workdir is required for --mode=train/eval/predict.")
  _initialize_distributed()
  from albert_jax import runner
  runner.run(config, FLAGS.workdir, FLAGS.mode, FLAGS.input, FLAGS.output)


if __name__ == "__main__":
  app.run(main)
