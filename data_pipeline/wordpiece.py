"""BERT's WordPiece tokenization over a `vocab.txt`, the tokenizer of the released ELECTRA (and BERT) folders.

The `tokenizers` library's BERT pipeline does the work: BERT's normalizer (control characters dropped, CJK characters
split out; when uncased, lower-casing and accents stripped), its pre-tokenizer (whitespace and punctuation), then
greedy longest-match-first pieces with the `##` continuation prefix, `[UNK]` for a word of no pieces. It is the
pipeline transformers' BertTokenizerFast and ElectraTokenizerFast build from the same file, so the ids are those the
released models were trained with. `WordPieceTokenizer` has the interface of `tokenization.Tokenizer` that
fine-tuning uses (the ids of [CLS], [SEP], [PAD], [UNK], [MASK], `encode`, `encode_batch`, `check_vocab`).
"""
from __future__ import annotations

import functools
import hashlib
import os

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from albert_jax import storage
from albert_jax.errors import InputError
from data_pipeline import records
from data_pipeline.pair_layout import BERT, PairLayout
from data_pipeline.tokenization import Tokenizer
from data_pipeline.tokenizer_json import BPE_VOCAB, TOKENIZER_JSON, JsonTokenizer, LibraryTokenizer, is_json_tokenizer

VOCAB_FILE = "vocab.txt"
# The files a Hugging Face folder keeps its tokenizer in, the one read first where it has several: SentencePiece's
# model (ALBERT's exact pipeline), WordPiece's vocab.txt, a tokenizer.json (what transformers 5 saves alone), a
# byte-level BPE vocab.json (with its merges.txt).
FOLDER_TOKENIZER_FILES = (records.SPM_MODEL, VOCAB_FILE, TOKENIZER_JSON, BPE_VOCAB)
SPECIAL_TOKENS = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                  "mask_token": "[MASK]"}


def is_wordpiece_vocab(path: str) -> bool:
  """Whether a tokenizer file is a WordPiece vocabulary (a `.txt`, one piece a line), not a SentencePiece model."""
  return str(path).endswith(".txt")


class WordPieceTokenizer(LibraryTokenizer):
  """A WordPiece vocabulary (one piece a line, its line number its id) and BERT's pipeline (module docstring)."""

  kind = "wordpiece"   # a word's later pieces start with "##" (data_pipeline.masking)
  pair_layout: PairLayout = BERT   # [CLS] A [SEP] B [SEP]

  def __init__(self, vocab_path: str, do_lower_case: bool = True):
    self.model_path = str(vocab_path)
    self.files = [self.model_path]
    self.do_lower_case = do_lower_case
    try:
      self._bytes = storage.path(self.model_path).read_bytes()
    except FileNotFoundError:
      raise InputError(f"WordPiece vocabulary {self.model_path!r} not found; pass the vocab.txt of the model's "
                       "folder.") from None
    try:
      pieces = self._bytes.decode("utf-8").split("\n")
    except UnicodeDecodeError:
      raise InputError(f"{self.model_path} is not a WordPiece vocabulary (not UTF-8 text); pass the vocab.txt of "
                       "the model's folder.") from None
    if pieces and pieces[-1] == "":  # the newline that ends the last line
      pieces.pop()
    vocab = {piece.rstrip(): i for i, piece in enumerate(pieces)}  # as transformers reads it: a repeat, its last id
    if missing := [token for token in SPECIAL_TOKENS.values() if token not in vocab]:
      raise InputError(f"WordPiece vocabulary {self.model_path} has no {', '.join(missing)}; pass a BERT-style "
                       "vocab.txt (with [PAD], [UNK], [CLS], [SEP] and [MASK]).")
    self._size = len(pieces)
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        vocab[SPECIAL_TOKENS[name]] for name in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"))
    self.hf = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    self.hf.normalizer = normalizers.BertNormalizer(lowercase=do_lower_case)  # accents go with the case
    self.hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    self.hf.decoder = decoders.WordPiece()
    self.hf.add_special_tokens([tokenizers.AddedToken(token, special=True) for token in SPECIAL_TOKENS.values()])
    self.hf.post_processor = processors.BertProcessing(("[SEP]", self.sep_id), ("[CLS]", self.cls_id))
    self._pieces = {i: piece for piece, i in vocab.items()}

  @property
  def vocab_size(self) -> int:
    return self._size

  @functools.cached_property
  def sha256(self) -> str:
    return hashlib.sha256(self._bytes).hexdigest()

  def id_to_piece(self, i: int) -> str:
    return self._pieces.get(i, "")

  def check_vocab(self, model_vocab_size: int) -> None:
    """The model's embedding table must have exactly one row per line of the vocabulary."""
    if model_vocab_size != self.vocab_size:
      raise InputError(f"WordPiece vocabulary {self.model_path!r} has {self.vocab_size} pieces but "
                       f"model.vocab_size={model_vocab_size}; set --config.model.vocab_size={self.vocab_size} or "
                       "use the tokenizer the model was trained with.")


def folder_tokenizer_file(folder: str) -> str | None:
  """The name of the file `folder` keeps its tokenizer in (`FOLDER_TOKENIZER_FILES`), None where it has none."""
  return next((name for name in FOLDER_TOKENIZER_FILES if storage.path(os.path.join(folder, name)).is_file()), None)


def load_tokenizer(path: str, do_lower_case: bool = True):
  """The tokenizer a file holds: a WordPiece vocabulary (`is_wordpiece_vocab`), a tokenizer.json or byte-level BPE
  vocab.json (`tokenizer_json.is_json_tokenizer`: their own normalisation, whatever `do_lower_case` says), or a
  SentencePiece model."""
  if is_wordpiece_vocab(path):
    return WordPieceTokenizer(path, do_lower_case)
  if is_json_tokenizer(path):
    return JsonTokenizer(path)
  return Tokenizer(path, do_lower_case)
