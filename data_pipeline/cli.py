"""What the command lines of data_pipeline share: a user's mistake (a flag out of range, a glob matching nothing, a
binary input) is reported in one line on stderr with exit status 1, while a bug keeps its traceback."""
from __future__ import annotations

import sys
from typing import Callable


class InputError(ValueError):
  """A mistake in the flags or the input files; the message names the fix. A ValueError, so callers of the library
  functions catch it as before."""


def check_at_least(flag: str, value: int, minimum: int) -> None:
  if value < minimum:
    raise InputError(f"--{flag}={value} must be at least {minimum}.")


def run(prog: str, main: Callable[[], object]) -> None:
  """Runs a command line's `main`: an InputError becomes `prog: error: message` and exit status 1."""
  try:
    main()
  except InputError as e:
    sys.exit(f"{prog}: error: {e}")
