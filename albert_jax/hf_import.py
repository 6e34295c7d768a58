"""Hugging Face folders and Hub names as pretrained weights, wherever weights are taken.

`init_checkpoint` and `convert --from=hf --src` take a transformers `save_pretrained` folder (ALBERT or ELECTRA:
config.json with model.safetensors, its shards or pytorch_model.bin; spiece.model or WordPiece's vocab.txt, and
tokenizer_config.json) or a Hub name such as `albert/albert-base-v2`. huggingface_hub resolves a
name into its cache (HF_HOME): online it fetches what the cache lacks, with progress bars; with HF_HUB_OFFLINE=1 it
reads the cache alone. A revision (branch, tag or commit) pins a name: `init_checkpoint_revision`, `--revision`.

`init_checkpoint` converts such a folder into our layout (`pretrained`: weights, model and tokenizer) once, under
`cache_dir()`, one folder per Hub commit or per state of a local folder's files, and the run reads that conversion
as it reads any converted folder (`use_converted_init_checkpoint`).
"""
from __future__ import annotations

import hashlib
import os
import shutil

import ml_collections

from albert_jax import electra_interop, hf_export, interop, pretrained, storage, weight_files
from albert_jax.errors import EnvironmentUserError, InputError, MissingFileError
from data_pipeline import wordpiece

WEIGHT_FILES = (interop.SAFETENSORS_FILE, interop.SAFETENSORS_INDEX, interop.TORCH_FILE)
# What a conversion reads of a Hub model: its config, its safetensors weights (whole or sharded), its tokenizer.
# pytorch_model.bin is fetched only for a model without safetensors (often both are there, the same weights).
HUB_FILES = [interop.CONFIG_FILE, interop.SAFETENSORS_FILE, interop.SAFETENSORS_INDEX, "model-*-of-*.safetensors",
             hf_export.SPM_FILE, wordpiece.VOCAB_FILE, hf_export.TOKENIZER_CONFIG]
INSTALL_HUB = 'pip install -e ".[hf]"'


def cache_dir() -> str:
  """Where converted Hugging Face weights are kept: $XDG_CACHE_HOME/albert_jax/hf (default ~/.cache)."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "albert_jax", "hf")


def is_hf_folder(path: str) -> bool:
  """A local transformers folder: config.json and weights, and not our layout (model_config.json + params/)."""
  if not path or storage.is_remote(path) or not os.path.isdir(path) or pretrained.is_pretrained_dir(path):
    return False
  return os.path.isfile(os.path.join(path, interop.CONFIG_FILE)) and any(
      os.path.isfile(os.path.join(path, name)) for name in WEIGHT_FILES)


def is_hub_name(value: str) -> bool:
  """`namespace/name` (or a bare `name`) as the Hub spells a model, naming nothing on this machine: a path that
  exists, starts with `/`, `.` or `~`, or is a URL is never taken for one."""
  if not value or storage.is_remote(value) or value.startswith(("/", ".", "~")) or os.path.exists(value):
    return False
  try:
    from huggingface_hub.utils import HFValidationError, validate_repo_id
  except ImportError:
    return False
  try:
    validate_repo_id(value)
  except HFValidationError:
    return False
  return True


def hf_folder(value: str, revision: str, flag: str, revision_flag: str) -> str | None:
  """The local Hugging Face folder that `value` names (a Hub name's snapshot, fetched where the cache lacks it; a
  folder as it is), else None: `value` is ours (a converted folder, a run), read as it is. A revision is refused
  for anything but a Hub name."""
  if is_hub_name(value):
    return download(value, revision, flag, revision_flag)
  if revision:
    raise InputError(f"{revision_flag}={revision} pins a revision of a Hugging Face Hub name, and {flag}={value} is "
                     f"not one; drop {revision_flag}.")
  return os.path.abspath(value) if is_hf_folder(value) else None


def download(name: str, revision: str, flag: str, revision_flag: str) -> str:
  """The snapshot folder of the Hub model `name` at `revision` (default: main) in the Hugging Face cache, with the
  files a conversion reads; refused in one line when the Hub has no such model or revision, or when it cannot be
  reached (HF_HUB_OFFLINE=1, no network) and the cache lacks the model."""
  try:
    import huggingface_hub
    from huggingface_hub import constants, errors
  except ImportError:
    raise EnvironmentUserError(f"{flag}={name} names a Hugging Face Hub model, which huggingface_hub fetches: "
                               f"{INSTALL_HUB}.") from None
  at = f"{flag}={name}" + (f" (revision {revision})" if revision else "")
  fetch = f"hf download {name}" + (f" --revision {revision}" if revision else "")
  try:
    folder = huggingface_hub.snapshot_download(name, revision=revision or None, allow_patterns=HUB_FILES)
    if not any(os.path.isfile(os.path.join(folder, file)) for file in WEIGHT_FILES):
      folder = huggingface_hub.snapshot_download(name, revision=revision or None, allow_patterns=[interop.TORCH_FILE])
  except errors.RevisionNotFoundError:
    raise MissingFileError(f"{at}: the Hub model has no such revision; pass one of its branches, tags or commits as "
                           f"{revision_flag}, or drop it for main.") from None
  except errors.RepositoryNotFoundError:
    raise MissingFileError(f"{at}: no folder of that name here and no model of that name on the Hugging Face Hub "
                           f"(a private or gated one needs `hf auth login`); check the name on https://huggingface.co/"
                           f"{name}.") from None
  except errors.LocalEntryNotFoundError:
    if constants.HF_HUB_OFFLINE:
      raise MissingFileError(f"{at}: HF_HUB_OFFLINE=1 and the Hugging Face cache ({constants.HF_HUB_CACHE}) does not "
                             f"hold it; fetch it once with `{fetch}`, or unset HF_HUB_OFFLINE.") from None
    raise EnvironmentUserError(f"{at}: the Hugging Face Hub ({constants.ENDPOINT}) cannot be reached and its cache "
                               f"({constants.HF_HUB_CACHE}) does not hold it; check the connection, or fetch it with "
                               f"`{fetch}` where the Hub is reachable.") from None
  return folder


def from_hf(src: str, dst: str, clear=lambda: None) -> str:
  """Converts the Hugging Face folder `src` into our pretrained-weights folder `dst`; returns what was written, for
  the caller's closing line. A fine-tuned head keeps what it was trained for (class names and order, problem type,
  class) in dst's head.json: eval, predict and warm starts read its classes in that order, and `--to=hf` writes
  them back. `clear`: empties dst of an earlier conversion's files, once the source has loaded."""
  electra = electra_interop.is_electra_dir(src)
  head = interop.read_head(src)
  model_config, params = (electra_interop if electra else interop).load_hf(src)
  if electra:
    print(f"HF ELECTRA has no pooler: albert/pooler is initialised, untrained ({electra_interop.POOLER_NOTE}).",
          flush=True)
  _check_tokenizer_fits(src, model_config.vocab_size)
  clear()
  pretrained.save_pretrained(dst, model_config, params, head=head.identity() if head else None,
                             family=pretrained.ELECTRA if electra else "albert")
  labels = f" for labels {'|'.join(head.labels)}" if head and head.labels else ""
  trained = f"; an {head.architecture} head{labels}" if head else ""
  return f"{', '.join(sorted(params))}{trained}; {_carry_tokenizer(src, dst)}"


def _tokenizer_file(src: str) -> str | None:
  """The folder's SentencePiece model, else its WordPiece vocab.txt (the released ELECTRA folders'), else None."""
  return next((name for name in (hf_export.SPM_FILE, wordpiece.VOCAB_FILE) if os.path.isfile(os.path.join(src, name))),
              None)


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
  """Copies the folder's SentencePiece model (or WordPiece vocab.txt, as the released ELECTRA folders have) and its
  tokenizer_config.json (do_lower_case) beside the weights, where `pretrained.recorded_tokenizer` finds them:
  fine-tuning from dst and `--to=hf` of it take that tokenizer. Returns what was carried, for the closing line."""
  name = _tokenizer_file(src)
  if name is None:
    return (f"no tokenizer: {src} has no {hf_export.SPM_FILE} nor {wordpiece.VOCAB_FILE}, so runs from {dst} need "
            "data.spm_model and --to=hf needs --spm_model")
  storage.write_atomic(os.path.join(dst, name), storage.path(os.path.join(src, name)).read_bytes())
  settings = os.path.join(src, hf_export.TOKENIZER_CONFIG)
  if os.path.isfile(settings):
    storage.write_atomic(os.path.join(dst, hf_export.TOKENIZER_CONFIG), storage.path(settings).read_text())
  lower = pretrained.recorded_tokenizer(dst)[1]
  return f"its tokenizer {name}, do_lower_case={True if lower is None else lower}"


def converted(value: str, revision: str = "", flag: str = "init_checkpoint",
              revision_flag: str = "init_checkpoint_revision") -> str | None:
  """Our pretrained-weights folder for a Hugging Face folder or Hub name `value`, converted into `cache_dir()` on
  first use and read from there after; None when `value` is ours (a converted folder, a run), read as it is."""
  folder = hf_folder(value, revision, flag, revision_flag)
  if folder is None:
    return None
  if is_hub_name(value):  # a Hub snapshot folder is named after its commit
    from huggingface_hub.file_download import repo_folder_name
    commit = os.path.basename(folder)
    target, origin = os.path.join(cache_dir(), repo_folder_name(repo_id=value, repo_type="model"), commit), (
        f"{value} at commit {commit[:12]}")
  else:
    target, origin = os.path.join(cache_dir(), "folders", _folder_key(folder)), folder
  if pretrained.is_pretrained_dir(target):
    print(f"{flag}={value}: reading its conversion in {target}", flush=True)
    return target
  partial = f"{target}.partial-{os.getpid()}"
  try:
    said = from_hf(folder, partial)
    try:
      os.rename(partial, target)  # whole or not at all; a conversion that another process finished first stays
    except OSError:
      if not pretrained.is_pretrained_dir(target):
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
  (the command line's config object, which `pretrained.with_recorded_model` recognises), so every mode reads it
  as a converted folder and the run's config.json records it (a Hub commit in its path); the revision, now part
  of that path, is cleared. Several processes are refused: each host would convert into its own cache."""
  value, revision = config.get("init_checkpoint", ""), config.get("init_checkpoint_revision", "")
  weight_files.check_holds_weights(value, "init_checkpoint")
  if revision and not value:
    raise InputError(f"init_checkpoint_revision={revision} pins a revision of nothing: set "
                     "--config.init_checkpoint=NAME (a Hugging Face Hub model) too, or drop it.")
  if not (is_hub_name(value) or is_hf_folder(value) or revision):
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
