"""The hf format: transformers `save_pretrained` folders (and Hub names) <-> our pretrained-weights folders.

Reads and writes every family with a column here (`COLUMNS`, keyed by `Family.name`): ALBERT's classes are
`hf_albert`'s, ELECTRA's `hf_electra`'s, BERT's and RoBERTa's `hf_bert`'s. A folder's family is its config.json's
model_type (`families`); our weights' family is the one their folder or run records where its classes hold their
heads, else the one whose classes hold them. The tokenizer travels with the weights both ways (`hf_tokenizer`).

`init_checkpoint` takes such a folder or Hub name too: `converted` converts it into our layout once (when
`weights.resolve` reads it), under `hf_hub.cache_dir()`, one folder per Hub commit or per state of a local folder's
files, and the run reads that conversion as it reads any converted folder.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from albert_jax import families, head_identity, storage
from albert_jax.errors import InputError
from albert_jax.families.albert import ALBERT
from albert_jax.families.electra import ELECTRA
from albert_jax.formats import Format, conversions, hf_albert, hf_bert, hf_electra, hf_hub, hf_tokenizer
from albert_jax.formats.hf_files import CONFIG_FILE, read_config
from albert_jax.head_identity import HFHead
from albert_jax.model_config import ModelConfig
from albert_jax.run import provenance
from albert_jax.weights import record, store
from data_pipeline import tokenizer_json, wordpiece

NO_TOKENIZER = "none"  # --spm_model's value for the weights alone


@dataclasses.dataclass(frozen=True)
class FamilyClasses:
  """One family's transformers classes: `load` reads a folder of them; `save(model config, params, folder, head, the
  config the weights record)` writes our params and returns the folders written, that folder first; `holds_heads` tells
  whether our params hold one of the family's heads."""
  load: Callable[[str], tuple[ModelConfig, dict[str, Any]]]
  save: Callable[[ModelConfig, Any, str, HFHead | None, Any], list[str]]
  holds_heads: Callable[[Any], bool]
  imported: str = ""  # said after reading a folder of this family
  exported: str = ""  # said after writing one
  extra_folder: str = ""  # said of each extra folder written, `{}` the folder


def _save_albert(c, params, path, head, recorded) -> list[str]:
  hf_albert.save_hf(c, params, path, head=head)
  return [path]


def _save_electra(c, params, path, head, recorded) -> list[str]:
  fraction = (recorded.get("electra") or {}).get("generator_fraction")
  return hf_electra.save_hf(c, params, path, None if fraction is None else float(fraction), head)


COLUMNS = {
    ALBERT.name: FamilyClasses(hf_albert.load_hf, _save_albert, hf_albert.holds_heads),
    ELECTRA.name: FamilyClasses(
        hf_electra.load_hf, _save_electra, hf_electra.holds_heads,
        imported=f"HF ELECTRA has no pooler: albert/pooler is initialised, untrained ({hf_electra.POOLER_NOTE}).",
        exported=f"HF ELECTRA has no pooler: albert/pooler is not written ({hf_electra.POOLER_NOTE}).",
        extra_folder="The generator went to {} (ElectraForMaskedLM)."),
    **{layout.family.name: FamilyClasses(layout.load_hf, layout.save_hf, layout.holds_heads)
       for layout in (hf_bert.BERT_LAYOUT, hf_bert.ROBERTA_LAYOUT)},
}


def folder_family(path: str) -> families.Family:
  """The family of a transformers folder, by its config.json's model_type."""
  config = read_config(os.path.abspath(path))
  return families.for_hf_model_type(config.get("model_type", ALBERT.hf_model_type), os.path.join(path, CONFIG_FILE))


def weights_family(weights, params: Any, head: HFHead | None = None) -> families.Family:
  """The family of our `weights` (`weights.Weights`) whose params are `params`: the one whose class their `head` was
  trained as, else the one their folder or run records where its classes hold their heads (heads of one dense layer
  are alike in several families: BERT's are ALBERT's), else the first whose classes hold them."""
  if head is not None and (family := families.for_hf_class(head.architecture)):
    return family
  held = [name for name, column in COLUMNS.items() if column.holds_heads(params)]
  recorded = weights.family.name
  return families.get(recorded if not held or COLUMNS[recorded].holds_heads(params) else held[0])


def read_head(path: str) -> HFHead | None:
  """What the fine-tuned head of a transformers folder was trained for (`head_identity.hf_head_from_config` of its
  config.json; None for the pretraining and backbone classes)."""
  return head_identity.hf_head_from_config(read_config(os.path.abspath(path)), path)


def from_hf(src: str, dst: str, clear=lambda: None) -> str:
  """Converts the Hugging Face folder `src` into our pretrained-weights folder `dst`; returns what was written, for
  the caller's closing line. A fine-tuned head keeps what it was trained for (class names and order, problem type,
  class) in dst's head.json: eval, predict and warm starts read its classes in that order, and `--to=hf` writes
  them back. `clear`: empties dst of an earlier conversion's files, once the source has loaded."""
  family = folder_family(src)
  column = COLUMNS[family.name]
  head = read_head(src)
  model_config, params = column.load(src)
  if column.imported:
    print(column.imported, flush=True)
  _check_tokenizer_fits(src, model_config.vocab_size)
  clear()
  store.save_pretrained(dst, model_config, params, head=head.identity() if head else None, family=family.name)
  labels = f" for labels {'|'.join(head.labels)}" if head and head.labels else ""
  trained = f"; an {head.architecture} head{labels}" if head else ""
  return f"{', '.join(sorted(params))}{trained}; {_carry_tokenizer(src, dst)}"


def _check_tokenizer_fits(src: str, vocab_size: int) -> None:
  """Refuses a tokenizer with more pieces than the embeddings have rows: its ids beyond them have no embedding.
  Fewer is fine (models round their tables up)."""
  name = wordpiece.folder_tokenizer_file(src)
  if name is None:
    return
  pieces = wordpiece.load_tokenizer(os.path.join(src, name)).vocab_size
  if pieces > vocab_size:
    raise InputError(f"{os.path.join(src, name)} has {pieces:,} pieces but the weights' embeddings have "
                     f"{vocab_size:,} rows (config.json vocab_size): ids beyond them have no embedding; put the "
                     "tokenizer the model was trained with in the folder.")


def _carry_tokenizer(src: str, dst: str) -> str:
  """Copies the folder's tokenizer (`wordpiece.folder_tokenizer_file`: spiece.model, a WordPiece vocab.txt as the
  released ELECTRA folders have, a tokenizer.json as transformers 5 saves, a BPE vocab.json with its merges.txt)
  and its tokenizer_config.json (do_lower_case) beside the weights, where `record.recorded_tokenizer` finds them:
  fine-tuning from dst and `--to=hf` of it take that tokenizer. Returns what was carried, for the closing line."""
  name = wordpiece.folder_tokenizer_file(src)
  if name is None:
    return (f"no tokenizer: {src} has none of {', '.join(wordpiece.FOLDER_TOKENIZER_FILES)}, so runs from {dst} "
            "need data.spm_model and --to=hf needs --spm_model")
  for path in tokenizer_json.files_of(os.path.join(src, name)):
    storage.write_atomic(os.path.join(dst, os.path.basename(path)), storage.path(path).read_bytes())
  settings = os.path.join(src, hf_tokenizer.TOKENIZER_CONFIG)
  if os.path.isfile(settings):
    storage.write_atomic(os.path.join(dst, hf_tokenizer.TOKENIZER_CONFIG), storage.path(settings).read_text())
  lower = record.recorded_tokenizer(dst)[1]
  return f"its tokenizer {name}, do_lower_case={True if lower is None else lower}"


def to_hf(weights, dst: str, encoder_only: bool = False, spm_model: str | None = None, clear=lambda: None) -> None:
  """Writes `weights` (`weights.resolve_ours`: their config, params, family and head) and the tokenizer they were
  trained with once its export is checked to give the run's ids; then the folder, loaded as transformers loads
  it, is checked again (`hf_tokenizer.check_loaded`)."""
  model_config, params = weights.model, weights.stored_params
  tokenizer = None if spm_model == NO_TOKENIZER else hf_tokenizer.run_tokenizer(weights.path, weights.tokenizer, spm_model)
  if encoder_only:
    params, head = {"albert": params["albert"]}, None
  else:
    head = finetuned_head(weights)
  column = COLUMNS[weights_family(weights, params, head).name]
  max_length = model_config.positions
  if tokenizer:
    provenance.check_export(weights.run, weights.named, tokenizer.model_path)
    hf_tokenizer.check_tokenizer(tokenizer, model_config.vocab_size, max_length)
  clear()
  fix = f"remove what else --dst={dst} holds and convert again"
  for folder in column.save(model_config, params, dst, head, weights.config)[1:]:
    hf_tokenizer.check_loaded(None, folder, fix)
    print(column.extra_folder.format(folder), flush=True)
  if column.exported:
    print(column.exported, flush=True)
  said = "no tokenizer (--spm_model=none)"
  if tokenizer:
    hf_tokenizer.save_tokenizer(tokenizer, dst, max_length)
  checked = hf_tokenizer.check_loaded(tokenizer, dst, fix)
  if tokenizer:
    said = (f"the tokenizer of {tokenizer.model_path}, do_lower_case={tokenizer.do_lower_case}, checked to give its "
            f"ids through {checked}")
  print(f"Wrote {dst} from {weights.folder} ({', '.join(sorted(params))}; {said}).", flush=True)


def finetuned_head(weights) -> HFHead | None:
  """The HF head of fine-tuned weights: the one converted weights recorded, else that of the task of the fine-tuning
  run whose best dev checkpoint they are (`Weights.trained_task`); None for any other."""
  return HFHead.from_identity(weights.head) or (weights.trained_task.hf_head if weights.trained_task else None)


def converted(value: str, revision: str = "", flag: str = "init_checkpoint",
              revision_flag: str = "init_checkpoint_revision") -> str | None:
  """Our pretrained-weights folder for a Hugging Face folder or Hub name `value`, converted into
  `hf_hub.cache_dir()` on first use and read from there after; None when `value` is ours (a converted folder, a
  run), read as it is."""
  hub_name = hf_hub.is_hub_name(value)
  folder = hf_hub.hf_folder(value, revision, flag, revision_flag)
  if folder is None:
    return None
  if hub_name:  # a Hub snapshot folder is named after its commit
    from huggingface_hub.file_download import repo_folder_name
    commit = os.path.basename(folder)
    target, origin = os.path.join(hf_hub.cache_dir(), repo_folder_name(repo_id=value, repo_type="model"), commit), (
        f"{value} at commit {commit[:12]}")
  else:
    target, origin = os.path.join(hf_hub.cache_dir(), "folders", conversions.folder_key(folder)), folder
  return conversions.convert_once(from_hf, folder, target, origin, f"{flag}={value}", FORMAT.name)


FORMAT = Format("hf", "a transformers save_pretrained folder or Hub name (ALBERT, ELECTRA, BERT, RoBERTa)",
                read=from_hf, write=to_hf, locate=hf_hub.hf_folder,
                local="Hugging Face directories are read and written by transformers, which needs a local folder")
