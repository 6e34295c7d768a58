"""The hf format: transformers `save_pretrained` folders (and Hub names) <-> our pretrained-weights folders.

Reads and writes every family with a column here (`COLUMNS`, keyed by `Family.name`): ALBERT's classes are
`hf_albert`'s, ELECTRA's `hf_electra`'s, BERT's and RoBERTa's `hf_bert`'s. A folder's family is its config.json's
model_type (`families`); our weights' family is the one their folder or run records where its classes hold their
heads, else the one whose classes hold them. The tokenizer travels with the weights both ways (`hf_tokenizer`).

`init_checkpoint` takes such a folder or Hub name too: `use_converted_init_checkpoint` converts it into our layout
once, under `hf_hub.cache_dir()`, one folder per Hub commit or per state of a local folder's files, and the run reads
that conversion as it reads any converted folder.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from typing import Any, Callable

import ml_collections

from albert_jax import families, head_identity, storage
from albert_jax.errors import InputError, MissingFileError
from albert_jax.families.albert import ALBERT
from albert_jax.families.electra import ELECTRA
from albert_jax.formats import Format, hf_albert, hf_bert, hf_electra, hf_hub, hf_tokenizer, weight_files
from albert_jax.formats.hf_files import CONFIG_FILE, read_config
from albert_jax.head_identity import HFHead
from albert_jax.model_config import ModelConfig
from albert_jax.run import Run, as_run, config as run_config
from albert_jax.run.best import read_best
from albert_jax.tasks import get_task
from albert_jax.weights import loading, record, store
from data_pipeline import wordpiece

NO_TOKENIZER = "none"  # --spm_model's value for the weights alone
PASS_WORKDIR = "pass a training workdir as albert_jax.main wrote it"


@dataclasses.dataclass(frozen=True)
class FamilyClasses:
  """One family's transformers classes: `load` reads a folder of them; `save(model config, params, folder, head, the
  run's config or None)` writes our params and returns the folders written, that folder first; `holds_heads` tells
  whether our params hold one of the family's heads."""
  load: Callable[[str], tuple[ModelConfig, dict[str, Any]]]
  save: Callable[[ModelConfig, Any, str, HFHead | None, Any], list[str]]
  holds_heads: Callable[[Any], bool]
  imported: str = ""  # said after reading a folder of this family
  exported: str = ""  # said after writing one
  extra_folder: str = ""  # said of each extra folder written, `{}` the folder


def _save_albert(c, params, path, head, run) -> list[str]:
  hf_albert.save_hf(c, params, path, head=head)
  return [path]


def _save_electra(c, params, path, head, run) -> list[str]:
  fraction = ((run or {}).get("electra") or {}).get("generator_fraction")
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


def weights_family(src: str, params: Any) -> families.Family:
  """The family of our weights: the one `src` (a folder, a run) records where its classes hold their heads (BERT's
  are ALBERT's), else the first whose classes hold them."""
  recorded = record.backbone_family(src)
  held = [name for name, column in COLUMNS.items() if column.holds_heads(params)]
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


def _tokenizer_file(src: str) -> str | None:
  """The folder's SentencePiece model, else its WordPiece vocab.txt (the released ELECTRA folders'), else None."""
  return next((name for name in (hf_tokenizer.SPM_FILE, wordpiece.VOCAB_FILE)
               if os.path.isfile(os.path.join(src, name))), None)


def _check_tokenizer_fits(src: str, vocab_size: int) -> None:
  """Refuses a tokenizer with more pieces than the embeddings have rows: its ids beyond them have no embedding.
  Fewer is fine (models round their tables up)."""
  name = _tokenizer_file(src)
  if name is None:
    return
  pieces = wordpiece.load_tokenizer(os.path.join(src, name)).vocab_size
  if pieces > vocab_size:
    raise InputError(f"{os.path.join(src, name)} has {pieces:,} pieces but the weights' embeddings have "
                     f"{vocab_size:,} rows (config.json vocab_size): ids beyond them have no embedding; put the "
                     "tokenizer the model was trained with in the folder.")


def _carry_tokenizer(src: str, dst: str) -> str:
  """Copies the folder's SentencePiece model (or WordPiece's vocab.txt, as the released ELECTRA folders have) and its
  tokenizer_config.json (do_lower_case) beside the weights, where `record.recorded_tokenizer` finds them:
  fine-tuning from dst and `--to=hf` of it take that tokenizer. Returns what was carried, for the closing line."""
  spm = hf_tokenizer.SPM_FILE
  name = _tokenizer_file(src)
  if name is None:
    return (f"no tokenizer: {src} has no {spm} nor {wordpiece.VOCAB_FILE}, so runs from {dst} need "
            "data.spm_model and --to=hf needs --spm_model")
  storage.write_atomic(os.path.join(dst, name), storage.path(os.path.join(src, name)).read_bytes())
  settings = os.path.join(src, hf_tokenizer.TOKENIZER_CONFIG)
  if os.path.isfile(settings):
    storage.write_atomic(os.path.join(dst, hf_tokenizer.TOKENIZER_CONFIG), storage.path(settings).read_text())
  lower = record.recorded_tokenizer(dst)[1]
  return f"its tokenizer {name}, do_lower_case={True if lower is None else lower}"


def to_hf(src: str, dst: str, encoder_only: bool = False, spm_model: str | None = None, clear=lambda: None) -> None:
  """The weights, and the tokenizer they were trained with once its export is checked to give the run's ids; then
  the folder, loaded as transformers loads it, is checked again (`hf_tokenizer.check_loaded`)."""
  run, best = src, None if store.is_pretrained_dir(src) else read_best(as_run(src))
  if best is not None:  # a fine-tuning workdir: its best dev checkpoint, with its task's head
    src = as_run(src).best_weights(best)
  model_config, params, recorded = _our_weights(src)
  column = COLUMNS[weights_family(src, params).name]
  tokenizer = None if spm_model == NO_TOKENIZER else hf_tokenizer.run_tokenizer(run, spm_model)
  if encoder_only:
    params, head = {"albert": params["albert"]}, None
  else:
    head = finetuned_head(src)  # a converted head's, or WORKDIR/best/step_N's task's HF class
  max_length = model_config.positions
  if tokenizer:
    hf_tokenizer.check_tokenizer(tokenizer, model_config.vocab_size, max_length)
  clear()
  fix = f"remove what else --dst={dst} holds and convert again"
  for folder in column.save(model_config, params, dst, head, recorded)[1:]:
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
  print(f"Wrote {dst} from {src} ({', '.join(sorted(params))}; {said}).", flush=True)


def _our_weights(src: str) -> tuple[ModelConfig, Any, Any]:
  """(ModelConfig, params, the run's config or None) of a `convert`/`save_pretrained` directory, or of a
  pretraining workdir: its newest checkpoint whole (an ELECTRA run's generator too), the model from its config.json."""
  training_run = as_run(src)
  if store.is_pretrained_dir(src) or not storage.path(training_run.checkpoints).is_dir():
    return (*store.load_pretrained(src), None)
  if not run_config.exists(training_run):
    raise MissingFileError(f"--src={src} has checkpoints/ but no config.json, which names the run's model: "
                           f"{PASS_WORKDIR} (config.json next to checkpoints/).")
  config = run_config.read(training_run, "--src", PASS_WORKDIR)
  return ModelConfig.from_mapping(config["model"]), loading.load_params(src, "--src"), config


def finetuned_head(weights_dir: str) -> HFHead | None:
  """The HF head of fine-tuned weights (`head_identity.finetuned_head`): a converted directory's, or for weights
  kept in a workdir (`WORKDIR/best/step_N`) the task named by the workdir's config.json; None for any other."""
  return head_identity.finetuned_head(weights_dir, _run_task)


def _run_task(run: Run):
  """The fine-tuning task of a training run's config.json; None when it has none (or is no fine-tuning run)."""
  config_path = run.config
  if not storage.path(config_path).is_file():
    return None
  config = ml_collections.ConfigDict(store.read_json_object(config_path, "a run's config",
                                                            store.RESTORE_RUN_CONFIG))
  return get_task(config) if "task" in config else None


def converted(value: str, revision: str = "", flag: str = "init_checkpoint",
              revision_flag: str = "init_checkpoint_revision") -> str | None:
  """Our pretrained-weights folder for a Hugging Face folder or Hub name `value`, converted into
  `hf_hub.cache_dir()` on first use and read from there after; None when `value` is ours (a converted folder, a
  run), read as it is."""
  folder = hf_hub.hf_folder(value, revision, flag, revision_flag)
  if folder is None:
    return None
  if hf_hub.is_hub_name(value):  # a Hub snapshot folder is named after its commit
    from huggingface_hub.file_download import repo_folder_name
    commit = os.path.basename(folder)
    target, origin = os.path.join(hf_hub.cache_dir(), repo_folder_name(repo_id=value, repo_type="model"), commit), (
        f"{value} at commit {commit[:12]}")
  else:
    target, origin = os.path.join(hf_hub.cache_dir(), "folders", _folder_key(folder)), folder
  if store.is_pretrained_dir(target):
    print(f"{flag}={value}: reading its conversion in {target}", flush=True)
    return target
  partial = f"{target}.partial-{os.getpid()}"
  try:
    said = from_hf(folder, partial)
    try:
      os.rename(partial, target)  # whole or not at all; a conversion that another process finished first stays
    except OSError:
      if not store.is_pretrained_dir(target):
        raise
  finally:
    shutil.rmtree(partial, ignore_errors=True)
  print(f"{flag}={value}: converted {origin} into {target} ({said}); later runs read it from there (delete it to "
        "free the space)", flush=True)
  return target


def _folder_key(folder: str) -> str:
  """A local folder's conversion key: its path and the name, size and modification time of each of its files, so
  that a folder saved again is converted again."""
  digest = hashlib.sha256(os.path.realpath(folder).encode())
  for entry in sorted(os.scandir(folder), key=lambda e: e.name):
    if entry.is_file():
      stat = entry.stat()
      digest.update(f"\0{entry.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
  return f"{os.path.basename(folder.rstrip('/')) or 'folder'}-{digest.hexdigest()[:16]}"


def use_converted_init_checkpoint(config: ml_collections.ConfigDict) -> None:
  """Points `config.init_checkpoint` at the conversion of the Hugging Face folder or Hub name it names, in place
  (the command line's config object), so every mode reads it as a converted folder and the run's config.json
  records it (a Hub commit in its path); the revision, now part of that path, is cleared. Several processes are
  refused: each host would convert into its own cache."""
  value, revision = config.get("init_checkpoint", ""), config.get("init_checkpoint_revision", "")
  weight_files.check_holds_weights(value, "init_checkpoint")
  if revision and not value:
    raise InputError(f"init_checkpoint_revision={revision} pins a revision of nothing: set "
                     "--config.init_checkpoint=NAME (a Hugging Face Hub model) too, or drop it.")
  if not (hf_hub.is_hub_name(value) or hf_hub.is_hf_folder(value) or revision):
    return
  import jax
  if jax.process_count() > 1:
    raise InputError(f"init_checkpoint={value} is a Hugging Face model, converted on the fly by a single process "
                     "only: convert it once (python -m albert_jax.convert --from=hf --src=NAME --dst=gs://BUCKET/DIR) "
                     "and pass that folder.")
  target = converted(value, revision)
  if target is not None:
    config.init_checkpoint = target
    if "init_checkpoint_revision" in config:
      config.init_checkpoint_revision = ""


FORMAT = Format("hf", "a transformers save_pretrained folder or Hub name (ALBERT, ELECTRA, BERT, RoBERTa)",
                read=from_hf, write=to_hf, locate=hf_hub.hf_folder,
                local="Hugging Face directories are read and written by transformers, which needs a local folder")
