"""Tokenizers kept in the `tokenizers` library's files: byte-level BPE (RoBERTa's / GPT-2's `vocab.json` with the
`merges.txt` beside it) and any `tokenizer.json` (what transformers' fast tokenizers save).

`vocab.json` + `merges.txt` get RoBERTa's pipeline, as transformers' RobertaTokenizerFast builds it from the same
files: byte-level pre-tokenization without a prefix space (a word after a space starts with "Ġ"), BPE merges, no
normalisation (case kept). A `tokenizer.json` is read as it is: its own normaliser, pre-tokenizer and model.
`JsonTokenizer` has the interface of `tokenization.Tokenizer` (the ids of the special tokens, `encode`,
`encode_batch`, `check_vocab`, `sha256`), with the special tokens of either convention ([CLS]/[SEP]/[MASK] or
<s>/</s>/<mask>), the tokenizer's `kind` ("bpe", "wordpiece" or "unigram"), which says how words start, and its
`pair_layout`: RoBERTa's where its special tokens are RoBERTa's.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors

from albert_jax import storage
from albert_jax.errors import InputError
from data_pipeline import pair_layout

BPE_VOCAB, BPE_MERGES, TOKENIZER_JSON = "vocab.json", "merges.txt", "tokenizer.json"
# Each special token's name in the two conventions: BERT's (WordPiece, SentencePiece) and RoBERTa's (byte-level BPE).
SPECIAL_TOKENS = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]", "<s>"),
                  "sep": ("[SEP]", "</s>"), "mask": ("[MASK]", "<mask>")}
CONVENTION_LAYOUTS = (pair_layout.BERT, pair_layout.ROBERTA)   # the pair layout of each convention
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]   # ids 0-4 of a trained BPE (RoBERTa's first four)
_KINDS = {"BPE": "bpe", "WordPiece": "wordpiece", "Unigram": "unigram"}


def is_json_tokenizer(path: str) -> bool:
  """Whether a tokenizer file is one `JsonTokenizer` reads: a `.json` (a BPE `vocab.json` or a `tokenizer.json`)."""
  return str(path).endswith(".json")


def files_of(path: str) -> list[str]:
  """The files a tokenizer is read from: a BPE `...vocab.json` and the `merges.txt` beside it, else the file alone
  (a `tokenizer.json`)."""
  return [path, os.path.join(os.path.dirname(path), BPE_MERGES)] if str(path).endswith(BPE_VOCAB) else [path]


def byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> tokenizers.Tokenizer:
  """RoBERTa's pipeline over a vocabulary and its merges (module docstring)."""
  hf = tokenizers.Tokenizer(models.BPE(vocab, merges))
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  hf.decoder = decoders.ByteLevel()
  # <mask> takes the space before it, as RoBERTa's does: "a <mask>" stands for a word "Ġx", not a lone space.
  hf.add_special_tokens([tokenizers.AddedToken(token, special=True, lstrip=token == "<mask>")
                         for token in ROBERTA_SPECIALS if token in vocab])
  if "<s>" in vocab and "</s>" in vocab:
    hf.post_processor = processors.RobertaProcessing(("</s>", vocab["</s>"]), ("<s>", vocab["<s>"]),
                                                     add_prefix_space=False)
  return hf


def _lowercases(normalizer: dict | None) -> bool:
  """Whether a saved normaliser lower-cases: a Lowercase step, or BERT's with lowercase set, alone or in a Sequence."""
  if not normalizer:
    return False
  if normalizer["type"] == "Sequence":
    return any(map(_lowercases, normalizer["normalizers"]))
  return normalizer["type"] == "Lowercase" or (normalizer["type"] == "BertNormalizer" and normalizer["lowercase"])


def _read(path: str) -> bytes:
  try:
    return storage.path(path).read_bytes()
  except FileNotFoundError:
    raise InputError(f"Tokenizer file {path!r} not found; pass a tokenizer.json, or a BPE vocab.json with its "
                     "merges.txt beside it (train one with `python -m data_pipeline.train_spm --model_type=bpe`)."
                     ) from None


class LibraryTokenizer:
  """The encoding methods of a tokenizer the `tokenizers` library runs (`self.hf`), special tokens left out."""

  hf: tokenizers.Tokenizer

  def tokenize(self, text: str) -> list[str]:
    return self.hf.encode(text, add_special_tokens=False).tokens

  def encode(self, text: str) -> list[int]:
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    return [encoding.ids for encoding in self.hf.encode_batch(texts, add_special_tokens=False)]

  def encode_with_offsets(self, text: str) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(ids, each piece's [start, end) character span in `text`): what SQuAD's answer alignment needs."""
    encoding = self.hf.encode(text, add_special_tokens=False)
    spans = np.asarray(encoding.offsets, np.int64).reshape(-1, 2)
    return encoding.ids, spans[:, 0], spans[:, 1]

  def decode(self, ids: list[int]) -> str:
    return self.hf.decode(ids)


class JsonTokenizer(LibraryTokenizer):
  """A tokenizer.json, or byte-level BPE files (module docstring). `do_lower_case` is read from the file: its
  normaliser decides the case."""

  def __init__(self, path: str):
    self.model_path = str(path)
    self.files = files_of(self.model_path)
    self._bytes = [_read(f) for f in self.files]
    try:
      if len(self.files) == 2:
        merges = [tuple(line.split(" ")) for line in self._bytes[1].decode().splitlines()
                  if line and not line.startswith("#version")]
        self.hf = byte_level_bpe(json.loads(self._bytes[0]), merges)
      else:
        self.hf = tokenizers.Tokenizer.from_str(self._bytes[0].decode())
    except Exception as e:   # json's ValueError, or the library's bare Exception on a malformed file
      said = (str(e).splitlines() or [type(e).__name__])[0][:120]
      raise InputError(f"{self.model_path} is not a tokenizer file ({said}); pass a "
                       "tokenizer.json, or a BPE vocab.json with its merges.txt beside it.") from None
    saved = json.loads(self.hf.to_str())
    self.kind = _KINDS.get(saved["model"]["type"], "")
    if not self.kind or (self.kind == "bpe" and "ByteLevel" not in json.dumps(saved["pre_tokenizer"])):
      raise InputError(f"{self.model_path} holds a tokenizer of a kind not read here (whole-word masking needs its "
                       "word marker); pass a byte-level BPE, a WordPiece or a Unigram tokenizer.json.")
    for name, choices in SPECIAL_TOKENS.items():
      found = next((i for i in map(self.hf.token_to_id, choices) if i is not None), None)
      if found is None:
        raise InputError(f"Tokenizer {self.model_path} has no {choices[0]} (or {choices[1]}) token; pass one with "
                         "the special tokens of BERT ([PAD] [UNK] [CLS] [SEP] [MASK]) or RoBERTa (<pad> <unk> <s> "
                         "</s> <mask>).")
      setattr(self, f"{name}_id", found)
    self.pair_layout = CONVENTION_LAYOUTS[self.id_to_piece(self.cls_id) == SPECIAL_TOKENS["cls"][1]]
    self.do_lower_case = _lowercases(saved["normalizer"])

  @property
  def vocab_size(self) -> int:
    return self.hf.get_vocab_size(with_added_tokens=True)

  @functools.cached_property
  def sha256(self) -> str:
    """The file's sha256; of a vocab.json and its merges.txt, the sha256 of their two sha256s."""
    hashes = [hashlib.sha256(b).hexdigest() for b in self._bytes]
    return hashes[0] if len(hashes) == 1 else hashlib.sha256(" ".join(hashes).encode()).hexdigest()

  def id_to_piece(self, i: int) -> str:
    return self.hf.id_to_token(i) or ""

  def check_vocab(self, model_vocab_size: int) -> None:
    """The model's embedding table must have exactly one row per token."""
    if model_vocab_size != self.vocab_size:
      raise InputError(f"Tokenizer {self.model_path!r} has {self.vocab_size} tokens but "
                       f"model.vocab_size={model_vocab_size}; set --config.model.vocab_size={self.vocab_size} or "
                       "use the tokenizer the model was trained with.")
