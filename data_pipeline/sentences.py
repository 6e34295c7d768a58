"""A rule-based English sentence splitter for raw paragraphs (inputs that are not one sentence per line).

SOP/NSP only need plausible sentence boundaries, so a regex with an abbreviation list is enough: a boundary is
`.`, `!` or `?` (plus closing quotes/brackets) followed by whitespace and an upper-case letter, digit or opening
quote, unless the word before the period is a known abbreviation ("Mr.", "e.g.") or a single initial ("J.").
"""
from __future__ import annotations

import re

_BOUNDARY = re.compile(r"[.!?]+[\"'\u2019\u201d)\]]*\s+(?=[\"'\u2018\u201c(\[]*[A-Z0-9])")
_LAST_WORD = re.compile(r"(\S+)$")
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr rev gen col capt lt sgt hon gov sen rep messrs mme mlle no vol ch fig pp "
    "vs etc e.g i.e cf al inc ltd co corp jan feb mar apr jun jul aug sep sept oct nov dec mt ft".split())


def split_sentences(paragraph: str) -> list[str]:
  """Sentences of one paragraph, whitespace-normalised; [] for a blank paragraph."""
  text = " ".join(paragraph.split())
  sentences, start = [], 0
  for match in _BOUNDARY.finditer(text):
    if match.group().startswith("."):
      word = _LAST_WORD.search(text, start, match.start())
      token = word.group(1).lower().lstrip("\"'(\u2018\u201c[") if word else ""
      if token in ABBREVIATIONS or (len(token) == 1 and token.isalpha()):
        continue
    sentences.append(text[start:match.end()].strip())
    start = match.end()
  if start < len(text):
    sentences.append(text[start:].strip())
  return [s for s in sentences if s]
