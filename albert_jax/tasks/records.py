"""Line-numbered readers for the text formats the tasks take (GLUE TSV, user TSV/JSONL), so that every error
can point at the file and line that caused it."""
from __future__ import annotations

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
  """A user's prediction input: JSON lines (`.jsonl`/`.json`) or a TSV whose header names the fields."""
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


def field(record: dict[str, Any], key: str, path: str, line: int, kind=str):
  if key not in record:
    raise InputError(path, line, f"missing field {key!r} (have {sorted(record)})")
  if not isinstance(record[key], kind):
    raise InputError(path, line, f"field {key!r} should be {kind.__name__}, got {type(record[key]).__name__}")
  return record[key]
