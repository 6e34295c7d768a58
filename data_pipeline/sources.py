"""Streamed text sources: each yields documents one at a time, never the whole corpus.

Formats (`Source.format`):
  lines       BERT/ALBERT input: one sentence per line, a blank line between documents.
  paragraphs  raw text: lines are joined into paragraphs at blank lines, paragraphs are split into sentences
              (data_pipeline.sentences); two or more consecutive blank lines end a document (chapter breaks in
              Gutenberg books) once it has MIN_DOCUMENT_PARAGRAPHS paragraphs (so headings and title lines join
              the text after them rather than becoming one-sentence documents), as does the end of a file.
  jsonl       one JSON object per line; `text_field` holds a document, split into paragraphs at newlines and
              then into sentences. Lines that are not JSON objects with that string field are counted and skipped.
  tfds        a prepared TFDS dataset, `tfds:NAME[/CONFIG][:SPLIT]`, read with `tfds.data_source`, which needs no
              TensorFlow but does need the dataset prepared in array_record format.
Bytes that are not UTF-8 are replaced by U+FFFD (which tokenizes to <unk>) and counted per document; a NUL byte
means a binary file (a .gz, a PDF) and is refused by name, since tokenizing one only fills the shards with <unk>.
Memory per document is bounded while reading, not after: a line or paragraph longer than `max_unit_bytes` is cut
into pieces (at a space where there is one; counted), and a document is ended after `max_document_units`
lines/paragraphs (counted), so one huge line or a file without blank lines cannot take the whole corpus into memory.
A JSONL record longer than `max_unit_bytes` cannot be parsed in pieces and is counted as unreadable.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Iterator

from albert_jax import storage
from albert_jax.errors import InputError

FORMATS = ("lines", "paragraphs", "jsonl", "tfds")
MIN_DOCUMENT_PARAGRAPHS = 3


@dataclasses.dataclass
class RawDocument:
  """A document before tokenization: sentences, or paragraphs when `Source.splits_sentences`."""
  units: list[str]
  non_utf8_lines: int = 0
  cut: bool = False          # continues the previous document, cut at max_document_units
  unreadable: bool = False   # a JSONL line that is not an object with a string text field
  lines_cut: int = 0         # cuts inside lines/paragraphs longer than max_unit_bytes
  position: int = 0          # input read so far (bytes over all files, or TFDS records): progress and ETA


@dataclasses.dataclass(frozen=True)
class Source:
  input: str                 # comma-separated files/globs, or tfds:NAME[/CONFIG][:SPLIT]
  format: str = "lines"
  text_field: str = "text"
  tfds_data_dir: str | None = None
  max_document_units: int = 10_000
  max_unit_bytes: int = 1 << 20

  def __post_init__(self):
    if self.max_unit_bytes < 64 or self.max_document_units < 1:
      raise InputError(f"max_unit_bytes={self.max_unit_bytes} and max_document_units={self.max_document_units} must "
                       "be at least 64 and 1; raise --max_unit_bytes / --max_document_units.")
    fmt = "tfds" if self.input.startswith("tfds:") else self.format
    object.__setattr__(self, "format", fmt)
    if fmt not in FORMATS:
      raise InputError(f"Unknown input format {self.format!r}; choose one of {FORMATS}.")

  @property
  def splits_sentences(self) -> bool:
    return self.format != "lines"

  def files(self, prog: str | None = None) -> list[str]:
    """The input files in a fixed (sorted per pattern) order, each once: a file that several paths or overlapping
    globs name (compared by real path; gs:// URLs as written) is read at its first place only, since a second
    copy of its documents would be trained on twice and leak into the held-out split. An error if a pattern matches
    no file (a directory is no input file: its files are not read). `prog`: the command, which says on stderr how
    many repeats were dropped. For a TFDS source, the prepared dataset's files (so a rebuilt dataset is told apart
    from the one already prepared)."""
    if self.format == "tfds":
      return storage.glob(os.path.join(_tfds_builder(self.input[len("tfds:"):], self.tfds_data_dir).data_dir, "*"))
    matches = []
    for pattern in filter(None, self.input.split(",")):
      matched = storage.glob(pattern)
      found = [m for m in matched if storage.path(m).is_file()]
      if matched and not found:
        what = "is a directory" if matched == [pattern] else f"matches only directories ({', '.join(matched[:3])})"
        raise InputError(f"--input {pattern!r} {what}; name the files in it, e.g. "
                         f"--input='{matched[0].rstrip('/')}/*.txt'.")
      if not found:
        raise InputError(f"--input pattern {pattern!r} matches no file.")
      matches.extend(found)
    first = {}
    for m in matches:
      first.setdefault(m if storage.is_remote(m) else os.path.realpath(m), m)
    files = list(first.values())
    if prog and len(files) < len(matches):
      print(f"{prog}: dropped {len(matches) - len(files)} repeated --input file(s), named by more than one path or "
            "glob; each file is read once.", file=sys.stderr, flush=True)
    return files

  def total(self) -> tuple[int, str]:
    """How much input there is, in the unit of `RawDocument.position`: (bytes, "bytes") or (records, "records")."""
    if self.format == "tfds":
      return len(_tfds_source(self.input[len("tfds:"):], self.tfds_data_dir)), "records"
    return sum(storage.size_and_mtime_ns(f)[0] for f in self.files()), "bytes"

  def documents(self) -> Iterator[RawDocument]:
    if self.format == "tfds":
      source = _tfds_source(self.input[len("tfds:"):], self.tfds_data_dir)
      for i in range(len(source)):
        for doc in _text_documents(_record_text(source[i], self.text_field),
                                   _Collector(self.max_document_units, self.max_unit_bytes)):
          doc.position = i + 1
          yield doc
      return
    read = {"lines": _line_documents, "paragraphs": _paragraph_documents, "jsonl": _jsonl_documents}[self.format]
    done = 0
    for path in self.files():
      with storage.open_read(path) as f:
        docs = _Collector(self.max_document_units, self.max_unit_bytes)
        for doc in read(_decoded_lines(f, path, self.max_unit_bytes), self.text_field, docs):
          doc.position = done + f.tell()
          yield doc
        done += f.tell()


class _Collector:
  """Builds documents unit by unit and ends one at `max_units` units, so a document never grows past the limit."""

  def __init__(self, max_units: int, max_bytes: int):
    self.max_units, self.max_bytes, self.doc = max_units, max_bytes, RawDocument([])

  def add(self, unit: str) -> RawDocument | None:
    """Appends a unit; returns the document when it is full (the next one continues it, marked `cut`)."""
    self.doc.units.append(unit)
    if len(self.doc.units) < self.max_units:
      return None
    full, self.doc = self.doc, RawDocument([], cut=True)
    return full

  def end(self) -> RawDocument | None:
    """Ends the document at a boundary; returns it unless it holds nothing."""
    full, self.doc = self.doc, RawDocument([])
    return full if full.units or full.non_utf8_lines else None


def absolute_input(spec: str) -> str:
  """`--input` with each local file or glob made absolute (URLs and tfds: names as they are), so the same files
  named from another directory are the same input."""
  if spec.startswith("tfds:"):
    return spec
  return ",".join(storage.absolute(os.path.expanduser(p)) for p in filter(None, spec.split(",")))


def binary_file_error(path: str, offset: int) -> InputError:
  return InputError(f"--input file {path} is binary (a NUL byte at offset {offset}); pass text files "
                    "(decompress .gz/.bz2/.zst first) or remove it from --input.")


def _char_boundary(raw: bytes) -> int:
  """The end of the last whole UTF-8 character in `raw` (len(raw) unless it ends inside one)."""
  start = len(raw) - 1
  while start > len(raw) - 4 and raw[start] & 0xC0 == 0x80:
    start -= 1
  lead = raw[start]
  size = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
  return start if start + size > len(raw) else len(raw)


def raw_pieces(f, limit: int) -> Iterator[tuple[bytes, bool]]:
  """(bytes, whether the line goes on): lines, a line longer than `limit` in pieces cut after its last space
  (or, with none, at a UTF-8 character boundary), so no more than `limit` bytes are held at once."""
  while raw := f.readline(limit):
    if raw.endswith(b"\n") or len(raw) < limit:
      yield raw, False
      continue
    cut = raw.rfind(b" ") + 1 or _char_boundary(raw)
    f.seek(cut - len(raw), os.SEEK_CUR)
    yield raw[:cut], True


def _decoded_lines(f, path: str, limit: int) -> Iterator[tuple[str, bool, bool]]:
  """(text without its newline, whether it had invalid UTF-8, whether the line goes on in the next piece),
  reading bytes from the open file `f` so bad input cannot stop the run; refuses a binary file by name."""
  offset = 0
  for raw, goes_on in raw_pieces(f, limit):
    if b"\0" in raw:
      raise binary_file_error(path, offset + raw.index(b"\0"))
    offset += len(raw)
    try:
      yield raw.decode("utf-8").rstrip("\r\n"), False, goes_on
    except UnicodeDecodeError:
      yield raw.decode("utf-8", errors="replace").rstrip("\r\n"), True, goes_on


def _line_documents(lines, _: str, docs: _Collector) -> Iterator[RawDocument]:
  continued = False   # this piece continues a cut line, so a blank piece is no document boundary
  for line, bad, goes_on in lines:
    if not continued and not goes_on and not line.strip():
      if doc := docs.end():
        yield doc
      continue
    docs.doc.non_utf8_lines += bad
    docs.doc.lines_cut += goes_on
    if doc := docs.add(line):
      yield doc
    continued = goes_on
  if doc := docs.end():
    yield doc


def _paragraph_documents(lines, _: str, docs: _Collector) -> Iterator[RawDocument]:
  paragraph, size, blanks, continued = [], 0, 0, False
  for line, bad, goes_on in lines:
    docs.doc.non_utf8_lines += bad
    blank = not (continued or goes_on or line.strip())
    continued = goes_on
    if blank:
      blanks += 1
      if not paragraph:
        continue
    else:
      if blanks >= 2 and len(docs.doc.units) >= MIN_DOCUMENT_PARAGRAPHS and (doc := docs.end()):
        yield doc
      paragraph.append(line)
      size, blanks = size + len(line), 0
      if size < docs.max_bytes:
        continue
      docs.doc.lines_cut += 1   # a paragraph as long as a cut line is cut too
    if doc := docs.add(" ".join(paragraph)):
      yield doc
    paragraph, size = [], 0
  if paragraph and (doc := docs.add(" ".join(paragraph))):
    yield doc
  if doc := docs.end():
    yield doc


def _text_documents(text: str, docs: _Collector, bad: bool = False) -> Iterator[RawDocument]:
  """A JSONL/TFDS text: one document of its non-blank lines as paragraphs (cut at `max_units`); an empty text is
  an empty document, so that it is counted as skipped."""
  docs.doc.non_utf8_lines += bad
  empty = True
  for paragraph in text.split("\n"):
    if paragraph.strip():
      empty = False
      if doc := docs.add(paragraph):
        yield doc
  doc = docs.end()
  if doc or empty:
    yield doc or RawDocument([])


def _jsonl_documents(lines, text_field: str, docs: _Collector) -> Iterator[RawDocument]:
  skipping = False   # inside a record longer than max_unit_bytes: it cannot be parsed, so it is unreadable
  for line, bad, goes_on in lines:
    if skipping or goes_on:
      if not skipping:
        yield RawDocument([], non_utf8_lines=int(bad), unreadable=True)
      skipping = goes_on
      continue
    if not line.strip():
      continue
    try:
      text = json.loads(line)[text_field]
      if not isinstance(text, str):
        raise TypeError(text_field)
    except (ValueError, KeyError, TypeError, IndexError):
      yield RawDocument([], non_utf8_lines=int(bad), unreadable=True)
      continue
    yield from _text_documents(text, docs, bad)


def _tfds_builder(spec: str, data_dir: str | None):
  import tensorflow_datasets as tfds
  name, _, _ = spec.partition(":")
  try:
    return tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # tfds raises several types for an unknown or unreadable dataset
    raise InputError(_tfds_error(spec, data_dir, e)) from e


def _tfds_source(spec: str, data_dir: str | None):
  import tensorflow_datasets as tfds
  name, _, split = spec.partition(":")
  try:
    return tfds.data_source(name, split=split or "train", data_dir=data_dir)
  except Exception as e:  # tfds raises several types for "not prepared" / "wrong file format"
    raise InputError(_tfds_error(spec, data_dir, e)) from e


def _tfds_error(spec: str, data_dir: str | None, e: Exception) -> str:
  name, _, split = spec.partition(":")
  return (f"Cannot open TFDS dataset {name!r} split {split or 'train'!r} in data_dir={data_dir!r}: {e}. "
          "It must be prepared in array_record format (reading needs no TensorFlow): "
          f"`tfds build {name} --file_format=array_record`, or builder.download_and_prepare("
          "file_format='array_record').")


def _record_text(record: dict, text_field: str) -> str:
  text = record[text_field]
  return text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)
