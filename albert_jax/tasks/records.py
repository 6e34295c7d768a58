"""Line-numbered readers for the text formats the tasks take (GLUE TSV, user TSV/JSONL), so that every error
can point at the file and line that caused it."""
from __future__ import annotations

import csv
import io
import json
from typing import Any, Iterator

from albert_jax.tasks.base import InputError, read_text


def tsv_rows(path: str) -> Iterator[tuple[int, list[str]]]:
  """(1-based line number, fields) for every non-blank line. Tabs only, no quoting: GLUE's sentences contain
  bare quotes, and the original reads them with `csv.reader(delimiter="\\t", quotechar=None)`."""
  for number, line in enumerate(read_text(path).split("\n"), start=1):
    line = line.rstrip("\r")
    if line.strip():
      yield number, line.split("\t")


def column(fields: list[str], index: int, path: str, line: int) -> str:
  if index >= len(fields) or -index > len(fields):
    raise InputError(path, line, f"expected a column {index} but the line has {len(fields)} tab-separated "
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
          record = json.loads(line)
        except json.JSONDecodeError as e:
          raise InputError(path, number, f"not a JSON object ({e.msg})") from None
        if not isinstance(record, dict):
          raise InputError(path, number, "expected one JSON object per line")
        yield number, record
    return
  rows = tsv_rows(path)
  header_line, header = next(rows, (1, []))
  for number, fields in rows:
    if len(fields) != len(header):
      raise InputError(path, number, f"{len(fields)} field(s) but the header (line {header_line}) has "
                                     f"{len(header)}: {header}")
    yield number, dict(zip(header, fields))


def csv_records(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
  reader = csv.reader(io.StringIO(read_text(path), newline=""))
  try:
    header = next(reader, [])
    for fields in reader:
      if not any(f.strip() for f in fields):
        continue
      if len(fields) != len(header):
        raise InputError(path, reader.line_num, f"{len(fields)} comma-separated field(s) but the header has "
                                                f"{len(header)}: {header}; quote fields that contain commas.")
      yield reader.line_num, dict(zip(header, fields))
  except csv.Error as e:
    raise InputError(path, reader.line_num, f"not a CSV row ({e})") from None


def read_id_map(path: str, what: str, valid) -> dict[str, Any]:
  """A predictions file that is one JSON object {id: value}, each value passing `valid`; refuses anything else by
  name: another JSON type, no ids, a bad value, and an id given twice with different values (json.loads would
  silently keep the last)."""
  def unique(pairs):
    out = {}
    for key, value in pairs:
      if key in out and out[key] != value:
        raise InputError(path, f"id {key}", f"given twice, as {out[key]!r} and {value!r}; keep one.")
      out[key] = value
    return out
  try:
    values = json.loads(read_text(path), object_pairs_hook=unique)
  except json.JSONDecodeError as e:
    raise InputError(path, e.lineno, f"not JSON ({e.msg}); pass the file write_predictions wrote.") from None
  if not isinstance(values, dict) or not values:
    found = "an empty object" if isinstance(values, dict) else f"a JSON {type(values).__name__}"
    raise InputError(path, None, f"{found}, expected an object {{id: {what}}}; pass the file write_predictions wrote.")
  for key, value in values.items():
    if not valid(value):
      raise InputError(path, f"id {key}", f"{value!r} is not {what}; is this the predictions file of this task?")
  return values


def check_ids(path: str, predicted, split) -> None:
  """Refuses predictions for ids that the gold file lacks: they would be ignored, hiding a mix-up of files."""
  extra = [key for key in predicted if key not in {ex.qid for ex in split.examples}]
  if extra:
    raise InputError(path, None, f"{len(extra)} id(s) are not in {split.path}, e.g. {extra[0]}; score against the "
                                 "gold file these predictions are for.")


def field(record: dict[str, Any], key: str, path: str, line: int, kind=str):
  if key not in record:
    raise InputError(path, line, f"missing field {key!r} (have {sorted(record)})")
  kinds = kind if isinstance(kind, tuple) else (kind,)
  if not isinstance(record[key], kind) or isinstance(record[key], bool) and bool not in kinds:  # True is an int
    expected = " or ".join(k.__name__ for k in kinds)
    raise InputError(path, line, f"field {key!r} should be {expected}, got {type(record[key]).__name__}")
  return record[key]
