"""The user's mistakes, as exception types: a bad config value, flag, file, workdir or data set.

Every command line (`albert_jax.main`, `albert_jax.convert`, the `data_pipeline` tools, ...) prints a `UserError`
as one line, `error: <message>`, and exits with status 1; any other exception is a bug and keeps its traceback.
So each message names the problem and the fix. Each class also derives from the built-in error its callers have
always caught (a bad value is a ValueError, a missing file a FileNotFoundError, ...).

The bottom layer of the project: it imports nothing of ours, and both `data_pipeline` and `albert_jax` use it.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator


class UserError(Exception):
  """A mistake in the user's input; the message names the problem and the fix."""


class InputError(UserError, ValueError):
  """A bad value: a config field, a flag, an experiment argument, a line of a data file."""


class MissingFileError(UserError, FileNotFoundError):
  """A file or folder the user named, or one a mode needs in the workdir, does not exist."""


class NotADirectoryUserError(UserError, NotADirectoryError):
  """A path that must be a folder is a file."""


class ExistsError(UserError, FileExistsError):
  """An output path that must be new or empty is not."""


class NotWritableError(UserError, PermissionError):
  """A folder the run must write into cannot be written."""


class EnvironmentUserError(UserError, OSError):
  """The machine or a service cannot do what was asked (a bucket, a full disk, an extra not installed)."""


class NotFiniteError(UserError, FloatingPointError):
  """Training diverged: the loss or the gradient norm is NaN or infinite."""


def is_user_error(error: BaseException) -> bool:
  """A `UserError`, or an OSError that the operating system raised (errno set: no such file, permission denied,
  no space left): both name what to fix, so a traceback would only hide the message."""
  return isinstance(error, UserError) or (isinstance(error, OSError) and error.errno is not None)


@contextlib.contextmanager
def one_line_user_errors(prefix: str = "error: ") -> Iterator[None]:
  """Inside, a user error ends the process with `<prefix><message>` on stderr and exit status 1; any other
  exception propagates with its traceback."""
  try:
    yield
  except Exception as e:  # noqa: BLE001 - re-raised unless it is the user's
    if not is_user_error(e):
      raise
    sys.stdout.flush()
    sys.exit(f"{prefix}{e}")
