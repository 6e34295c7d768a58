"""Line-numbered readers for the text formats the tasks take (GLUE TSV, user TSV/JSONL), so that every error
can point at the file and line that caused it."""
from __future__ import annotations

import csv
import functools
import io
import json
import math
import re
from typing import Any, Iterator

from albert_jax.tasks.input_text import DataFileError, as_read, control_character, read_text

SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # where json.loads may make a lone surrogate


def text_lines(path: str) -> Iterator[tuple[int, str]]:
  """(1-based line number, line without its \\n or \\r\\n) of a line-based file (TSV, JSON lines, CoNLL). Any other
  carriage return is refused: old Mac line ends (\\r alone) would make the file one line, its rows merged."""
  for number, line in enumerate(read_text(path).split("\n"), start=1):
    line = line.removesuffix("\r")
    if "\r" in line:
      raise DataFileError(path, number, "a carriage return (\\r) inside the line: old Mac line ends, or a stray \\r in "
                                     "the text; end lines with \\n or \\r\\n (e.g. tr '\\r' '\\n' < old > new).")
    yield number, line


def tsv_rows(path: str) -> Iterator[tuple[int, list[str]]]:
  """(1-based line number, fields) for every non-blank line. Tabs only, no quoting: GLUE's sentences contain
  bare quotes, and the original reads them with `csv.reader(delimiter="\\t", quotechar=None)`."""
  for number, line in text_lines(path):
    if line.strip():
      yield number, line.split("\t")


def column(fields: list[str], index: int, path: str, line: int) -> str:
  if index >= len(fields) or -index > len(fields):
    raise DataFileError(path, line, f"expected a column {index} but the line has {len(fields)} tab-separated "
                                 "field(s); is this the right task/file?")
  return fields[index]


def user_records(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
  """A user's own file: JSON lines (`.jsonl`/`.json`), a CSV (`.csv`, quoted as spreadsheets write it) or a TSV
  (anything else: tabs only, no quoting), each with a header that names the fields."""
  if path.endswith(".csv"):
    yield from csv_records(path)
    return
  if path.endswith((".jsonl", ".json")):
    for number, line in text_lines(path):
      if line.strip():
        try:
          record = parse_json(line, path, number, object_pairs_hook=functools.partial(_unique_keys, path, number))
        except json.JSONDecodeError as e:
          raise DataFileError(path, number, f"not a JSON object ({e.msg})") from None
        if not isinstance(record, dict):
          raise DataFileError(path, number, "expected one JSON object per line")
        yield number, record
    return
  rows = tsv_rows(path)
  header_line, header = next(rows, (1, []))
  check_header(header, path, header_line)
  for number, fields in rows:
    if len(fields) != len(header):
      raise DataFileError(path, number, f"{len(fields)} field(s) but the header (line {header_line}) has "
                                     f"{len(header)}: {header}")
    yield number, dict(zip(header, fields))


def check_header(header: list[str], path: str, line: int) -> None:
  """Refuses a column named twice: a record keeps one value per name, so the other column would be dropped
  silently (the text read from the wrong column). Unnamed columns (a spreadsheet's trailing empty ones) may repeat:
  no setting can name them."""
  repeated = sorted({name for name in header if name and header.count(name) > 1})
  if repeated:
    raise DataFileError(path, line, f"column(s) {repeated} appear more than once in the header {header}; rename or "
                                 "drop the repeats.")


def _unique_keys(path: str, line: int, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
  """json.loads' object hook: a key given twice is refused (json.loads would keep the last value silently)."""
  out = {}
  for key, value in pairs:
    if key in out:
      raise DataFileError(path, line, f"field {key!r} appears twice in the object; keep one.")
    out[key] = value
  return out


def parse_json(text: str, path: str, line: int | None = None, **hooks) -> Any:
  """json.loads, refusing by file and line what it reads silently or with a traceback: a number beyond a float's
  range (read as infinity), NaN and Infinity (not JSON), an integer too long to read (a ValueError), a lone UTF-16
  surrogate ("\\ud800", half a character: writing it out fails later). `line`: the line `text` is; None: `text` is
  a whole file, and the first line that holds the culprit is named."""
  def refuse(culprit: str, message: str):
    at = line or text.count("\n", 0, max(text.lower().find(culprit.lower()), 0)) + 1
    raise DataFileError(path, at, message)

  def out_of_range(literal: str, reason: str):
    shown = literal if len(literal) <= 30 else f"{literal[:20]}... ({len(literal)} characters)"
    refuse(literal, f"number {shown} is out of range ({reason}); write a smaller number, or quote it to keep it as "
                    "text.")

  def read_int(literal: str) -> int:
    try:
      return int(literal)
    except ValueError:
      out_of_range(literal, "too many digits to read")

  def read_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
      out_of_range(literal, "beyond a float's ±1.8e308, it would read as infinity")
    return value

  def constant(literal: str):
    refuse(literal, f"{literal} is not a JSON number (json.loads would read it as {float(literal)}); write a finite "
                    "number, or quote it to keep it as text.")

  value = json.loads(text, parse_int=read_int, parse_float=read_float, parse_constant=constant, **hooks)
  if SURROGATE_ESCAPE.search(text):
    try:
      json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
      escape = f"\\u{ord(e.object[e.start]):04x}"
      refuse(escape, f"a lone UTF-16 surrogate {escape} (half of a character's escape, which no UTF-8 text can "
                     "hold); write the character itself, or both halves of its escape.")
  return value


def csv_records(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
  """Rows named by the line they start on (a quoted field may hold line breaks). Read in csv's strict mode: its
  default reads on past a quote left open or text after a closing quote, merging rows or mangling a field silently."""
  reader = csv.reader(io.StringIO(read_text(path), newline=""), strict=True)
  start = 1
  try:
    header = next(reader, [])
    check_header(header, path, start)
    start = reader.line_num + 1
    for fields in reader:
      if any(f.strip() for f in fields):
        if len(fields) != len(header):
          raise DataFileError(path, start, f"{len(fields)} comma-separated field(s) but the header has "
                                        f"{len(header)}: {header}; quote fields that contain commas.")
        yield start, dict(zip(header, fields))
      start = reader.line_num + 1
  except csv.Error as e:
    raise DataFileError(path, start, f"not a CSV row ({e}, line {reader.line_num}); a field that starts with a quote "
                                  "runs to the next lone quote: close each quoted field's quote, and double the quotes "
                                  "inside it (\"\").") from None


def read_id_map(path: str, what: str, valid) -> dict[str, Any]:
  """A predictions file that is one JSON object {id: value}, each value passing `valid`; refuses anything else by
  name: another JSON type, no ids, a bad value, NaN or Infinity (which json.loads reads as floats that would score
  as numbers), and an id given twice with different values (json.loads would silently keep the last)."""
  def finite_only(name):
    raise DataFileError(path, None, f"holds {name}, not a finite number; predictions of a model whose outputs went "
                                    "non-finite cannot be scored: predict again from a checkpoint before the "
                                    "divergence.")

  def unique(pairs):
    out = {}
    for key, value in pairs:
      if key in out and out[key] != value:
        raise DataFileError(path, f"id {key}", f"given twice, as {out[key]!r} and {value!r}; keep one.")
      out[key] = value
    return out
  try:
    values = json.loads(read_text(path), object_pairs_hook=unique, parse_constant=finite_only)
  except json.JSONDecodeError as e:
    raise DataFileError(path, e.lineno, f"not JSON ({e.msg}); pass the file write_predictions wrote.") from None
  if not isinstance(values, dict) or not values:
    found = "an empty object" if isinstance(values, dict) else f"a JSON {type(values).__name__}"
    raise DataFileError(path, None, f"{found}, expected an object {{id: {what}}}; pass the file write_predictions "
                                 "wrote.")
  for key, value in values.items():
    if not valid(value):
      raise DataFileError(path, f"id {key}", f"{value!r} is not {what}; is this the predictions file of this task?")
  return values


def check_ids(path: str, predicted, split) -> None:
  """Refuses predictions for ids that the gold file lacks: they would be ignored, hiding a mix-up of files."""
  extra = [key for key in predicted if key not in {ex.qid for ex in split.examples}]
  if extra:
    raise DataFileError(path, None, f"{len(extra)} id(s) are not in {split.path}, e.g. {extra[0]}; score against the "
                                 "gold file these predictions are for.")


class Ids:
  """The ids of one file's (or one folder's) examples, each once: predictions are keyed by id, so a repeat would
  overwrite the other example's prediction (and a line without id takes its row number, which may be another line's
  id). Ids are written into prediction files, so they hold no control characters."""

  def __init__(self, path: str, fix: str = "give every example its own id"):
    self.path, self.fix = path, fix
    self.first: dict[str, tuple[str, str, int | str, bool]] = {}  # as read -> (as written, path, line, given)

  def add(self, key: str, line: int | str, given: bool = True, path: str | None = None) -> str:
    """`line`: a line number, or where in a file without lines the id is (e.g. "question #3"); `path`: the file,
    when one Ids spans several. Two ids that differ only in their Unicode form are one id; each keeps its text."""
    path = path or self.path
    read = check_name(key, "id", path, line)
    if read in self.first:
      first_key, first_path, first_line, first_given = self.first[read]
      place = f"line {first_line}" if isinstance(first_line, int) else first_line
      if first_path != path:
        place = f"{first_path}:{first_line}"
      form = "" if first_key == key else f" (written {first_key!r} there, the same text in another Unicode form)"
      raise DataFileError(path, line, f"id {key!r}{_row_number(given)} is also the id of {place}"
                                   f"{_row_number(first_given)}{form}; {self.fix}.")
    self.first[read] = (key, path, line, given)
    return key


def check_name(text: str, what: str, path: str, line: int | str) -> str:
  """An id, label or tag read from a file as a person reads it (as_read), refused when it holds a control or an
  invisible format character (input_text.control_character)."""
  if problem := control_character(text, what):
    raise DataFileError(path, line, problem)
  return as_read(text)


def class_spelling(name: str) -> str | float:
  """What a label says whatever its spacing or number format: "0", " 0" and "0.0" say 0.0."""
  try:
    number = float(name)
  except ValueError:
    return name.strip()
  return number if math.isfinite(number) else name.strip()


def near_miss(text: str, names) -> str:
  """" (did you mean '0'?)" when `text` says one of `names` but for its spacing or number format, else ""."""
  match = next((name for name in names if class_spelling(name) == class_spelling(text)), None)
  return "" if match is None else f" (did you mean {match!r}?)"


def _row_number(given: bool) -> str:
  return "" if given else " (the row number of a line without id)"


def optional_id(record: dict[str, Any], path: str, line: int, row: int, ids: Ids) -> str:
  """The record's "id" (a string or an integer; null and other types are refused as `field` refuses them), else
  its row number; unique in the file."""
  if "id" not in record:
    return ids.add(str(row), line, given=False)
  return ids.add(str(field(record, "id", path, line, (str, int))), line)


def field(record: dict[str, Any], key: str, path: str, line: int, kind=str):
  if key not in record:
    raise DataFileError(path, line, f"missing field {key!r} (have {sorted(record)})")
  kinds = kind if isinstance(kind, tuple) else (kind,)
  if not isinstance(record[key], kind) or isinstance(record[key], bool) and bool not in kinds:  # True is an int
    expected = " or ".join(k.__name__ for k in kinds)
    raise DataFileError(path, line, f"field {key!r} should be {expected}, got {type(record[key]).__name__}")
  return record[key]
