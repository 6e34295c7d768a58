"""Line-numbered readers for the text formats the tasks take (GLUE TSV, user TSV/JSONL), so that every error
can point at the file and line that caused it."""
from __future__ import annotations

import csv
import functools
import io
import json
from typing import Any, Iterator

from albert_jax.tasks.base import DataFileError, read_text


def tsv_rows(path: str) -> Iterator[tuple[int, list[str]]]:
  """(1-based line number, fields) for every non-blank line. Tabs only, no quoting: GLUE's sentences contain
  bare quotes, and the original reads them with `csv.reader(delimiter="\\t", quotechar=None)`."""
  for number, line in enumerate(read_text(path).split("\n"), start=1):
    line = line.rstrip("\r")
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
    for number, line in enumerate(read_text(path).split("\n"), start=1):
      if line.strip():
        try:
          record = json.loads(line, object_pairs_hook=functools.partial(_unique_keys, path, number))
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


def csv_records(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
  reader = csv.reader(io.StringIO(read_text(path), newline=""))
  try:
    header = next(reader, [])
    check_header(header, path, reader.line_num)
    for fields in reader:
      if not any(f.strip() for f in fields):
        continue
      if len(fields) != len(header):
        raise DataFileError(path, reader.line_num, f"{len(fields)} comma-separated field(s) but the header has "
                                                f"{len(header)}: {header}; quote fields that contain commas.")
      yield reader.line_num, dict(zip(header, fields))
  except csv.Error as e:
    raise DataFileError(path, reader.line_num, f"not a CSV row ({e})") from None


def read_id_map(path: str, what: str, valid) -> dict[str, Any]:
  """A predictions file that is one JSON object {id: value}, each value passing `valid`; refuses anything else by
  name: another JSON type, no ids, a bad value, and an id given twice with different values (json.loads would
  silently keep the last)."""
  def unique(pairs):
    out = {}
    for key, value in pairs:
      if key in out and out[key] != value:
        raise DataFileError(path, f"id {key}", f"given twice, as {out[key]!r} and {value!r}; keep one.")
      out[key] = value
    return out
  try:
    values = json.loads(read_text(path), object_pairs_hook=unique)
  except json.JSONDecodeError as e:
    raise DataFileError(path, e.lineno, f"not JSON ({e.msg}); pass the file write_predictions wrote.") from None
  if not isinstance(values, dict) or not values:
    found = "an empty object" if isinstance(values, dict) else f"a JSON {type(values).__name__}"
    raise DataFileError(path, None, f"{found}, expected an object {{id: {what}}}; pass the file write_predictions wrote.")
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
  """The ids of one file's examples, each once: predictions are keyed by id, so a repeat would overwrite the other
  example's prediction (and a line without id takes its row number, which may be another line's id)."""

  def __init__(self, path: str, fix: str = "give every example its own id"):
    self.path, self.fix = path, fix
    self.first: dict[str, tuple[int, bool]] = {}

  def add(self, key: str, line: int, given: bool = True) -> str:
    if key in self.first:
      first_line, first_given = self.first[key]
      raise DataFileError(self.path, line, f"id {key!r}{_row_number(given)} is also the id of line {first_line}"
                                        f"{_row_number(first_given)}; {self.fix}.")
    self.first[key] = (line, given)
    return key


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
