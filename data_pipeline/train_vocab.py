"""Byte-level BPE and WordPiece vocabularies learnt with the `tokenizers` library (`data_pipeline.train_spm`'s
--model_type=bpe and --model_type=wordpiece).

bpe: RoBERTa's / GPT-2's tokenizer: byte-level pre-tokenization (every byte a symbol, so no text is unknown), no
normalisation (case kept), merges learnt over the 256 byte symbols; <s> <pad> </s> <unk> <mask> are ids 0-4.
Written as `vocab.json` + `merges.txt` (what RobertaTokenizerFast reads) and `tokenizer.json` (the same pipeline).
wordpiece: BERT's: its normaliser (lower-casing and accent stripping when uncased), its punctuation-splitting
pre-tokenizer, pieces with the "##" continuation prefix; [PAD] [UNK] [CLS] [SEP] [MASK] are ids 0-4. Written as
`vocab.txt`, one piece a line (what BertTokenizerFast reads).
Every symbol the merges start from is a character of a sorted alphabet, so ties between equally frequent merges
are broken the same way in every run: the same sentences and settings give the same bytes (`wordpiece_files` says
how WordPiece's "##" symbols are made so).
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Iterator

import tokenizers
from tokenizers import normalizers, pre_tokenizers, trainers

from data_pipeline.tokenizer_json import ROBERTA_SPECIALS, byte_level_bpe
from data_pipeline.wordpiece import SPECIAL_TOKENS

WORDPIECE_SPECIALS = [SPECIAL_TOKENS[name] for name in ("pad_token", "unk_token", "cls_token", "sep_token",
                                                        "mask_token")]
BYTE_SYMBOLS = len(pre_tokenizers.ByteLevel.alphabet())
MIN_VOCAB = {"bpe": BYTE_SYMBOLS + len(ROBERTA_SPECIALS), "wordpiece": len(WORDPIECE_SPECIALS) + 1}


def bpe_files(sentences: Iterator[str], vocab_size: int) -> dict[str, bytes]:
  """{file name: contents} of a byte-level BPE of (at most) `vocab_size` tokens learnt on `sentences`."""
  hf = byte_level_bpe({}, [])
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=ROBERTA_SPECIALS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  hf.train_from_iterator(sentences, trainer)
  vocab = hf.get_vocab(with_added_tokens=True)
  with tempfile.TemporaryDirectory() as folder:
    hf.model.save(folder)
    merges_text = open(os.path.join(folder, "merges.txt"), encoding="utf-8").read()
  merges = [tuple(line.split(" ")) for line in merges_text.splitlines() if line and not line.startswith("#")]
  pipeline = byte_level_bpe(vocab, merges)   # with the post-processor, which needs the trained ids of <s> </s>
  return {"vocab.json": json.dumps(dict(sorted(vocab.items(), key=lambda kv: kv[1])), ensure_ascii=False).encode(),
          "merges.txt": merges_text.encode(), "tokenizer.json": pipeline.to_str(pretty=True).encode()}


def wordpiece_files(sentences: Iterator[str], vocab_size: int, do_lower_case: bool) -> dict[str, bytes]:
  """{"vocab.txt": contents} of a WordPiece vocabulary of (at most) `vocab_size` pieces learnt on `sentences`.

  The library's WordPieceTrainer numbers the "##" symbols in hash order, so equally frequent merges are taken in
  another order in every process. Here BPE learns the pieces instead over words whose later characters are written
  as private-use stand-ins (`_shadow`): every symbol is then a character of the sorted alphabet, and the merges
  follow from the text alone. A piece of stand-ins is a "##" continuation."""
  normalizer = normalizers.BertNormalizer(lowercase=do_lower_case)
  pre_tokenizer = pre_tokenizers.BertPreTokenizer()

  def shadowed() -> Iterator[str]:
    for sentence in sentences:
      words = [word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(sentence))]
      yield " ".join(word[0] + "".join(map(_shadow, word[1:])) for word in words if _shadowable(word))

  hf = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
  hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=WORDPIECE_SPECIALS, show_progress=False)
  hf.train_from_iterator(shadowed(), trainer)
  pieces = sorted(hf.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
  return {"vocab.txt": "".join(f"{_unshadow(piece)}\n" for piece, _ in pieces).encode()}


_SHADOW = 0xF0000   # supplementary private use areas A and B: a stand-in for each character up to U+1FFFF


def _shadow(char: str) -> str:
  return chr(_SHADOW + ord(char))


def _shadowable(word: str) -> bool:
  """Whether every later character has a stand-in (a word with one beyond U+1FFFF is left out of training)."""
  return all(ord(c) < 0x110000 - _SHADOW for c in word[1:])


def _unshadow(piece: str) -> str:
  """A learnt piece as WordPiece writes it: stand-ins back to their characters, "##" before a continuation."""
  if piece in WORDPIECE_SPECIALS:
    return piece
  text = "".join(chr(ord(c) - _SHADOW) if ord(c) >= _SHADOW else c for c in piece)
  return "##" + text if ord(piece[0]) >= _SHADOW else text
