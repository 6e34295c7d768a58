"""The command line's checks and messages: how `albert_jax.main` parses its flags (a mistake said in one line, a
run's own config.json as the config when --config is left out) and refuses a command that cannot run before
anything is written."""
from __future__ import annotations

import contextlib
import difflib
import os
import sys

import ml_collections
from absl import flags
from ml_collections import config_flags

from albert_jax import runner, storage
from albert_jax.run import Run, check_output, config as run_config
from albert_jax.errors import (EnvironmentUserError, InputError, MissingFileError, NotADirectoryUserError,
                               NotWritableError, UserError)
from data_pipeline import writers

FLAGS = flags.FLAGS


def experiment_config(argv: list[str]) -> ml_collections.ConfigDict:
  """The config that these command-line arguments select (`--config=file.py[:arg]` and its `--config.<field>`
  overrides; other flags are left alone), parsed as `main` parses it."""
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=flag_values, sys_argv=argv)
  flag_values(argv, known_only=True)
  return flag_values.config


def _flag_value(argv: list[str], name: str) -> str | None:
  """The value of `--name=value` or `--name value` in `argv`, read before absl parses it."""
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _config_spec(argv: list[str]) -> str | None:
  return _flag_value(argv, "config")


def _spec_run(spec: str) -> Run | None:
  """The run of a `--config` that reads a run's resolved config (`_with_run_config`), else None."""
  path, _, workdir = spec.partition(":")
  return Run(workdir) if os.path.abspath(path) == run_config.__file__ else None


def _config_name(spec: str) -> str:
  """How a message names the config: the experiment file as given, or the run's config.json."""
  run = _spec_run(spec)
  return spec if run is None else run.config


# Modes that use a trained run's weights: without --config they read its settings from the workdir.
RUN_CONFIG_MODES = ("eval", "predict", "embed")


def _with_run_config(argv: list[str]) -> list[str]:
  """`argv` with `--config=albert_jax/run/config.py:WORKDIR` where --config is left out and the mode reads a
  workdir: eval, predict and embed always (an unreadable config.json is then refused in one line naming --config),
  train when the workdir holds a run's config.json (a resume; a fresh run needs an experiment file)."""
  workdir, mode_name = _flag_value(argv, "workdir"), _flag_value(argv, "mode") or "train"
  if _config_spec(argv) is not None or not workdir:
    return argv
  if mode_name in RUN_CONFIG_MODES or (mode_name == "train" and run_config.exists(Run(workdir))):
    return [argv[0], f"--config={run_config.__file__}:{workdir}", *argv[1:]]
  return argv


def _say_run_config(spec: str) -> None:
  """One line on where the config came from when it is the run's own, with the overrides given on top of it."""
  run = _spec_run(spec)
  if run is None:
    return
  given = [f"{name.removeprefix('config.')}={FLAGS[name].value}" for name in FLAGS
           if name.startswith("config.") and FLAGS[name].present]
  overrides = f"overrides: {', '.join(given)}" if given else "no overrides"
  print(f"config: {run.config} (the run's resolved config); {overrides}", flush=True)


def _unknown_field(argv: list[str]) -> str | None:
  """The first `--config.<field>` override that names no field of the experiment file, with the nearest flag."""
  spec = _config_spec(argv)
  if spec is None:
    return None
  defaults = experiment_config(["main", f"--config={spec}"])
  for arg in argv[1:]:
    prefix = next((p for p in ("--config.", "--noconfig.") if arg.startswith(p)), None)
    if prefix is None:
      continue
    parts, node = arg[len(prefix):].split("=", 1)[0].split("."), defaults
    for depth, part in enumerate(parts):
      if isinstance(node, ml_collections.ConfigDict) and part in node:
        node = node[part]
        continue
      if isinstance(node, ml_collections.ConfigDict):
        close = _nearest_field(parts[depth:], node)
        hint = f"; did you mean --config.{'.'.join([*parts[:depth], *close])}?" if close else ""
      else:
        hint = f"; {'.'.join(parts[:depth])} is a value, not a section"
      return f"{arg.split('=', 1)[0]}: {_config_name(spec)} has no field {'.'.join(parts)}{hint}"
  return None


def _nearest_field(parts: list[str], node: ml_collections.ConfigDict) -> list[str] | None:
  """`parts` with each name replaced by its nearest in `node`, so the hint is a whole flag that parses
  (`trian.num_train_steps` gets `--config.train.num_train_steps`, not `--config.train`); None when one has no
  match."""
  nearest = []
  for part in parts:
    if not isinstance(node, ml_collections.ConfigDict):
      return None
    close = difflib.get_close_matches(part, list(node.keys()), n=1)
    if not close:
      return None
    nearest.append(close[0])
    node = node[close[0]]
  return nearest


def _experiment_error(error: flags.Error) -> Exception | None:
  """The user error raised inside the experiment's get_config (`file.py:arg`); None for any other flag error.
  ml_collections re-raises it as a copy of its type holding the traceback as text, which absl wraps again: the
  innermost one of the chain is the original."""
  found, cause = None, error.__context__
  while cause is not None:
    found = cause if isinstance(cause, UserError) else found
    cause = cause.__context__
  return found


def _mode_error(argv: list[str]) -> str | None:
  """A --mode that names no mode without --config: said rather than the missing --config (a misspelt mode that
  reads the run's config.json, which the workdir would provide); with --config, absl's message names it."""
  mode_name = _flag_value(argv, "mode")
  if mode_name is None or mode_name in runner.MODES or _config_spec(argv) is not None:
    return None
  close = difflib.get_close_matches(mode_name, list(runner.MODES), n=1)
  hint = f" (did you mean --mode={close[0]}?)" if close else ""
  return f"error: --mode={mode_name} is not a mode{hint}; choose one of {', '.join(runner.MODES)}."


def _config_file_error(argv: list[str]) -> str | None:
  """A `--config` that names no file; ml_collections would raise it only when the config is first read (as it does
  any OSError of get_config: a run's config.json that cannot be read raises its one-line error here)."""
  spec = _config_spec(argv)
  run = None if spec is None else _spec_run(spec)
  if run is not None:
    run_config.read(run)
    return None
  if spec is None:
    reads_run = (_flag_value(argv, "mode") or "train") in RUN_CONFIG_MODES
    run = ", or the --workdir of a training run (its config.json is read)" if reads_run else ""
    return f"error: --config is required: pass an experiment file, e.g. experiments/pretrain_tiny.py{run}."
  path = spec.split(":", 1)[0]
  if os.path.isfile(path):
    return None
  found = "is a directory" if os.path.isdir(path) else "does not exist"
  return f"error: --config={spec}: {path} {found}; pass an experiment file, e.g. experiments/pretrain_tiny.py."


def _not_a_config_dict(argv: list[str]) -> str | None:
  """The message for an experiment whose get_config() returns something other than a ConfigDict (a dict has no
  attribute access, no overrides and no locking), else None."""
  if isinstance(FLAGS.config, ml_collections.ConfigDict):
    return None
  return (f"error: --config={_config_spec(argv)}: get_config() returned a {type(FLAGS.config).__name__}; return an "
          "ml_collections.ConfigDict, as experiments/pretrain_tiny.py does (ml_collections.ConfigDict(d) wraps a "
          "dict).")


HELP_FLAGS = ("-?", "--help", "-help", "--helpshort", "-helpshort", "--helpfull", "-helpfull")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, each mistake said in one line instead of absl's usage page or a traceback: a flag's bad
  value or an unknown flag (absl's message names it), a `--config` file that is missing or has no `get_config`, a
  misspelt `--config.<field>` (ml_collections raises a KeyError or AttributeError from inside the parser) and a bad
  experiment argument (our ValueError from get_config, with the usual `error: ` of our messages). `--help` exits 0
  (absl's exits 1). Without --config, a run's config.json in --workdir is the config (`_with_run_config`), said in
  one line."""
  if any(arg in HELP_FLAGS for arg in argv[1:]):
    with contextlib.suppress(SystemExit):
      FLAGS(argv)  # prints the usage, then exits 1
    sys.exit(0)
  try:
    message = _mode_error(argv)
    if message is None:
      argv = _with_run_config(argv)
      message = _config_file_error(argv)
    if message is None:
      remaining = FLAGS(argv)
      message = _not_a_config_dict(argv)
      if message is None:
        _say_run_config(_config_spec(argv))
        return remaining
  except UserError as e:  # a run's config.json that cannot be read, or a gs:// workdir's bucket
    message = f"error: {e}"
  except flags.Error as e:
    ours = _experiment_error(e)
    message = f"error: {ours}" if ours else f"FATAL Flags parsing error: {e} (--helpfull lists every flag)"
  except AttributeError as e:
    no_get_config = str(e).endswith("'get_config'")
    message = (f"error: --config={_config_spec(argv)} defines no get_config(); an experiment file returns its "
               "ConfigDict from get_config(), as experiments/pretrain_tiny.py does." if no_get_config
               else f"FATAL Flags parsing error: {_unknown_field(argv) or e}")
  except KeyError as e:
    message = f"FATAL Flags parsing error: {_unknown_field(argv) or e}"
  except SyntaxError as e:  # the experiment file, or a module it imports, does not parse
    message = (f"error: --config={_config_spec(argv)}: {e.filename}, line {e.lineno}: {e.msg}; fix that line of the "
               "experiment file.")
  print(message, file=sys.stderr)
  sys.exit(1)


def check_backend() -> None:
  """A JAX_PLATFORMS naming a backend this host cannot start (gpu or tpu on a CPU host, a misspelt name) is one
  line naming the variable and the fix, not jax's traceback from the first call that needs a device."""
  import jax
  try:
    jax.devices()
  except RuntimeError as e:
    if "Unable to initialize backend" not in str(e):
      raise
    reason = str(e).split(" (set JAX_PLATFORMS", 1)[0].rstrip(".")
    raise EnvironmentUserError(f"JAX_PLATFORMS={jax.config.jax_platforms}: {reason}. Unset JAX_PLATFORMS to use "
                               "the devices this host has, or name one of them (cpu on a host without "
                               "accelerators).") from None


# Modes that only read the workdir when --output names where their result goes: a read-only workdir serves them
# (fine-tuning's eval writes the dev predictions into it, predict --split without --output its benchmark file).
READ_ONLY_WITH_OUTPUT = ("eval", "predict", "embed")


def check_workdir(workdir: str, mode_name: str, output: str | None = None, eval_reads_only: bool = False) -> None:
  """A local workdir that cannot serve the mode is refused in one line; nothing is written (a config refused later
  leaves no folder behind). `eval_reads_only`: the config's kind writes nothing with --mode=eval
  (`JobKind.eval_reads_only`)."""
  from albert_jax import storage  # fsspec: imported when a workdir is checked, not for --help
  if output and mode_name == "eval" and eval_reads_only:
    raise InputError("--output does nothing with --mode=eval of this config: its eval writes no predictions. "
                     "Drop it.")
  if storage.is_remote(workdir):
    return  # a bucket is checked by the storage layer on first use
  storage.path(workdir)  # refuses a gs:// URL whose '//' was collapsed, before a lock makes a local `gs:` folder
  if runner.MODES[mode_name].reads_run and not os.path.exists(workdir):
    raise MissingFileError(f"--workdir={workdir} does not exist; --mode={mode_name} reads the weights of a "
                           "training run: pass that run's --workdir.")
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise NotADirectoryUserError(f"--workdir={workdir} is a file; pass a directory (it is created if missing).")
  existing = os.path.abspath(workdir)
  while not os.path.exists(existing):  # the workdir or the folder it would be created in; nothing is made yet
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise NotADirectoryUserError(f"--workdir={workdir} cannot be created: {existing} is a file; pass a directory path.")
  reads_only = (output and mode_name in READ_ONLY_WITH_OUTPUT) or (eval_reads_only and mode_name == "eval")
  if not os.access(existing, os.W_OK | os.X_OK) and not reads_only:
    hint = (f" (or pass --output: {mode_name} then writes nothing there)" if mode_name in ("eval", "predict")
            else "")
    raise NotWritableError(f"--workdir={workdir}: {existing} is not writable; pass a writable directory{hint}.")


# The flags that only some modes read: given to another mode they would be ignored without a word.
MODE_FLAGS = {"input": ("predict", "embed"), "output": ("eval", "predict", "embed"), "split": ("predict",),
              "pooling": ("embed",), "topology": ("compile",), "num_slices": ("compile",), "fit": ("compile",)}


def check_command_line(argv: list[str], mode_name: str) -> None:
  """Refuses leftover arguments, a missing --workdir, and a flag the mode does not read."""
  if len(argv) > 1:
    raise InputError(f"unexpected arguments {argv[1:]}; every setting is a --flag or a --config.<field> override.")
  if runner.MODES[mode_name].needs_workdir and not FLAGS.workdir:
    raise InputError(f"--workdir is required for --mode={mode_name}: where the run's checkpoints and metrics are.")
  for name, modes in MODE_FLAGS.items():
    if FLAGS[name].present and mode_name not in modes:
      raise InputError(f"--{name} does nothing with --mode={mode_name}; it is read by --mode="
                       f"{' and --mode='.join(modes)}. Drop it, or choose that mode.")
  if FLAGS.input and storage.path(FLAGS.input).is_dir():
    raise InputError(f"--input={FLAGS.input} is a folder; --mode={mode_name} reads one file of examples: pass that "
                     "file (its format: docs/finetuning.md).")
  if FLAGS.output and mode_name in ("predict", "embed") and storage.path(FLAGS.output).is_dir():
    example = "embeddings.npy" if mode_name == "embed" else "predictions.jsonl"
    raise InputError(f"--output={FLAGS.output} is a folder; --mode={mode_name} writes one file: name it, e.g. "
                     f"--output={os.path.join(FLAGS.output, example)}.")
  if FLAGS.output:
    _check_output_apart(FLAGS.output, FLAGS.input, FLAGS.workdir)


def _check_output_apart(output: str, input_path: str | None, workdir: str | None) -> None:
  """Predictions and embeddings never replace their input, nor a run's own files (its weights, config, head,
  metrics)."""
  if input_path:
    writers.check_apart("--output", output, "--input", input_path, "the output", new="file")
  check_output("--output", output, Run(workdir) if workdir else None)
