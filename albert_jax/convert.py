"""Converts weights between Hugging Face ALBERT directories and our pretrained-weights directories.

  python -m albert_jax.convert --from=hf --src=HF_DIR --dst=OUR_DIR   # then train/fine-tune from OUR_DIR
  python -m albert_jax.convert --from=hf --src=albert/albert-base-v2 --dst=OUR_DIR  # a Hub name [--revision=REV]
  python -m albert_jax.convert --to=hf --src=OUR_DIR --dst=HF_DIR     # AlbertForPreTraining.from_pretrained(HF_DIR)
  # --to=hf writes the run's tokenizer too (`hf_export`), checked to give the run's ids; --spm_model=PATH names it
  # where --src records none (a converted directory, synthetic data), --spm_model=none writes the weights alone
  # --src may also be a training workdir: a pretraining run's newest checkpoint, a fine-tuning run's best one
  python -m albert_jax.convert --to=hf --encoder_only --src=... --dst=...  # the encoder: AlbertModel, ElectraModel
  python -m albert_jax.convert --from=tf1 --src=TF_DIR --dst=OUR_DIR  # the original's release / TF-Hub checkpoints

ELECTRA (transformers' ElectraForPreTraining, ElectraForMaskedLM, ElectraModel; an ELECTRA run's generator goes to
HF_DIR/generator) is `electra_interop`'s. The name mappings are `interop.name_map` and `electra_interop`'s
(documented in docs/checkpoints.md).
"""
from __future__ import annotations

import errno
import os

from absl import app, flags

from albert_jax import (checkpointing, console, electra_interop, head_identity, hf_export, hf_import, interop,
                        pretrained, run_config, storage, tf1)
from albert_jax.errors import EnvironmentUserError, ExistsError, InputError, MissingFileError, one_line_user_errors
from albert_jax.model_config import ModelConfig
from data_pipeline import writers

FORMATS = ["hf"]
SOURCES = FORMATS + ["tf1"]
flags.DEFINE_enum("from", None, SOURCES, "Convert from this format into our pretrained-weights directory "
                  "(tf1: a TF1 checkpoint + albert_config.json, as in the original's release tarballs and TF-Hub "
                  "modules; TensorFlow is not needed).")
flags.DEFINE_enum("to", None, FORMATS, "Convert our pretrained-weights directory into this format.")
flags.DEFINE_string("src", None, "Directory to read; with --from=hf also a Hugging Face Hub name such as "
                    "albert/albert-base-v2 (fetched into the Hugging Face cache; HF_HUB_OFFLINE=1 reads the cache "
                    "alone).")
flags.DEFINE_string("revision", None, "--from=hf with a Hub name: the branch, tag or commit to convert (default: "
                    "main).")
flags.DEFINE_string("dst", None, "Directory to write.")
flags.DEFINE_bool("overwrite", False, "Replace an earlier conversion in --dst: its files that this one does not "
                  "write are removed (a --dst holding no model is refused).")
flags.DEFINE_bool("encoder_only", False, "--to=hf: write the encoder alone (an AlbertModel; an ElectraModel for an "
                  "ELECTRA run or backbone), dropping any head; for heads transformers has no class for, such as "
                  "SQuAD v2's answer-class head.")
flags.DEFINE_string("spm_model", None, "--to=hf: the SentencePiece model to export with the weights where --src "
                    "records none (its run's config.json data.spm_model, or its prepared data, name it otherwise); "
                    "'none': the weights alone, no tokenizer.")
FLAGS = flags.FLAGS
NO_TOKENIZER = "none"
PASS_WORKDIR = "pass a training workdir as albert_jax.main wrote it"


def from_hf(src: str, dst: str, clear=lambda: None) -> None:
  """`hf_import.from_hf`, said in one closing line."""
  said = hf_import.from_hf(src, dst, clear)
  print(f"Wrote {dst} from {src} ({said}).", flush=True)


def from_tf1(src: str, dst: str, clear=lambda: None) -> None:
  if storage.is_remote(src):
    raise InputError(f"--src={src}: the TF1 reader reads local files; copy the release folder with "
                     "`gcloud storage cp -r` first (--dst may be gs://).")
  model_config, params = tf1.load_tf1(src)
  clear()
  pretrained.save_pretrained(dst, model_config, params)
  print(f"Wrote {dst} from {src} ({', '.join(sorted(params))}).", flush=True)


def to_hf(src: str, dst: str, encoder_only: bool = False, spm_model: str | None = None, clear=lambda: None) -> None:
  """The weights, and the tokenizer they were trained with once its export is checked to give the run's ids; then
  the folder, loaded as transformers loads it, is checked again (`hf_export.check_loaded`)."""
  run, best = src, None if pretrained.is_pretrained_dir(src) else head_identity.read_best(src)
  if best is not None:  # a fine-tuning workdir: its best dev checkpoint, with its task's head
    src = head_identity.best_weights(src, best)
  electra = electra_interop.run_weights(src, PASS_WORKDIR)  # an ELECTRA run: both towers and its generator's width
  model_config, params = electra[:2] if electra else _our_weights(src)
  as_electra = electra is not None or electra_interop.holds_electra_heads(params) or (
      set(params) == {"albert"} and pretrained.backbone_family(src) == pretrained.ELECTRA)  # an ElectraModel
  tokenizer = None if spm_model == NO_TOKENIZER else hf_export.run_tokenizer(run, spm_model)
  if encoder_only:
    params, head = {"albert": params["albert"]}, None
  else:
    head = interop.finetuned_head(src)  # a converted head's, or WORKDIR/best/step_N's task's HF class
  max_length = model_config.max_position_embeddings
  if tokenizer:
    hf_export.check_tokenizer(tokenizer, model_config.vocab_size, max_length)
  clear()
  if as_electra:
    for folder in electra_interop.save_hf(model_config, params, dst, electra and electra[2], head)[1:]:
      hf_export.check_loaded(None, folder, f"remove what else --dst={dst} holds and convert again")
      print(f"The generator went to {folder} (ElectraForMaskedLM).", flush=True)
    print(f"HF ELECTRA has no pooler: albert/pooler is not written ({electra_interop.POOLER_NOTE}).", flush=True)
  else:
    interop.save_hf(model_config, params, dst, head=head)
  said = "no tokenizer (--spm_model=none)"
  if tokenizer:
    hf_export.save_tokenizer(tokenizer, dst, max_length)
  checked = hf_export.check_loaded(tokenizer, dst, f"remove what else --dst={dst} holds and convert again")
  if tokenizer:
    said = (f"the tokenizer of {tokenizer.model_path}, do_lower_case={tokenizer.do_lower_case}, checked to give its "
            f"ids through {checked}")
  print(f"Wrote {dst} from {src} ({', '.join(sorted(params))}; {said}).", flush=True)


def _our_weights(src: str):
  """(ModelConfig, params) of a `convert`/`save_pretrained` directory, or of a pretraining workdir (its newest
  checkpoint, the model from its config.json)."""
  if pretrained.is_pretrained_dir(src) or not storage.path(checkpointing.checkpoint_dir(src)).is_dir():
    return pretrained.load_pretrained(src)
  if not run_config.exists(src):
    raise MissingFileError(f"--src={src} has checkpoints/ but no config.json, which names the run's model: "
                           f"{PASS_WORKDIR} (config.json next to checkpoints/).")
  model = run_config.read(src, "--src", PASS_WORKDIR)["model"]
  return ModelConfig.from_mapping(model), pretrained.load_init_params(src, name="--src")


def _check_dst_apart(src: str, dst: str) -> None:
  """Refuses a --dst that is, holds or lies in --src or a training workdir (a folder with checkpoints/), even with
  --overwrite: the converted config.json would replace the run's, which then could not resume."""
  writers.check_apart("--dst", dst, "--src", src, "the conversion")
  folders = [writers.resolved(dst)]  # --dst and the folders above it (in its bucket for a URL)
  while (parent := os.path.dirname(folders[-1])) != folders[-1] and storage.is_remote(parent) == storage.is_remote(dst):
    folders.append(parent)
  for folder in folders:
    if storage.path(checkpointing.checkpoint_dir(folder)).is_dir():
      where = "is" if folder == folders[0] else "is inside"
      raise InputError(f"--dst={dst} {where} the training workdir {folder} (it has checkpoints/); writing there would "
                       "overwrite the run's files: choose a directory outside it.")


def convert(source: str | None, target: str | None, src: str | None, dst: str | None, overwrite: bool = False,
            encoder_only: bool = False, spm_model: str | None = None, revision: str | None = None):
  """Checks the arguments (ValueError/FileNotFoundError/FileExistsError naming the fix), then converts; one
  conversion writes --dst at a time (`writers.WriterLock`). With --from=hf, --src may be a Hub name (`hf_import`)."""
  if (source is None) == (target is None):
    raise InputError(f"Pass exactly one of {', '.join(f'--from={f}' for f in SOURCES)} (into ours) or "
                     f"{', '.join(f'--to={f}' for f in FORMATS)} (ours -> HF).")
  for name, value in (("encoder_only", encoder_only), ("spm_model", spm_model)):
    if value and source:
      raise InputError(f"--{name} applies to --to=hf; drop it for --from.")
  if revision and source != "hf":
    raise InputError("--revision applies to --from=hf with a Hugging Face Hub name; drop it.")
  if not src or not dst:
    raise InputError("Pass both --src (directory to read) and --dst (directory to write).")
  if source == "hf":
    src = hf_import.hf_folder(src, revision or "", "--src", "--revision") or src
  hf_side = src if source == "hf" else dst
  if storage.is_remote(hf_side):
    raise InputError(f"{hf_side}: Hugging Face directories are read and written by transformers, which needs a "
                     "local folder; copy it with `gcloud storage cp -r` (our side, --src/--dst, may be gs://).")
  if not storage.path(src).is_dir():
    raise MissingFileError(f"--src={src} is not a directory.")
  if storage.path(dst).exists() and not storage.path(dst).is_dir():
    raise ExistsError(f"--dst={dst} is a file; pass a directory (it is created if missing).")
  _check_dst_apart(src, dst)
  with writers.WriterLock(os.path.join(dst, writers.LOCK_FILE), f"--dst={dst}", "--dst"):
    earlier = _earlier_files(dst, overwrite)
    clear = lambda: [storage.path(p).rmtree() if storage.path(p).is_dir() else storage.remove(p) for p in earlier]
    try:
      if source:
        {"hf": from_hf, "tf1": from_tf1}[source](src, dst, clear)
      else:
        to_hf(src, dst, encoder_only, spm_model, clear)
    except Exception as e:  # noqa: BLE001 - re-raised unless the disk is full
      if not _disk_full(e):
        raise
      raise EnvironmentUserError(f"Writing --dst={dst} failed: no space left on device ({type(e).__name__}: "
                                 f"{str(e).strip().splitlines()[0][:300]}); free space and run again, which "
                                 "removes what this one left.") from None
    if stale := [os.path.basename(file) for file in earlier if not storage.path(file).exists()]:
      print(f"Removed from --dst={dst} what this conversion does not write: {', '.join(stale)}.", flush=True)


def _disk_full(error: BaseException) -> bool:
  """A full disk, as the OS reports it or as orbax (tensorstore) words it."""
  return (isinstance(error, OSError) and error.errno == errno.ENOSPC) or "No space left on device" in str(error)


# What any conversion leaves in its --dst, even one killed part way: --overwrite replaces such a folder's files.
MODEL_FILES = (interop.CONFIG_FILE, pretrained.CONFIG_FILE, pretrained.PARAMS_DIR)
# What a conversion that failed (a full disk) or was killed leaves: orbax's temporary folder, a file being written.
ORBAX_TEMPORARY, WRITING = ".orbax-checkpoint-tmp", ".tmp"


def _earlier_files(dst: str, overwrite: bool) -> list[str]:
  """What is removed from --dst before writing: a failed conversion's leftovers (ORBAX_TEMPORARY, WRITING), with or
  without --overwrite, and with it everything of an earlier conversion, files and folders (tokenizer files of
  another tool that transformers would read beside the new ones, an onnx/ export of the earlier weights). Refuses a
  --dst holding more without --overwrite, and one that holds no model, whose files are not a conversion's to
  remove."""
  entries = sorted(p for p in storage.path(dst).iterdir() if p.name != writers.LOCK_FILE)
  leftovers = [p for p in entries if ORBAX_TEMPORARY in p.name or p.name.endswith(WRITING)]
  entries = [p for p in entries if p not in leftovers]
  if entries and not overwrite:
    raise ExistsError(f"--dst={dst} is not empty; choose another directory or pass --overwrite.")
  if entries and not {p.name for p in entries} & set(MODEL_FILES):
    names = ", ".join(p.name for p in entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
    raise ExistsError(f"--dst={dst} holds {names} but no model ({', '.join(MODEL_FILES)}); --overwrite replaces an "
                      "earlier conversion, not other files: choose a new or empty directory.")
  return [os.path.join(dst, p.name) for p in leftovers + entries]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}; use --from/--to, --src, --dst.")
  console.install()
  with one_line_user_errors("convert: error: "):
    convert(FLAGS["from"].value, FLAGS.to, FLAGS.src, FLAGS.dst, FLAGS.overwrite, FLAGS.encoder_only, FLAGS.spm_model,
            FLAGS.revision)


if __name__ == "__main__":
  app.run(main)
