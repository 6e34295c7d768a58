"""What a command line sets up in its process, in one place. Entry points (`albert_jax.main`, `albert_jax.convert`,
the benchmarks) call `install()` before they run; importing the library changes nothing process-wide.

Each setting and its reason:
- absl's verbosity WARNING, unless `--verbosity` is given: orbax logs every file it opens and jax every backend it
  probes at INFO, which buries the run's own progress lines.
- `checkpointing.ORBAX_ERRORS` on the loggers of absl and asyncio: orbax logs a failed background save as pages
  of ERROR records with tracebacks before the loop learns of it, and asyncio reports each of its abandoned writes
  when the write's task is collected, as late as exit; the loop's SaveError says it all in one line.
- `sys.unraisablehook` without the reports that a failed save or restore leaves behind (asyncio's "Event loop is
  closed" from every write still pending, tensorstore's dropped reads), which SaveError or the restore's line
  already states; the same reports from anywhere else still print.
- libtpu's host query answered off TPU VMs: otherwise loading libtpu on a CPU host waits on a metadata server that
  is not there.
- absl flags marked parsed where no absl app parsed them (a script): grain's worker processes read grain's absl
  flags, which raise on access before parsing.
"""
from __future__ import annotations

import contextlib
import logging as std_logging
import os
import shlex
import shutil
import sys
from typing import Iterator

from absl import flags, logging

from albert_jax import checkpointing, topology


def install() -> None:
  """Applies the settings above; a second call changes nothing."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  if "verbosity" not in flags.FLAGS or not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  for name in ("absl", "asyncio"):
    logger = std_logging.getLogger(name)
    if checkpointing.ORBAX_ERRORS not in logger.filters:
      logger.addFilter(checkpointing.ORBAX_ERRORS)
  if not getattr(sys.unraisablehook, "without_failed_checkpoint_reports", False):
    sys.unraisablehook = checkpointing.without_reports_said_in_one_line(sys.unraisablehook)
    sys.unraisablehook.without_failed_checkpoint_reports = True
  topology.quiet_libtpu_off_tpu_vms()


def python() -> str:
  """This process's interpreter as a printed command names it: `python` where that is what PATH runs (an activated
  venv), else its path, so that a `next:` line runs as printed in a fresh shell."""
  on_path = shutil.which("python")
  return "python" if on_path and os.path.abspath(on_path) == os.path.abspath(sys.executable) else shlex.quote(
      sys.executable)


_runs_say_done = True  # False while a command of several runs ends with its own summary (`runs_say_no_done_line`)


@contextlib.contextmanager
def runs_say_no_done_line() -> Iterator[None]:
  """Inside, a finished run prints no `done: ... next:` line: a command that runs several (`albert_jax.seeds`) ends
  with its own summary instead."""
  global _runs_say_done
  _runs_say_done = False
  try:
    yield
  finally:
    _runs_say_done = True


def say_done(what: str, next_command: str) -> None:
  """The last line of a finished run: what it leaves, and the command that goes on from it (naming `python()`)."""
  import jax  # imported here: `--help` loads this module without jax
  if jax.process_index() == 0 and _runs_say_done:
    print(f"done: {what}; next: {next_command}", flush=True)
