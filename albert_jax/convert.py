"""Converts weights between other formats (Hugging Face, the original's TF1) and our pretrained-weights directories.

  python -m albert_jax.convert --from=hf --src=HF_DIR --dst=OUR_DIR   # then train/fine-tune from OUR_DIR
  python -m albert_jax.convert --from=hf --src=albert/albert-base-v2 --dst=OUR_DIR  # a Hub name [--revision=REV]
  python -m albert_jax.convert --to=hf --src=OUR_DIR --dst=HF_DIR     # AlbertForPreTraining.from_pretrained(HF_DIR)
  # --to=hf writes the run's tokenizer too (`formats.hf_tokenizer`), checked to give the run's ids; --spm_model=PATH
  # names it where --src records none (a converted directory, synthetic data), --spm_model=none: the weights alone
  # --src may also be a training workdir: a pretraining run's newest checkpoint, a fine-tuning run's best one
  python -m albert_jax.convert --to=hf --encoder_only --src=... --dst=...  # the encoder: AlbertModel, ElectraModel
  python -m albert_jax.convert --from=tf1 --src=TF_DIR --dst=OUR_DIR  # the original's release / TF-Hub checkpoints

A dispatcher over the registered formats (`formats.registry`): --from takes any that reads, --to any that writes.
ELECTRA (transformers' ElectraForPreTraining, ElectraForMaskedLM, ElectraModel; an ELECTRA run's generator goes to
HF_DIR/generator) is the hf format's too. The weight names are the table of `formats.names` (documented in
docs/checkpoints.md).
"""
from __future__ import annotations

import errno
import os

from absl import app, flags

from albert_jax import console, storage
from albert_jax.errors import EnvironmentUserError, ExistsError, InputError, MissingFileError, one_line_user_errors
from albert_jax.formats import registry
from albert_jax.formats.hf import NO_TOKENIZER
from albert_jax.formats.hf_files import CONFIG_FILE
from albert_jax.run import as_run
from albert_jax.weights import store
from albert_jax.weights.resolve import resolve_ours
from data_pipeline import writers

READERS, WRITERS = registry.readers(), registry.writers()


def _described(names: list[str]) -> str:
  return "; ".join(f"{name}: {registry.FORMATS[name].summary}" for name in names)


flags.DEFINE_enum("from", None, READERS,
                  f"Convert from this format into our pretrained-weights directory ({_described(READERS)}).")
flags.DEFINE_enum("to", None, WRITERS,
                  f"Convert our pretrained-weights directory into this format ({_described(WRITERS)}).")
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
                    f"'{NO_TOKENIZER}': the weights alone, no tokenizer.")
FLAGS = flags.FLAGS


def _check_dst_apart(src: str, dst: str) -> None:
  """Refuses a --dst that is, holds or lies in --src or a training workdir (a folder with checkpoints/), even with
  --overwrite: the converted config.json would replace the run's, which then could not resume."""
  writers.check_apart("--dst", dst, "--src", src, "the conversion")
  folders = [writers.resolved(dst)]  # --dst and the folders above it (in its bucket for a URL)
  while (parent := os.path.dirname(folders[-1])) != folders[-1] and storage.is_remote(parent) == storage.is_remote(dst):
    folders.append(parent)
  for folder in folders:
    if storage.path(as_run(folder).checkpoints).is_dir():
      where = "is" if folder == folders[0] else "is inside"
      raise InputError(f"--dst={dst} {where} the training workdir {folder} (it has checkpoints/); writing there would "
                       "overwrite the run's files: choose a directory outside it.")


def convert(source: str | None, target: str | None, src: str | None, dst: str | None, overwrite: bool = False,
            encoder_only: bool = False, spm_model: str | None = None, revision: str | None = None):
  """Checks the arguments (ValueError/FileNotFoundError/FileExistsError naming the fix), then converts; one
  conversion writes --dst at a time (`writers.WriterLock`). --src may be a name that the --from format locates (a
  Hugging Face Hub name, `--revision` pinning it)."""
  if (source is None) == (target is None):
    raise InputError(f"Pass exactly one of {', '.join(f'--from={f}' for f in READERS)} (into ours) or "
                     f"{', '.join(f'--to={f}' for f in WRITERS)} (ours -> {' or '.join(map(str.upper, WRITERS))}).")
  for name, value in (("encoder_only", encoder_only), ("spm_model", spm_model)):
    if value and source:
      raise InputError(f"--{name} applies to {' or '.join(f'--to={f}' for f in WRITERS)}; drop it for --from.")
  fmt = registry.get(source or target)
  if revision and not (source and fmt.locate):
    located = " or ".join(f"--from={f.name}" for f in registry.FORMATS.values() if f.read and f.locate)
    raise InputError(f"--revision applies to {located} with a Hugging Face Hub name; drop it.")
  if not src or not dst:
    raise InputError("Pass both --src (directory to read) and --dst (directory to write).")
  if source and fmt.locate:
    src = fmt.locate(src, revision or "", "--src", "--revision") or src
  theirs = src if source else dst
  if fmt.local and storage.is_remote(theirs):
    raise InputError(f"{theirs}: {fmt.local}; copy it with `gcloud storage cp -r` (our side, --src/--dst, may be "
                     "gs://).")
  if not storage.path(src).is_dir():
    raise MissingFileError(f"--src={src} is not a directory.")
  if storage.path(dst).exists() and not storage.path(dst).is_dir():
    raise ExistsError(f"--dst={dst} is a file; pass a directory (it is created if missing).")
  _check_dst_apart(src, dst)
  weights = None if source else resolve_ours(src)  # refused here, before --dst is touched, unless ours
  with writers.WriterLock(os.path.join(dst, writers.LOCK_FILE), f"--dst={dst}", "--dst"):
    earlier = _earlier_files(dst, overwrite)
    clear = lambda: [storage.path(p).rmtree() if storage.path(p).is_dir() else storage.remove(p) for p in earlier]
    try:
      if source:
        print(f"Wrote {dst} from {src} ({fmt.read(src, dst, clear)}).", flush=True)
      else:
        fmt.write(weights, dst, encoder_only, spm_model, clear)
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
MODEL_FILES = (CONFIG_FILE, store.CONFIG_FILE, store.PARAMS_DIR)
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
