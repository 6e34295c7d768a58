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
Bytes that are not UTF-8 are replaced by U+FFFD (which tokenizes to <unk>) and counted per document. A document
longer than `max_document_units` lines/paragraphs is cut into several (counted), which bounds memory per document.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Iterator

FORMATS = ("lines", "paragraphs", "jsonl", "tfds")
MIN_DOCUMENT_PARAGRAPHS = 3


@dataclasses.dataclass
class RawDocument:
  """A document before tokenization: sentences, or paragraphs when `Source.splits_sentences`."""
  units: list[str]
  non_utf8_lines: int = 0
  cut: bool = False          # continues the previous document, cut at max_document_units
  unreadable: bool = False   # a JSONL line that is not an object with a string text field


@dataclasses.dataclass(frozen=True)
class Source:
  input: str                 # comma-separated files/globs, or tfds:NAME[/CONFIG][:SPLIT]
  format: str = "lines"
  text_field: str = "text"
  tfds_data_dir: str | None = None
  max_document_units: int = 10_000

  def __post_init__(self):
    fmt = "tfds" if self.input.startswith("tfds:") else self.format
    object.__setattr__(self, "format", fmt)
    if fmt not in FORMATS:
      raise ValueError(f"Unknown input format {self.format!r}; choose one of {FORMATS}.")

  @property
  def splits_sentences(self) -> bool:
    return self.format != "lines"

  def files(self) -> list[str]:
    """The input files in a fixed (sorted per pattern) order; an error if a pattern matches nothing."""
    files = []
    for pattern in filter(None, self.input.split(",")):
      matched = sorted(glob.glob(os.path.expanduser(pattern)))
      if not matched:
        raise FileNotFoundError(f"--input pattern {pattern!r} matches no file.")
      files.extend(m for m in matched if os.path.isfile(m))
    return files

  def documents(self) -> Iterator[RawDocument]:
    if self.format == "tfds":
      docs = _tfds_documents(self.input[len("tfds:"):], self.text_field, self.tfds_data_dir)
    else:
      read = {"lines": _line_documents, "paragraphs": _paragraph_documents, "jsonl": _jsonl_documents}[self.format]
      docs = (doc for path in self.files() for doc in read(path, self.text_field))
    for doc in docs:
      yield from _cut(doc, self.max_document_units)


def _cut(doc: RawDocument, limit: int) -> Iterator[RawDocument]:
  for start in range(0, max(len(doc.units), 1), limit):
    yield dataclasses.replace(doc, units=doc.units[start:start + limit], cut=start > 0,
                              non_utf8_lines=doc.non_utf8_lines if start == 0 else 0)


def _decoded_lines(path: str) -> Iterator[tuple[str, bool]]:
  """(line without its newline, whether it had invalid UTF-8), reading bytes so bad input cannot stop the run."""
  with open(path, "rb") as f:
    for raw in f:
      try:
        yield raw.decode("utf-8").rstrip("\r\n"), False
      except UnicodeDecodeError:
        yield raw.decode("utf-8", errors="replace").rstrip("\r\n"), True


def _line_documents(path: str, _: str) -> Iterator[RawDocument]:
  doc = RawDocument([])
  for line, bad in _decoded_lines(path):
    if not line.strip():
      if doc.units or doc.non_utf8_lines:
        yield doc
      doc = RawDocument([])
      continue
    doc.units.append(line)
    doc.non_utf8_lines += bad
  if doc.units or doc.non_utf8_lines:
    yield doc


def _paragraph_documents(path: str, _: str) -> Iterator[RawDocument]:
  doc, paragraph, blanks = RawDocument([]), [], 0
  for line, bad in _decoded_lines(path):
    doc.non_utf8_lines += bad
    if line.strip():
      if blanks >= 2 and len(doc.units) >= MIN_DOCUMENT_PARAGRAPHS:
        yield doc
        doc = RawDocument([])
      paragraph.append(line)
      blanks = 0
      continue
    if paragraph:
      doc.units.append(" ".join(paragraph))
      paragraph = []
    blanks += 1
  if paragraph:
    doc.units.append(" ".join(paragraph))
  if doc.units or doc.non_utf8_lines:
    yield doc


def _jsonl_documents(path: str, text_field: str) -> Iterator[RawDocument]:
  for line, bad in _decoded_lines(path):
    if not line.strip():
      continue
    try:
      text = json.loads(line)[text_field]
      if not isinstance(text, str):
        raise TypeError(text_field)
    except (ValueError, KeyError, TypeError, IndexError):
      yield RawDocument([], non_utf8_lines=int(bad), unreadable=True)
      continue
    yield RawDocument([p for p in text.split("\n") if p.strip()], non_utf8_lines=int(bad))


def _tfds_documents(spec: str, text_field: str, data_dir: str | None) -> Iterator[RawDocument]:
  import tensorflow_datasets as tfds
  name, _, split = spec.partition(":")
  try:
    source = tfds.data_source(name, split=split or "train", data_dir=data_dir)
  except Exception as e:  # tfds raises several types for "not prepared" / "wrong file format"
    raise ValueError(f"Cannot open TFDS dataset {name!r} split {split or 'train'!r} in data_dir={data_dir!r}: {e}. "
                     "It must be prepared in array_record format (reading needs no TensorFlow): "
                     f"`tfds build {name} --file_format=array_record`, or builder.download_and_prepare("
                     "file_format='array_record').") from e
  for i in range(len(source)):
    text = source[i][text_field]
    text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)
    yield RawDocument([p for p in text.split("\n") if p.strip()])
