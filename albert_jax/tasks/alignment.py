"""Exact character spans of SentencePiece tokens in the ORIGINAL text (what SQuAD needs to turn token spans
back into answer strings).

The original (google-research/albert `squad_utils.py`, from XLNet) aligns the preprocessed text and the
pieces with a character-level edit-distance DP. Here the preprocessing itself carries offsets instead: each
character of `preprocess_text(text)` remembers the span of `text` it came from (whitespace collapsing, `` and ''
-> ", NFKD, dropped accents, lower-casing), and the pieces are matched to that string character by character
(SentencePiece only drops a few invisible characters such as U+200B/U+FEFF; any such difference is bridged with
difflib's matching blocks). So a token's span is exact, not estimated.
"""
from __future__ import annotations

import dataclasses
import difflib
import unicodedata

import numpy as np

from data_pipeline.tokenization import SPIECE_UNDERLINE, Tokenizer
from data_pipeline.wordpiece import WordPieceTokenizer


def normalize_with_offsets(text: str, lower: bool = True) -> tuple[str, list[tuple[int, int]]]:
  """`preprocess_text(text, lower)` and, for each of its characters, the [start, end) span in `text`."""
  chars: list[tuple[str, int, int]] = []
  space = False
  for i, ch in enumerate(text):  # strip + collapse whitespace runs, as " ".join(text.split())
    if ch.isspace():
      space = bool(chars)
      continue
    if space:
      chars.append((" ", i, i))
      space = False
    chars.append((ch, i, i + 1))
  for pair in ("``", "''"):  # both become '"', left to right without overlap, as str.replace
    merged, k = [], 0
    while k < len(chars):
      if k + 1 < len(chars) and chars[k][0] + chars[k + 1][0] == pair:
        merged.append(('"', chars[k][1], chars[k + 1][2]))
        k += 2
      else:
        merged.append(chars[k])
        k += 1
    chars = merged
  # NFKD never reorders starters, and the combining marks it may reorder are dropped: per character is exact.
  chars = [(d, s, e) for ch, s, e in chars for d in unicodedata.normalize("NFKD", ch) if not unicodedata.combining(d)]
  if lower:
    whole = "".join(c for c, _, _ in chars).lower()  # whole-string rules (final sigma) when lengths allow
    if len(whole) == len(chars):
      chars = [(low, s, e) for low, (_, s, e) in zip(whole, chars)]
    else:
      chars = [(low, s, e) for c, s, e in chars for low in c.lower()]
  return "".join(c for c, _, _ in chars), [(s, e) for _, s, e in chars]


@dataclasses.dataclass
class AlignedText:
  """Token ids of a text and each token's [start, end) character span in the original text. A token with no
  visible character (a lone "▁") gets the empty span at the next token's start."""
  ids: list[int]
  start: np.ndarray
  end: np.ndarray

  def token_span(self, char_start: int, char_end: int) -> tuple[int, int]:
    """First and last token overlapping the characters [char_start, char_end)."""
    first = int(np.searchsorted(self.end, char_start, side="right"))
    last = int(np.searchsorted(self.start, char_end, side="left")) - 1
    return first, last


def align(tokenizer: Tokenizer | WordPieceTokenizer, text: str) -> AlignedText:
  if not isinstance(tokenizer, Tokenizer):  # WordPiece, BPE, tokenizer.json: the tokenizers library keeps the spans
    return AlignedText(*tokenizer.encode_with_offsets(text))
  normalized, spans = normalize_with_offsets(text, tokenizer.do_lower_case)
  pieces = tokenizer.encode_pieces(normalized)
  bare = [p.replace(SPIECE_UNDERLINE, "") for p in pieces]
  visible = [i for i, ch in enumerate(normalized) if ch != " "]
  source = _match(("".join(bare)), "".join(normalized[i] for i in visible))
  start, end = np.empty(len(pieces), np.int64), np.empty(len(pieces), np.int64)
  position = 0
  for k, piece in enumerate(bare):
    hits = [spans[visible[j]] for j in source[position:position + len(piece)] if j >= 0]
    position += len(piece)
    start[k], end[k] = (hits[0][0], hits[-1][1]) if hits else (-1, -1)
  following = len(text)
  for k in reversed(range(len(pieces))):  # empty spans sit at the next token's start
    if start[k] < 0:
      start[k] = end[k] = following
    following = start[k]
  return AlignedText([tokenizer.sp.PieceToId(p) for p in pieces], start, end)


def _match(piece_chars: str, text_chars: str) -> list[int]:
  """For each character of the pieces, its index in the text (-1 where SentencePiece changed the text)."""
  if piece_chars == text_chars:
    return list(range(len(piece_chars)))
  source = [-1] * len(piece_chars)
  for block in difflib.SequenceMatcher(None, piece_chars, text_chars, autojunk=False).get_matching_blocks():
    source[block.a:block.a + block.size] = range(block.b, block.b + block.size)
  return source
