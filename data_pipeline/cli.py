"""What the command lines of data_pipeline share: a user's mistake (a flag out of range, a glob matching nothing, a
binary input, a missing bucket) is reported in one line on stderr with exit status 1, while a bug keeps its
traceback."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from albert_jax.errors import InputError, one_line_user_errors

_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def boolean(text: str) -> bool:
  """An argparse type: true/false, 1/0 or yes/no in any case. Anything else is refused, since a typo (`ture`) read
  as false would change the output without a word."""
  if text.lower() not in _BOOLEANS:
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean; pass true or false (or 1/0, yes/no)")
  return _BOOLEANS[text.lower()]


def check_at_least(flag: str, value: int, minimum: int) -> None:
  if value < minimum:
    raise InputError(f"--{flag}={value} must be at least {minimum}.")


def on_stderr(prog: str) -> Callable[[str], None]:
  """How a tool tells a line (`prog: line`): on stderr, since stdout carries its result."""
  return lambda line: print(f"{prog}: {line}", file=sys.stderr, flush=True)


def run(prog: str, main: Callable[[], object]) -> None:
  """Runs a command line's `main`, a user error as `prog: error: message` and exit status 1."""
  with one_line_user_errors(f"{prog}: error: "):
    main()
