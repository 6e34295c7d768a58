"""Fetches the fine-tuning data of the shipped recipes into the layout their configs read:

  python -m data_pipeline.download --tasks=glue,squad,race --output=DATA

gives DATA/glue/<Task>/ (the folders GLUE's download script writes, MRPC split with its official dev ids, the
diagnostic set in DATA/glue/diagnostic/), DATA/squad/{train,dev}-v{1.1,2.0}.json and DATA/RACE/{train,dev,test}/.
The files are the canonical ones (the URLs of GLUE's download script, rajpurkar.github.io, the RACE page at CMU),
each checked against its sha256 (the values pinned by tensorflow_datasets). `--mirror` fetches them from a copy
instead: a folder or URL holding the files under their own names (CoLA.zip, train-v1.1.json, RACE.tar.gz, ...).

Downloads go to DATA/.downloads/ and continue where a killed run stopped; a data set is installed file by file
(each renamed into place whole) and then recorded in DATA/downloads.json with the sha256 of every file. A rerun
skips the data sets whose recorded files are all there and unchanged, and fetches again those that are not.
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import pathlib
import shutil
import tarfile
import zipfile
from typing import Callable

from albert_jax import storage
from albert_jax.errors import InputError
from data_pipeline import cli, writers
from data_pipeline.fetch import DiskFullError, DownloadError, check_free_space, disk_full, fetch, sha256_of

PROG = "data_pipeline.download"
MANIFEST = "downloads.json"
DOWNLOADS = ".downloads"


@dataclasses.dataclass(frozen=True)
class Source:
  url: str
  sha256: str
  size: int
  fallbacks: tuple[str, ...] = ()  # other addresses of the same bytes, tried in turn when `url` fails

  @property
  def name(self) -> str:
    return self.url.rsplit("/", 1)[-1]


@dataclasses.dataclass(frozen=True)
class Dataset:
  """`sources` fetched, `install(paths, staging)` lays them out in `staging` as `folder` (under --output) holds
  them; `expected`: what the task config reads there, checked before anything is moved into place."""
  name: str
  folder: str
  sources: tuple[Source, ...]
  install: Callable[[list[str], str], None]
  expected: tuple[str, ...]


def _extract(paths: list[str], staging: str) -> None:
  """An archive's content without its single top folder (CoLA.zip holds CoLA/...)."""
  (archive,) = paths
  unpacked = os.path.join(staging, ".unpacked")
  if archive.endswith(".zip"):
    with zipfile.ZipFile(archive) as z:
      z.extractall(unpacked)
  else:
    with tarfile.open(archive) as t:
      t.extractall(unpacked, filter="data")
  entries = [e for e in os.listdir(unpacked) if e != "__MACOSX"]
  top = os.path.join(unpacked, entries[0]) if len(entries) == 1 and os.path.isdir(
      os.path.join(unpacked, entries[0])) else unpacked
  for entry in os.listdir(top):
    os.replace(os.path.join(top, entry), os.path.join(staging, entry))
  shutil.rmtree(unpacked)


def _place_as(*names: str) -> Callable[[list[str], str], None]:
  """Plain files, renamed to `names` in order."""
  def install(paths: list[str], staging: str) -> None:
    for path, name in zip(paths, names, strict=True):
      os.replace(path, os.path.join(staging, name))
  return install


def split_mrpc(paths: list[str], staging: str) -> None:
  """What GLUE's download script does with the MSR Paraphrase files: test.tsv re-indexed, and the train file split
  into train.tsv and dev.tsv by the official dev ids (both keep the train file's header; rows stripped of
  surrounding whitespace, in file order). The three source files are kept beside them."""
  train_txt, test_txt, dev_ids_tsv = paths
  with open(dev_ids_tsv, encoding="utf-8") as f:
    dev_ids = {tuple(line.strip().split("\t")) for line in f}
  with open(test_txt, encoding="utf-8") as f:
    next(f)
    rows = [line.strip().split("\t") for line in f]
  lines = [f"{i}\t{id1}\t{id2}\t{s1}\t{s2}\n" for i, (_, id1, id2, s1, s2) in enumerate(rows)]
  _write(os.path.join(staging, "test.tsv"), "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n", lines)
  with open(train_txt, encoding="utf-8") as f:
    header = next(f)
    rows = [line.strip().split("\t") for line in f]
  for name, in_dev in (("train.tsv", False), ("dev.tsv", True)):
    _write(os.path.join(staging, name), header,
           ["\t".join(row) + "\n" for row in rows if (tuple(row[1:3]) in dev_ids) == in_dev])
  for path in paths:
    os.replace(path, os.path.join(staging, os.path.basename(path)))


def _write(path: str, header: str, lines: list[str]) -> None:
  with open(path, "w", encoding="utf-8") as f:
    f.write(header)
    f.writelines(lines)


GLUE_URL = "https://dl.fbaipublicfiles.com/glue/data/"
_STANDARD = ("train.tsv", "dev.tsv", "test.tsv")


def _glue(name: str, folder: str, archive: str, sha256: str, size: int, expected=_STANDARD) -> Dataset:
  return Dataset(name, f"glue/{folder}", (Source(GLUE_URL + archive, sha256, size),), _extract, expected)


# sha256 and sizes as tensorflow_datasets pins them (its url_checksums; tests/test_download.py compares). QQP-clean
# is GLUE's current name for QQP.zip (the same bytes). The fallbacks are the older addresses tensorflow_datasets
# fetches the same bytes from.
DATASETS: dict[str, Dataset] = {d.name: d for d in (
    _glue("cola", "CoLA", "CoLA.zip", "f212fcd832b8f7b435fb991f101abf89f96b933ab400603bf198960dfc32cbff", 376971),
    _glue("sst-2", "SST-2", "SST-2.zip", "d67e16fb55739c1b32cdce9877596db1c127dc322d93c082281f64057c16deaa", 7439277),
    Dataset("mrpc", "glue/MRPC", (
        Source("https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_train.txt",
               "60a9b09084528f0673eedee2b69cb941920f0b8cd0eeccefc464a98768457f89", 1047044),
        Source("https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_test.txt",
               "a04e271090879aaba6423d65b94950c089298587d9c084bf9cd7439bd785f784", 441275),
        Source("https://raw.githubusercontent.com/MegEngine/Models/master/official/nlp/bert/glue_data/MRPC/dev_ids.tsv",
               "971d7767d81b997fd9060ade0ec23c4fc31cbb226a55d1bd4a1bac474eb81dc7", 6222,
               ("https://firebasestorage.googleapis.com/v0/b/mtl-sentence-representations.appspot.com/o/data%2F"
                "mrpc_dev_ids.tsv?alt=media&token=ec5c0836-31d5-48f4-b431-7480817f1adc",))),
            split_mrpc, _STANDARD),
    _glue("sts-b", "STS-B", "STS-B.zip", "e60a6393de5a8b5b9bac5020a1554b54e3691f9d600b775bd131e613ac179c85", 802872),
    _glue("qqp", "QQP", "QQP-clean.zip", "40e7c862c04eb26ee04b67fd900e76c45c6ba8e6d8fab4f8f1f8072a1a3fbae0",
          41696084),
    _glue("mnli", "MNLI", "MNLI.zip", "e7c1d896d26ed6caf700110645df426cc2d8ebf02a5ab743d5a5c68ac1c83633", 312783507,
          ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv", "test_matched.tsv", "test_mismatched.tsv")),
    _glue("qnli", "QNLI", "QNLIv2.zip", "e634e78627a29adaecd4f955359b22bf5e70f2cbd93b493f2d624138a0c0e5f5", 10627589),
    _glue("rte", "RTE", "RTE.zip", "6bf86de103ecd335f3441bd43574d23fef87ecc695977a63b82d5efb206556ee", 697150),
    _glue("wnli", "WNLI", "WNLI.zip", "ae0e8e4d16f4d46d4a0a566ec7ecceccfd3fbfaa4a7a4b4e02848c0f2561ac46", 28999),
    Dataset("ax", "glue/diagnostic", (Source(GLUE_URL + "AX.tsv",
                                             "0e13510b1bb14436ff7e2ee82338f0efb0133ecf2e73507a697dc210db3f05fd",
                                             222257, ("https://bit.ly/2BOtOJ7",)),),
            _place_as("diagnostic.tsv"), ("diagnostic.tsv",)),
    *(Dataset(f"squad_v{major}", "squad", tuple(
        Source(f"https://rajpurkar.github.io/SQuAD-explorer/dataset/{split}-v{version}.json", sha256, size)
        for split, sha256, size in files), _place_as(*(f"{s}-v{version}.json" for s, _, _ in files)),
        tuple(f"{s}-v{version}.json" for s, _, _ in files)) for major, version, files in (
        (1, "1.1", (("train", "3527663986b8295af4f7fcdff1ba1ff3f72d07d61a20f487cb238a6ef92fd955", 30288272),
                    ("dev", "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9", 4854279))),
        (2, "2.0", (("train", "68dcfbb971bd3e96d5b46c7177b16c1a4e7d4bdef19fb204502738552dede002", 42123633),
                    ("dev", "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8", 4370528))))),
    Dataset("race", "RACE", (Source("http://www.cs.cmu.edu/~glai1/data/race/RACE.tar.gz",
                                    "b2769cc9fdc5c546a693300eb9a966cec6870bd349fbc44ed5225f8ad33006e5", 25443609),),
            _extract, tuple(f"{split}/{level}" for split in ("train", "dev", "test") for level in ("middle", "high"))),
)}
GROUPS = {"glue": ("cola", "sst-2", "mrpc", "sts-b", "qqp", "mnli", "qnli", "rte", "wnli", "ax"),
          "squad": ("squad_v1", "squad_v2"), "race": ("race",)}


def selected(tasks: str) -> list[Dataset]:
  """`glue,squad,race` or single data sets (`rte,squad_v2`), in table order, each once."""
  names = set()
  for word in (w.strip().lower() for w in tasks.split(",") if w.strip()):
    if word not in GROUPS and word not in DATASETS:
      raise InputError(f"--tasks: unknown {word!r}; choose from {', '.join([*GROUPS, *DATASETS])}.")
    names.update(GROUPS.get(word, (word,)))
  if not names:
    raise InputError("--tasks is empty; pass e.g. --tasks=glue,squad,race.")
  return [d for name, d in DATASETS.items() if name in names]


def source_url(source: Source, mirror: str | None) -> str:
  """The canonical URL, or the file of that name in `mirror` (a URL or a local folder)."""
  if not mirror:
    return source.url
  base = mirror if "://" in mirror else pathlib.Path(os.path.abspath(mirror)).as_uri()
  return f"{base.rstrip('/')}/{source.name}"


def read_manifest(output: str) -> dict:
  path = os.path.join(output, MANIFEST)
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError:
    return {}  # every data set is then checked by fetching it again


def finished(output: str, entry: dict | None) -> str | None:
  """Why a recorded data set must be fetched again (a file missing or changed), or None if it is whole."""
  if not entry:
    return "not fetched yet"
  for name, sha256 in entry["files"].items():
    path = os.path.join(output, name)
    if not os.path.isfile(path):
      return f"{name} is missing"
    if sha256_of(path) != sha256:
      return f"{name} differs from the recorded sha256"
  return None


def unpacked_bytes(dataset: Dataset) -> int:
  """A bound on the space that unpacking takes: text compresses about 4x in these archives."""
  return 4 * sum(s.size for s in dataset.sources if s.name.endswith((".zip", ".tar.gz")))


def _fetch_source(source: Source, path: str, mirror: str | None, say: Callable[[str], None]) -> None:
  """From the mirror, else from `source.url` and then each fallback until one gives the right bytes."""
  urls = [source_url(source, mirror)] if mirror else [source.url, *source.fallbacks]
  for i, url in enumerate(urls):
    say(f"fetching {url}")
    try:
      return fetch(url, path, source.sha256, source.size)
    except DiskFullError:
      raise
    except DownloadError as e:
      if i == len(urls) - 1:
        raise
      say(f"{e} Trying the next address.")


def fetch_dataset(dataset: Dataset, output: str, mirror: str | None, say: Callable[[str], None]) -> dict:
  """Fetches, checks and installs one data set; returns its manifest entry."""
  downloads = os.path.join(output, DOWNLOADS)
  os.makedirs(downloads, exist_ok=True)
  paths = []
  for source in dataset.sources:
    path = os.path.join(downloads, source.name)
    if not (os.path.exists(path) and sha256_of(path) == source.sha256):
      _fetch_source(source, path, mirror, lambda line: say(f"{dataset.name}: {line}"))
    paths.append(path)
  staging = os.path.join(downloads, f"{dataset.name}.staging")
  shutil.rmtree(staging, ignore_errors=True)
  os.makedirs(staging)
  check_free_space(output, unpacked_bytes(dataset))
  dataset.install(paths, staging)
  missing = [name for name in dataset.expected if not os.path.exists(os.path.join(staging, name))]
  if missing:
    raise DownloadError(f"{dataset.name}: the fetched files hold no {', '.join(missing)}; the source's layout "
                        f"changed: report it, or lay out {dataset.folder} by hand (docs/finetuning.md).")
  files = {}
  for root, _, names in os.walk(staging):
    for name in sorted(names):
      staged = os.path.join(root, name)
      relative = os.path.join(dataset.folder, os.path.relpath(staged, staging)).replace(os.sep, "/")
      files[relative] = sha256_of(staged)
      final = os.path.join(output, relative)
      os.makedirs(os.path.dirname(final), exist_ok=True)
      os.replace(staged, final)
  shutil.rmtree(staging)
  for path in paths:
    storage.remove(path)
  return {"sources": {s.name: s.sha256 for s in dataset.sources}, "files": files}


def download(datasets: list[Dataset], output: str, mirror: str | None = None,
             say: Callable[[str], None] = print) -> None:
  if storage.is_remote(output):
    raise InputError(f"--output={output}: download to a local folder, then copy it (gcloud storage cp -r).")
  os.makedirs(output, exist_ok=True)
  with writers.WriterLock(os.path.join(output, DOWNLOADS, writers.LOCK_FILE), f"--output={output}", "--output", say):
    manifest = read_manifest(output)
    for dataset in datasets:
      reason = finished(output, manifest.get(dataset.name))
      if reason is None:
        say(f"{dataset.name}: done already ({os.path.join(output, dataset.folder)}, "
            f"{_files(manifest[dataset.name])} checked)")
        continue
      if dataset.name in manifest:
        say(f"{dataset.name}: {reason}; fetching it again")
      try:
        manifest[dataset.name] = fetch_dataset(dataset, output, mirror, say)
      except OSError as e:
        if e.errno == errno.ENOSPC:  # while extracting or moving
          raise disk_full(output, unpacked_bytes(dataset)) from None
        raise
      storage.write_atomic(os.path.join(output, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))
      say(f"{dataset.name}: {os.path.join(output, dataset.folder)} ({_files(manifest[dataset.name])})")


def _files(entry: dict) -> str:
  count = len(entry["files"])
  return f"{count} file" + "s" * (count != 1)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--tasks", default="glue,squad,race",
                      help=f"comma-separated: {', '.join(GROUPS)} or single data sets ({', '.join(DATASETS)})")
  parser.add_argument("--output", required=True, help="the data folder (DATA in the fine-tuning commands)")
  parser.add_argument("--mirror", default=None,
                      help="fetch every file from this folder or URL (file names as in the sources) instead")
  args = parser.parse_args(argv)
  cli.run(PROG, lambda: download(selected(args.tasks), args.output, args.mirror, cli.on_stderr(PROG)))


if __name__ == "__main__":
  main()
