"""The text of a task's input files: read as UTF-8 with errors named by file and line, ids and class names free of
characters that would break a prediction file's rows or look like another name, regression labels as finite
decimals."""
from __future__ import annotations

import math
import re
import unicodedata

from albert_jax import storage
from albert_jax.errors import InputError, MissingFileError

# Control characters and Unicode line breaks: in an id or a class name they would split or shift rows of the
# prediction files (GLUE's are TSV; str.splitlines() also cuts at \v, \f, \x1c-\x1e, \x85, \u2028, \u2029).
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Zero-width joiners change how the letters of joining scripts (Persian, Indic) and emoji sequences look, so between
# two such characters they are part of what a person reads; every other format character (Unicode category Cf:
# zero-width space, bidi controls, byte-order mark, soft hyphen) is invisible.
JOINERS = "\u200c\u200d"


class DataFileError(InputError):
  """Bad input data; the message names the file and the line (or record) at fault."""

  def __init__(self, path: str, where: str | int | None, message: str):
    location = f"{path}:{where}" if where is not None else path
    super().__init__(f"{location}: {message}")


def control_character(text: str, what: str) -> str | None:
  """The complaint about an id or class name that holds a control character (see CONTROL) or an invisible format
  character (see JOINERS): one would break the prediction files' rows, the other makes a name that looks like
  another but is not; None when it is clean."""
  if found := CONTROL.search(text):
    return (f"{what} {text!r} holds the control character {found.group()!r}; ids and class names are written into "
            "prediction files, whose rows it would break: remove it.")
  invisible = [i for i, ch in enumerate(text) if unicodedata.category(ch) == "Cf" and not _joins(text, i)]
  if invisible:
    ch = text[invisible[0]]
    seen = "".join(c for i, c in enumerate(text) if i not in invisible)
    return (f"{what} {text!r} holds the invisible format character U+{ord(ch):04X} "
            f"({unicodedata.name(ch, 'unnamed')}), which makes it another {what} than the one it looks like: remove "
            f"it (did you mean {seen!r}?)")
  return None


def _joins(text: str, i: int) -> bool:
  """Whether text[i] is a zero-width joiner between two visible characters (letters, marks, digits, symbols)."""
  return (text[i] in JOINERS and 0 < i < len(text) - 1
          and all(unicodedata.category(text[j])[0] in "LMNS" for j in (i - 1, i + 1)))


def as_read(text: str) -> str:
  """An id or class name as a person reads it: NFC, so a decomposed "café" is the composed one."""
  return unicodedata.normalize("NFC", text)


# A number as data files write it: float() also takes "1_000" (Python's digit grouping), "nan" and "infinity".
NUMBER = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*")


def score_label(text: str, path: str, line: int, hint: str) -> float:
  """A regression label: a finite decimal number, else a DataFileError naming the row (a nan would train and score
  as nan; "1_000" is 1000 to Python alone)."""
  score = float(text) if NUMBER.fullmatch(text) else math.nan
  if not math.isfinite(score):
    raise DataFileError(path, line, f"label {text!r} is not a finite number in decimal notation ({hint})")
  return score


def read_text(path: str) -> str:
  """Every task's input file as text; bytes that are not UTF-8 are named by line, like the other input errors."""
  file = storage.path(path)
  if not file.exists():
    raise MissingFileError(f"{path} not found; check --config.data.path (see docs/finetuning.md for the layout).")
  data = file.read_bytes()
  try:
    return data.decode("utf-8-sig")  # MRPC's TSVs start with a byte-order mark
  except UnicodeDecodeError as e:
    line_start = data.rfind(b"\n", 0, e.start) + 1
    raise DataFileError(path, data.count(b"\n", 0, e.start) + 1,
                     f"not UTF-8 (byte 0x{data[e.start]:02x} at column {e.start - line_start + 1}); save the file "
                     "as UTF-8 (e.g. iconv -f latin1 -t utf-8).") from None
