"""What the command lines of data_pipeline share: a user's mistake (a flag out of range, a glob matching nothing, a
binary input, a missing bucket) is reported in one line on stderr with exit status 1, while a bug keeps its
traceback."""
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
  """Runs a command line's `main`: an error of ours that names its fix (an InputError, a StorageError such as a
  missing bucket or credentials, or another of albert_jax.main's INPUT_ERRORS raised by our code) becomes
  `prog: error: message` and exit status 1, as albert_jax.main reports them; a library's error keeps its
  traceback."""
  try:
    main()
  except Exception as e:  # noqa: BLE001 - re-raised unless it is one of ours
    from albert_jax.main import INPUT_ERRORS, raised_by_our_code   # on failure only: it loads jax (~0.5 s)
    from albert_jax.storage import StorageError
    if not (isinstance(e, (InputError, StorageError)) or isinstance(e, INPUT_ERRORS) and raised_by_our_code(e)):
      raise
    sys.exit(f"{prog}: error: {e}")
