"""Pretrain ALBERT, fine-tune it on a task, then score, predict or embed with the run:

  python -m albert_jax.main --config experiments/pretrain_tiny.py --workdir /tmp/albert_tiny
  python -m albert_jax.main --config experiments/glue.py:task=rte,data=DATA/glue --workdir /tmp/albert_tiny_rte \\
    --config.init_checkpoint=/tmp/albert_tiny
  python -m albert_jax.main --workdir /tmp/albert_tiny_rte --mode=predict --split=dev --output=/tmp/rte_dev.tsv

`--config.<field>=value` overrides a field of the experiment file; without --config, the modes that read a run
take its resolved config from the workdir (config.json). `--helpfull` lists every flag.

The code: flags, `jax.distributed.initialize()` on several hosts, then the config's job kind
(`job_kinds.kind_for`) runs the mode (`runner.MODES`); the checks and messages of the command line are `cli`'s.
"""
from __future__ import annotations

import os

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from albert_jax import cli, job_kinds, runner
from albert_jax.errors import one_line_user_errors
from albert_jax.run import Run, refusal

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment file: `file.py` or `file.py:arg`. Left out, eval, predict, "
                                "embed and a resume use the run's resolved config, --workdir's config.json.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and the resolved config go.")
flags.DEFINE_enum("mode", "train", list(runner.MODES), "What to run:\n" + runner.modes_help())
flags.DEFINE_string("input", None, "--mode=predict: the user's TSV/JSONL file; --mode=embed: one text per line.")
flags.DEFINE_string("output", None, "--mode=predict: where predictions are written; --mode=embed: the .npy file; "
                    "--mode=eval of a fine-tuning run: the folder for the dev predictions (default: the workdir).")
flags.DEFINE_enum("pooling", "mean", ["mean", "pooled"], "--mode=embed: mean of the last layer over the tokens, or "
                  "the [CLS] pooler output.")
flags.DEFINE_string("split", None, "--mode=predict: a named split of the task (test, dev, test_mismatched, ax, ...) "
                    "instead of --input.")
flags.DEFINE_string("topology", None, "--mode=compile: a Cloud TPU name (v3-256, v4-128, v5litepod-64, v5p-256, "
                    "v6e-64) or a JAX topology string (v3:8x16).")
flags.DEFINE_integer("num_slices", 1, "--mode=compile: slices joined by the data-centre network (multislice).")
flags.DEFINE_bool("fit", False, "--mode=compile: search remat policy and micro batch for the fastest setting "
                  "that fits.")
flags.DEFINE_bool("multihost", None, "Call jax.distributed.initialize() (default: when TPU_WORKER_HOSTNAMES "
                  "lists several TPU hosts).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process runs off TPU).")
flags.DEFINE_integer("num_processes", None, "Process count (with --coordinator_address).")
flags.DEFINE_integer("process_id", None, "This process's index (with --coordinator_address).")
flags.mark_flags_as_required(["config"])


def initialize_distributed() -> None:
  import jax
  several_tpu_hosts = "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if FLAGS.coordinator_address:
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  elif FLAGS.multihost or (FLAGS.multihost is None and several_tpu_hosts):
    jax.distributed.initialize()


def main(argv) -> None:
  from albert_jax import console
  console.install()
  with one_line_user_errors():
    cli.check_command_line(argv, FLAGS.mode)
    run(FLAGS.config, FLAGS.workdir, FLAGS.mode, tuple(config_flags.get_override_values(FLAGS["config"])))


def run(config: ml_collections.ConfigDict, workdir: str | None, mode_name: str,
        overrides: tuple[str, ...] | None = None) -> None:
  """`overrides`: the `a.b` of each `--config.a.b` of the command line, which the weights' record does not replace
  (`weights.resolve`); None for a config built in Python."""
  with refusal.leaves_no_new_workdir(workdir if runner.MODES[mode_name].needs_workdir else None):
    _run(config, workdir, mode_name, overrides)


def _run(config: ml_collections.ConfigDict, workdir: str | None, mode_name: str,
         overrides: tuple[str, ...] | None) -> None:
  kind, training_run = job_kinds.kind_for(config), Run(workdir) if workdir else None
  if runner.MODES[mode_name].needs_workdir:
    cli.check_workdir(workdir, mode_name, FLAGS.output, eval_reads_only=kind.eval_reads_only())
    initialize_distributed()
    cli.check_backend()
    from albert_jax import compilation_cache
    compilation_cache.use(config, training_run)
  if mode_name == "compile" and not os.environ.get("JAX_PLATFORMS"):
    import jax
    jax.config.update("jax_platforms", "cpu")  # compile-only TPU devices come from libtpu; run nothing on a chip
  runner.run_mode(kind, training_run, mode_name, job_kinds.RunArgs(
      input=FLAGS.input, output=FLAGS.output, topology=FLAGS.topology, num_slices=FLAGS.num_slices, fit=FLAGS.fit,
      pooling=FLAGS.pooling, split=FLAGS.split, overrides=overrides))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
