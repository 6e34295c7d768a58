"""Hugging Face folders and Hub names, wherever weights are taken (`init_checkpoint`, `convert --from=hf --src`).

A transformers `save_pretrained` folder (config.json with model.safetensors, its shards or pytorch_model.bin;
spiece.model or WordPiece's vocab.txt, and tokenizer_config.json) is read where it is; a Hub name such as
`albert/albert-base-v2` is resolved by huggingface_hub into its cache (HF_HOME): online it fetches what the cache
lacks, with progress bars; with HF_HUB_OFFLINE=1 it reads the cache alone. A revision (branch, tag or commit) pins a
name: `init_checkpoint_revision`, `--revision`.
"""
from __future__ import annotations

import os

from albert_jax import storage
from albert_jax.errors import EnvironmentUserError, InputError, MissingFileError
from albert_jax.formats import conversions, hf_tokenizer
from albert_jax.formats.hf_files import CONFIG_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX, TORCH_FILE
from albert_jax.weights import store
from data_pipeline import wordpiece

WEIGHT_FILES = (SAFETENSORS_FILE, SAFETENSORS_INDEX, TORCH_FILE)
# What a conversion reads of a Hub model: its config, its safetensors weights (whole or sharded), its tokenizer.
# pytorch_model.bin is fetched only for a model without safetensors (often both are there, the same weights).
HUB_FILES = [CONFIG_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX, "model-*-of-*.safetensors",
             hf_tokenizer.SPM_FILE, wordpiece.VOCAB_FILE, hf_tokenizer.TOKENIZER_CONFIG]
INSTALL_HUB = 'pip install -e ".[hf]"'


def cache_dir() -> str:
  """Where converted Hugging Face weights are kept: $XDG_CACHE_HOME/albert_jax/hf (default ~/.cache)."""
  return conversions.cache_dir("hf")


def is_hf_folder(path: str) -> bool:
  """A local transformers folder: config.json and weights, and not our layout (model_config.json + params/)."""
  if not path or storage.is_remote(path) or not os.path.isdir(path) or store.is_pretrained_dir(path):
    return False
  return os.path.isfile(os.path.join(path, CONFIG_FILE)) and any(
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
      folder = huggingface_hub.snapshot_download(name, revision=revision or None, allow_patterns=[TORCH_FILE])
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
