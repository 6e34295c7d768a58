"""What the command lines of data_pipeline share: a user's mistake (a flag out of range, a glob matching nothing, a
binary input, a missing bucket) is reported in one line on stderr with exit status 1, while a bug keeps its
traceback."""
from __future__ import annotations

from typing import Callable

from albert_jax.errors import InputError, one_line_user_errors


def check_at_least(flag: str, value: int, minimum: int) -> None:
  if value < minimum:
    raise InputError(f"--{flag}={value} must be at least {minimum}.")


def run(prog: str, main: Callable[[], object]) -> None:
  """Runs a command line's `main`, a user error as `prog: error: message` and exit status 1."""
  with one_line_user_errors(f"{prog}: error: "):
    main()
