"""SentencePiece tokenization with ALBERT's text preprocessing (google-research/albert `tokenization.py`).

`preprocess_text` collapses whitespace, maps `` and '' to ", applies NFKD and drops combining marks, and optionally
lower-cases; `encode_pieces` applies the XLNet digit-comma rule (`▁1999,` -> `▁1999` + `,`).
"""
from __future__ import annotations

import functools
import hashlib
import unicodedata

import sentencepiece as spm

from albert_jax import storage
from albert_jax.errors import InputError
from data_pipeline.pair_layout import BERT, PairLayout

SPIECE_UNDERLINE = "\u2581"


def preprocess_text(text: str, lower: bool = True) -> str:
  text = " ".join(text.strip().split())
  text = text.replace("``", '"').replace("''", '"')
  if not text.isascii():  # ASCII is NFKD-invariant and has no combining marks: skip the slow per-char pass.
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
  return text.lower() if lower else text


def _is_digit_comma(piece: str) -> bool:
  return len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()


class Tokenizer:
  """A SentencePiece model plus ALBERT's preprocessing. Ids: <pad> 0, <unk> 1, [CLS] 2, [SEP] 3, [MASK] 4."""

  kind = "sentencepiece"   # words start with "▁" (data_pipeline.masking)
  pair_layout: PairLayout = BERT   # [CLS] A [SEP] B [SEP]

  def __init__(self, model_path: str, do_lower_case: bool = True):
    self.model_path = str(model_path)
    self.files = [self.model_path]
    self.do_lower_case = do_lower_case
    self.sp = spm.SentencePieceProcessor()
    try:
      self._proto = storage.path(self.model_path).read_bytes()
    except FileNotFoundError:
      raise InputError(f"SentencePiece model {self.model_path!r} not found; pass the path of a .model file "
                       "(ALBERT's is spiece.model), or train one with `python -m data_pipeline.train_spm`.")
    try:
      self.sp.LoadFromSerializedProto(self._proto)
    except RuntimeError:
      raise InputError(f"{self.model_path} is not a SentencePiece model (it does not parse as one); pass the .model "
                       "file that spm_train writes (not the .vocab), e.g. ALBERT's spiece.model.") from None
    self.pad_id, self.unk_id = self.sp.PieceToId("<pad>"), self.sp.unk_id()
    self.cls_id, self.sep_id, self.mask_id = (self.sp.PieceToId(p) for p in ("[CLS]", "[SEP]", "[MASK]"))
    for piece, got in (("[CLS]", self.cls_id), ("[SEP]", self.sep_id), ("[MASK]", self.mask_id)):
      if got == self.unk_id:
        raise InputError(f"SentencePiece model {self.model_path!r} has no {piece} piece; train it with "
                         "control symbols [CLS],[SEP],[MASK] (see data_pipeline.train_spm).")
    # Ids whose piece needs the digit-comma split; `encode` takes the fast id path when none occurs.
    self._digit_comma_ids = frozenset(i for i in range(self.vocab_size) if _is_digit_comma(self.sp.IdToPiece(i)))

  @property
  def vocab_size(self) -> int:
    return self.sp.GetPieceSize()

  @functools.cached_property
  def sha256(self) -> str:
    return hashlib.sha256(self._proto).hexdigest()

  def encode_pieces(self, text: str) -> list[str]:
    """Pieces of already-preprocessed text, with the digit-comma split of the original."""
    pieces = self.sp.EncodeAsPieces(text)
    out: list[str] = []
    for piece in pieces:
      if _is_digit_comma(piece):
        sub = self.sp.EncodeAsPieces(piece[:-1].replace(SPIECE_UNDERLINE, ""))
        if piece[0] != SPIECE_UNDERLINE and sub and sub[0][0] == SPIECE_UNDERLINE:
          sub[0] = sub[0][1:] if len(sub[0]) > 1 else sub[0]
          if sub[0] == SPIECE_UNDERLINE:
            sub = sub[1:]
        out.extend(sub)
        out.append(piece[-1])
      else:
        out.append(piece)
    return out

  def tokenize(self, text: str) -> list[str]:
    return self.encode_pieces(preprocess_text(text, lower=self.do_lower_case))

  def encode(self, text: str) -> list[int]:
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    """Like `encode` on each text; one SentencePiece call for all of them (per-call overhead dominates short lines)."""
    texts = [preprocess_text(t, lower=self.do_lower_case) for t in texts]
    out = self.sp.Encode(texts)
    for i, ids in enumerate(out):
      if not self._digit_comma_ids.isdisjoint(ids):
        out[i] = [self.sp.PieceToId(p) for p in self.encode_pieces(texts[i])]
    return out

  def id_to_piece(self, i: int) -> str:
    return self.sp.IdToPiece(i)

  def check_vocab(self, model_vocab_size: int) -> None:
    """The model's embedding table must have exactly one row per piece."""
    if model_vocab_size != self.vocab_size:
      raise InputError(f"SentencePiece model {self.model_path!r} has {self.vocab_size} pieces but "
                       f"model.vocab_size={model_vocab_size}; set --config.model.vocab_size={self.vocab_size} or "
                       "use the tokenizer the model was trained with.")
