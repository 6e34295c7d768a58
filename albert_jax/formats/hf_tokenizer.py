"""The tokenizer that `convert --to=hf` writes beside the weights, so that `transformers.AutoTokenizer` and
`pipeline(...)` on the exported folder give the model the ids it was trained on.

transformers' own AlbertTokenizer, built from `spiece.model` alone, differs from SentencePiece and the original's
preprocessing: it splits user-defined pieces out before the word boundaries (`" (x"` becomes `(`, `▁x` instead of
`▁`, `(`, `x`), and it lacks the original's digit-comma rule (`▁1,` -> `▁1` + `,`). So the export is a
`tokenizer.json` built here: ALBERT's preprocessing and SentencePiece's normalization as normalizers, words split
before each `▁` as SentencePiece splits them, and a Unigram model of the SentencePiece pieces and scores in which
the pieces ending in digit-comma, which the original never emits, cannot win. It gives our ids on every one of
14,630 texts of the shared corpus, GLUE dev sets and SQuAD contexts (`tests/test_hf_export.py`). A WordPiece
vocabulary, a byte-level BPE or a tokenizer.json is exported as the `tokenizers` pipeline it already runs here.
Either way the post-processor adds the special tokens in the tokenizer's pair layout (`data_pipeline.pair_layout`).
"""
from __future__ import annotations

import json
import os
import tempfile

import tokenizers
from sentencepiece import sentencepiece_model_pb2
from tokenizers import Regex, normalizers, pre_tokenizers

from albert_jax import storage
from albert_jax.errors import InputError
from albert_jax.weights import store
from data_pipeline import records, wordpiece
from data_pipeline.tokenization import SPIECE_UNDERLINE, Tokenizer
from data_pipeline.tokenizer_json import JsonTokenizer
from data_pipeline.wordpiece import WordPieceTokenizer

AnyTokenizer = Tokenizer | WordPieceTokenizer | JsonTokenizer

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
  hf.post_processor = tokenizer.pair_layout.post_processor(("[CLS]", tokenizer.cls_id), ("[SEP]", tokenizer.sep_id))
  return hf


def special_tokens(tokenizer: AnyTokenizer) -> dict[str, str]:
  """transformers' names of the tokenizer's special tokens: ALBERT's SentencePiece ones, BERT's WordPiece ones, or
  those a tokenizer.json or BPE vocabulary holds."""
  if isinstance(tokenizer, JsonTokenizer):
    return {f"{name}_token": tokenizer.id_to_piece(getattr(tokenizer, f"{name}_id"))
            for name in ("unk", "pad", "cls", "sep", "mask")}
  return wordpiece.SPECIAL_TOKENS if isinstance(tokenizer, WordPieceTokenizer) else SPECIAL_TOKENS


def _added_tokens(tokenizer: AnyTokenizer) -> set[str]:
  """The tokens the tokenizer itself splits out before its model: its special ones, and those a tokenizer.json
  adds (transformers 5 saves ALBERT's user-defined pieces, `(` `)` `"` ..., as such)."""
  if isinstance(tokenizer, JsonTokenizer):
    return {token.content for token in tokenizer.hf.get_added_tokens_decoder().values()}
  return set(special_tokens(tokenizer).values())


def _library_tokenizer(tokenizer: JsonTokenizer) -> tokenizers.Tokenizer:
  """The tokenizer.json's or BPE files' pipeline, adding the special tokens in the tokenizer's pair layout."""
  hf = tokenizers.Tokenizer.from_str(tokenizer.hf.to_str())
  hf.post_processor = tokenizer.pair_layout.post_processor(
      *((tokenizer.id_to_piece(i), i) for i in (tokenizer.cls_id, tokenizer.sep_id)))
  return hf


def save_tokenizer(tokenizer: AnyTokenizer, path: str, max_length: int) -> None:
  """tokenizer.json, its tokenizer_config.json, and the tokenizer's own files for tools that read them: spiece.model,
  a WordPiece vocab.txt, which transformers' BertTokenizerFast reads (its pipeline is our ids' already), or a BPE's
  vocab.json and merges.txt. Token types are among the model's inputs where the pair layout sets them."""
  wordpiece_vocab = isinstance(tokenizer, WordPieceTokenizer)
  library = isinstance(tokenizer, JsonTokenizer)
  hf = tokenizer.hf if wordpiece_vocab else _library_tokenizer(tokenizer) if library else hf_tokenizer(tokenizer)
  storage.write_atomic(os.path.join(path, TOKENIZER_FILE), hf.to_str())
  types = ["token_type_ids"] if tokenizer.pair_layout.second_segment else []
  settings = {"tokenizer_class": "BertTokenizerFast" if wordpiece_vocab else "PreTrainedTokenizerFast",
              "do_lower_case": tokenizer.do_lower_case, "model_max_length": max_length, **special_tokens(tokenizer),
              "model_input_names": ["input_ids", *types, "attention_mask"]}
  storage.write_atomic(os.path.join(path, TOKENIZER_CONFIG), json.dumps(settings, indent=2))
  for source, name in zip(tokenizer.files, records.tokenizer_copy_names(tokenizer.files)):
    if name != TOKENIZER_FILE:  # a tokenizer.json's own: written above, with the pair layout's special tokens
      storage.write_atomic(os.path.join(path, name), storage.path(source).read_bytes())


def our_ids(tokenizer: AnyTokenizer, first: str, second: str | None) -> tuple[list[int], list[int]]:
  """(ids, segment ids) of our fine-tuning features: the texts joined in the tokenizer's pair layout."""
  return tokenizer.pair_layout.join(tokenizer.encode(first), None if second is None else tokenizer.encode(second),
                                    tokenizer.cls_id, tokenizer.sep_id)


def check_tokenizer(tokenizer: AnyTokenizer, vocab_size: int, max_length: int) -> str:
  """Refuses a tokenizer that the model has no rows for, or whose export, loaded back as users load it, gives other
  ids than ours (`check_loaded`); written to a scratch folder first, so a refusal leaves --dst alone. Returns what
  loaded it."""
  if tokenizer.vocab_size != vocab_size:
    raise InputError(f"The tokenizer {tokenizer.model_path} has {tokenizer.vocab_size} pieces but the model "
                     f"has vocab_size={vocab_size}; pass the model it was trained with (--spm_model).")
  with tempfile.TemporaryDirectory() as scratch:
    save_tokenizer(tokenizer, scratch, max_length)
    return check_loaded(tokenizer, scratch, "nothing was written", with_model=False)


def check_loaded(tokenizer: AnyTokenizer | None, folder: str, fix: str, with_model: bool = True) -> str:
  """Loads `folder` as users load it, every file in it read as transformers reads it: AutoTokenizer, and (with_model,
  torch installed) the class config.json names; without transformers, tokenizer.json by the tokenizers library.
  Refuses a tokenizer with tokens beyond those it adds itself (an earlier tool's added_tokens.json), other special
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
    encode = lambda a, b: (lambda e: (e["input_ids"], e["token_type_ids"]))(loaded(a, b, return_token_type_ids=True))
    ours = special_tokens(tokenizer)
    special = {name: getattr(loaded, name) for name in ours}
    if special != ours or (added := set(loaded.get_added_vocab()) - _added_tokens(tokenizer)):
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


def run_tokenizer(src: str, recorded: tuple[str, bool | None] | None, spm_model: str | None = None) -> AnyTokenizer:
  """The tokenizer the weights at `src` were trained with: --spm_model, else `recorded` (`Weights.tokenizer`: the
  SentencePiece model their run recorded, its config.json's data.spm_model or its prepared data's copy, with the
  lower-casing it recorded)."""
  if not (spm_model or recorded):
    raise InputError(f"--src={src} names no SentencePiece model (no run config.json with data.spm_model, nor "
                     "prepared data): pass the one it was trained with, --spm_model=PATH (ALBERT's is "
                     "spiece.model), so that the export's tokenizer gives the model's ids, or --spm_model=none to "
                     "export the weights alone.")
  model, lower = recorded or (None, None)
  return wordpiece.load_tokenizer(spm_model or model, True if lower is None else lower)
