"""Many `python -m albert_jax.main` command lines for the start-up cost of one: a driver process imports what every
run imports (jax, the engine, pretraining, fine-tuning, TPU compilation: seconds of CPU), then
forks one child per command line. Each child is a whole process, started as `python -m albert_jax.main ARGS` starts
(flags parsed afresh; its own exit status, stdout and stderr at the file-descriptor level, exit handlers), only
without importing again. For command lines that end early, such as refusals: the driver itself runs nothing (jax
warns at a fork once a backend runs, and `run_each` fails on that warning)."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_each(command_lines: list[list[str]], env: dict[str, str]) -> list[subprocess.CompletedProcess]:
  """`python -m albert_jax.main *args` for each args in `command_lines`, every one in `env`: the finished processes,
  in order."""
  with tempfile.TemporaryDirectory() as folder:
    driver = subprocess.run([sys.executable, "-m", "tests.cli_forks", folder, json.dumps(command_lines)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=600)
    assert driver.returncode == 0 and "os.fork() was called" not in driver.stderr, driver.stderr
    read = lambda i, name: Path(folder, f"{i}.{name}").read_text()
    return [subprocess.CompletedProcess([sys.executable, "-m", "albert_jax.main", *args], int(read(i, "status")),
                                        read(i, "out"), read(i, "err")) for i, args in enumerate(command_lines)]


def _drive(folder: str, command_lines: list[list[str]]) -> None:
  from absl import app

  from albert_jax import cli, main
  for module in ("engine", "pretrain", "finetune", "tpu_compile"):  # what the runs import
    importlib.import_module(f"albert_jax.{module}")
  for i, args in enumerate(command_lines):
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:  # stdout and stderr into files, then the command line, which exits the child
      for fd, name in ((1, "out"), (2, "err")):
        os.dup2(os.open(os.path.join(folder, f"{i}.{name}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
      sys.argv = [main.__file__, *args]
      app.run(main.main, flags_parser=cli.parse_flags)
    _, status = os.waitpid(child, 0)
    Path(folder, f"{i}.status").write_text(str(os.waitstatus_to_exitcode(status)))


if __name__ == "__main__":
  _drive(sys.argv[1], json.loads(sys.argv[2]))
