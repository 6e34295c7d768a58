"""The tokenizer that `convert --to=hf` writes beside the weights, so that `transformers.AutoTokenizer` and
`pipeline(...)` on the exported folder give the model the ids it was trained on.

transformers' own AlbertTokenizer, built from `spiece.model` alone, differs from SentencePiece and the original's
preprocessing: it splits user-defined pieces out before the word boundaries (`" (x"` becomes `(`, `▁x` instead of
`▁`, `(`, `x`), and it lacks the original's digit-comma rule (`▁1,` -> `▁1` + `,`). So the export is a
`tokenizer.json` built here: ALBERT's preprocessing and SentencePiece's normalization as normalizers, words split
before each `▁` as SentencePiece splits them, and a Unigram model of the SentencePiece pieces and scores in which
the pieces ending in digit-comma, which the original never emits, cannot win. It gives our ids on every one of
14,630 texts of the shared corpus, GLUE dev sets and SQuAD contexts (`tests/test_hf_export.py`).
"""
from __future__ import annotations

import json
import os
import tempfile

import tokenizers
from sentencepiece import sentencepiece_model_pb2
from tokenizers import Regex, normalizers, pre_tokenizers, processors

from albert_jax import storage
from albert_jax.errors import InputError
from albert_jax.weights import record, store
from data_pipeline import wordpiece
from data_pipeline.tokenization import SPIECE_UNDERLINE, Tokenizer
from data_pipeline.wordpiece import WordPieceTokenizer

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = store.HF_TOKENIZER_CONFIG
SPM_FILE = "spiece.model"
SPECIAL_TOKENS = {"unk_token": "<unk>", "pad_token": "<pad>", "cls_token": "[CLS]", "sep_token": "[SEP]",
                  "mask_token": "[MASK]"}
# Where a tokenizer built another way goes wrong: capitals, accents, quotes, runs of spaces, user-defined pieces
# next to words, numbers with commas; and a pair, for the segment ids.
SAMPLES = [("I loved it.", None), ("I hated it!", None),
           ("The Café's CRÈME brûlée was naïve, wasn't it?", None),
           ("``Quoted'' words  and   spaces;\t(parentheses)!", None),
           ("In 1990, 3,400 people paid $1,628.26 (or 1.53 percent).", None),
           ("Does Zoë live in São Paulo?", "She moved to Zürich (Switzerland) last year.")]


def hf_tokenizer(tokenizer: Tokenizer) -> tokenizers.Tokenizer:
  """A `tokenizers.Tokenizer` that gives `tokenizer`'s ids, with [CLS] a [SEP] (b [SEP]) around them."""
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(storage.path(tokenizer.model_path).read_bytes())
  never = -1e9  # the original splits a digit-comma piece (`▁1,`) into its digits and the comma
  pieces = [(p.piece, never if len(p.piece) > 1 and p.piece[-1] == "," and p.piece[-2].isdigit() else p.score)
            for p in proto.pieces]
  hf = tokenizers.Tokenizer(tokenizers.models.Unigram(pieces, unk_id=tokenizer.unk_id, byte_fallback=False))
  steps = [normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip(),  # ALBERT's preprocess_text
           normalizers.Replace("``", '"'), normalizers.Replace("''", '"'), normalizers.NFKD(),
           normalizers.StripAccents()]
  steps += [normalizers.Lowercase()] if tokenizer.do_lower_case else []
  if proto.normalizer_spec.precompiled_charsmap:  # SentencePiece's own normalization (nmt_nfkc)
    steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
  steps += [normalizers.Replace(Regex(" +"), " "), normalizers.Strip(), normalizers.Prepend(SPIECE_UNDERLINE),
            normalizers.Replace(" ", SPIECE_UNDERLINE)]
  hf.normalizer = normalizers.Sequence(steps)
  hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme="never", split=True)
  hf.decoder = tokenizers.decoders.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme="always")
  hf.add_special_tokens([tokenizers.AddedToken(token, special=True) for token in SPECIAL_TOKENS.values()])
  cls, sep = ("[CLS]", tokenizer.cls_id), ("[SEP]", tokenizer.sep_id)
  hf.post_processor = processors.TemplateProcessing(
      single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1", special_tokens=[cls, sep])
  return hf


def special_tokens(tokenizer: Tokenizer | WordPieceTokenizer) -> dict[str, str]:
  """transformers' names of the tokenizer's special tokens: ALBERT's SentencePiece ones, or BERT's WordPiece ones."""
  return wordpiece.SPECIAL_TOKENS if isinstance(tokenizer, WordPieceTokenizer) else SPECIAL_TOKENS


def save_tokenizer(tokenizer: Tokenizer | WordPieceTokenizer, path: str, max_length: int) -> None:
  """tokenizer.json, its tokenizer_config.json, and the tokenizer's own file for tools that read it: spiece.model,
  or a WordPiece vocab.txt, which transformers' BertTokenizerFast reads (its pipeline is our ids' already)."""
  wordpiece_vocab = isinstance(tokenizer, WordPieceTokenizer)
  hf = tokenizer.hf if wordpiece_vocab else hf_tokenizer(tokenizer)
  storage.write_atomic(os.path.join(path, TOKENIZER_FILE), hf.to_str())
  settings = {"tokenizer_class": "BertTokenizerFast" if wordpiece_vocab else "PreTrainedTokenizerFast",
              "do_lower_case": tokenizer.do_lower_case, "model_max_length": max_length, **special_tokens(tokenizer),
              "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}  # segment 1 of pairs
  storage.write_atomic(os.path.join(path, TOKENIZER_CONFIG), json.dumps(settings, indent=2))
  storage.write_atomic(os.path.join(path, wordpiece.VOCAB_FILE if wordpiece_vocab else SPM_FILE),
                       storage.path(tokenizer.model_path).read_bytes())


def our_ids(tokenizer: Tokenizer, first: str, second: str | None) -> tuple[list[int], list[int]]:
  """(ids, segment ids) of our fine-tuning features: [CLS] a [SEP] (b [SEP])."""
  ids = [tokenizer.cls_id, *tokenizer.encode(first), tokenizer.sep_id]
  types = [0] * len(ids)
  if second is not None:
    pair = [*tokenizer.encode(second), tokenizer.sep_id]
    ids, types = ids + pair, types + [1] * len(pair)
  return ids, types


def check_tokenizer(tokenizer: Tokenizer, vocab_size: int, max_length: int) -> str:
  """Refuses a tokenizer that the model has no rows for, or whose export, loaded back as users load it, gives other
  ids than ours (`check_loaded`); written to a scratch folder first, so a refusal leaves --dst alone. Returns what
  loaded it."""
  if tokenizer.vocab_size != vocab_size:
    raise InputError(f"The tokenizer {tokenizer.model_path} has {tokenizer.vocab_size} pieces but the model "
                     f"has vocab_size={vocab_size}; pass the model it was trained with (--spm_model).")
  with tempfile.TemporaryDirectory() as scratch:
    save_tokenizer(tokenizer, scratch, max_length)
    return check_loaded(tokenizer, scratch, "nothing was written", with_model=False)


def check_loaded(tokenizer: Tokenizer | None, folder: str, fix: str, with_model: bool = True) -> str:
  """Loads `folder` as users load it, every file in it read as transformers reads it: AutoTokenizer, and (with_model,
  torch installed) the class config.json names; without transformers, tokenizer.json by the tokenizers library.
  Refuses a tokenizer with tokens beyond the run's special ones (an earlier tool's added_tokens.json), other special
  token ids (a special_tokens_map.json), or other ids than ours on SAMPLES. Returns what loaded the tokenizer."""
  try:
    import transformers
  except ImportError:
    transformers = None
  if with_model and transformers and transformers.utils.is_torch_available():
    config = transformers.AutoConfig.from_pretrained(folder)
    model_class = getattr(transformers, (config.architectures or ["AutoModel"])[0])
    bar = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # a bar per load on stderr
    try:
      _, info = model_class.from_pretrained(folder, output_loading_info=True)
    finally:
      if bar:
        transformers.utils.logging.enable_progress_bar()
    if info["unexpected_keys"] or info["mismatched_keys"]:
      raise InputError(f"{folder}: transformers' {model_class.__name__} does not take every weight of the export "
                       f"({sorted(info['unexpected_keys'] or info['mismatched_keys'])[:3]}); {fix}.")
  if tokenizer is None:
    return ""
  if transformers:
    loaded = transformers.AutoTokenizer.from_pretrained(folder)
    encode = lambda a, b: (lambda e: (e["input_ids"], e["token_type_ids"]))(loaded(a, b))
    ours = special_tokens(tokenizer)
    special = {name: getattr(loaded, name) for name in ours}
    if special != ours or (added := set(loaded.get_added_vocab()) - set(ours.values())):
      found = f"added tokens {sorted(added)}" if special == ours else f"special tokens {special}"
      raise InputError(f"{folder}: transformers loads the tokenizer with {found}, unlike {tokenizer.model_path}; "
                       f"{fix}.")
  else:
    loaded = tokenizers.Tokenizer.from_file(os.path.join(folder, TOKENIZER_FILE))
    encode = lambda a, b: (lambda e: (e.ids, e.type_ids))(loaded.encode(a, b))
  for first, second in SAMPLES:
    if (theirs := encode(first, second)) != (ours := our_ids(tokenizer, first, second)):
      raise InputError(f"The exported tokenizer ({type(loaded).__name__}) gives other ids than "
                       f"{tokenizer.model_path} for {(first, second)!r}: {theirs[0]} != {ours[0]}; {fix}.")
  return type(loaded).__name__


def run_tokenizer(src: str, spm_model: str | None = None) -> Tokenizer:
  """The tokenizer `src` was trained with: --spm_model, else the one its run recorded, with the lower-casing it
  recorded (`record.recorded_tokenizer`: its config.json's data.spm_model, its prepared data's copy)."""
  recorded = record.recorded_tokenizer(storage.absolute(src).rstrip("/"))
  if not (spm_model or recorded):
    raise InputError(f"--src={src} names no SentencePiece model (no run config.json with data.spm_model, nor "
                     "prepared data): pass the one it was trained with, --spm_model=PATH (ALBERT's is "
                     "spiece.model), so that the export's tokenizer gives the model's ids, or --spm_model=none to "
                     "export the weights alone.")
  model, lower = recorded or (None, None)
  return wordpiece.load_tokenizer(spm_model or model, True if lower is None else lower)
