"""One path layer for local folders and Cloud Storage (`gs://bucket/...`): etils.epath, what orbax, grain and
tfds use already, so every file the project names goes through the same library whatever its scheme. Local paths
behave as before; `gs://` needs the `gcs` extra (gcsfs, google-cloud-storage).

Atomic writes on both: a local file is written under a temporary name and renamed; an object store has no
rename, but an object becomes visible only when its upload completes, so one put is atomic by itself. Objects
cannot be appended to: files that grow (metrics.jsonl, TensorBoard events) live in a local `Mirror` and are
uploaded whole at each sync, so a reader sees the previous or the new complete file, never a partial line.
"""
from __future__ import annotations

import contextlib
import functools
import glob as glob_lib
import io
import os
import shutil
import tempfile
import urllib.parse
from typing import IO, Iterator

import fsspec
from etils import epath

from albert_jax.errors import EnvironmentUserError, InputError

CHECK_TIMEOUT_S = 10.0


@functools.cache
def configure_cloud_storage() -> None:
  """The gs:// client settings, made before the first bucket is used (importing this module changes nothing)."""
  # No cached listings: other processes (other hosts, a resumed run, a reader) write into the same folders, and a
  # stale listing would hide a newer checkpoint step.
  for protocol in ("gcs", "gs"):
    fsspec.config.conf.setdefault(protocol, {})["use_listings_cache"] = False
  if os.environ.get("STORAGE_EMULATOR_HOST"):
    # gcsfs first probes each bucket's type over gRPC with TLS, which a plain-HTTP emulator cannot answer: every
    # probe waits 60 s before gcsfs falls back to the plain JSON API that emulated buckets need anyway.
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


class StorageError(EnvironmentUserError):
  """Cloud Storage cannot be used; the message names the bucket and the fix."""


def is_remote(p: str | os.PathLike) -> bool:
  return "://" in os.fspath(p)


def path(p: str | os.PathLike) -> epath.Path:
  """The path, local or remote; a bucket is checked once per process (`check_bucket`) before its first use."""
  s = os.fspath(p)
  if is_remote(s):
    check_bucket(urllib.parse.urlparse(s).netloc)
  elif "gs:/" in s:
    raise InputError(f"{s!r} is a gs:// URL whose '//' was collapsed (os.path.abspath or normpath do that): "
                     "pass the URL as gs://BUCKET/PATH.")
  return epath.Path(s)


def absolute(p: str | os.PathLike) -> str:
  """os.path.abspath for local paths; URLs unchanged (abspath would turn gs://b/x into ./gs:/b/x)."""
  return str(path(p)) if is_remote(p) else os.path.abspath(p)


@functools.lru_cache(maxsize=None)
def check_bucket(bucket: str) -> None:
  """One listing with a short timeout and no retries: a missing server, bucket, permission or credential fails
  here in seconds with the fix, instead of after minutes of retries deep inside a client."""
  configure_cloud_storage()
  try:
    import gcsfs  # noqa: F401  etils.epath's gs:// backend
    import requests
    from google.api_core import exceptions
    from google.auth import exceptions as auth_exceptions
    from google.cloud import storage as gcs
  except ImportError:
    raise StorageError(f"gs://{bucket}: the Cloud Storage packages are not installed; run "
                       "pip install -e '.[gcs]' (or pip install gcsfs).") from None
  where = os.environ.get("STORAGE_EMULATOR_HOST") or "storage.googleapis.com"
  try:
    list(gcs.Client().list_blobs(bucket, max_results=1, timeout=CHECK_TIMEOUT_S, retry=None))
  except auth_exceptions.DefaultCredentialsError:
    raise StorageError(f"gs://{bucket}: no Google Cloud credentials. On a TPU VM the VM's service account is "
                       "used; elsewhere run `gcloud auth application-default login` or set "
                       "GOOGLE_APPLICATION_CREDENTIALS to a key file.") from None
  except exceptions.NotFound:
    raise StorageError(f"Bucket gs://{bucket} does not exist at {where}; create it with "
                       f"`gcloud storage buckets create gs://{bucket} --location=REGION` (the TPU's region).") from None
  except (exceptions.Forbidden, exceptions.Unauthorized):
    raise StorageError(f"No permission to list gs://{bucket}: grant roles/storage.objectAdmin on the bucket to the "
                       "account in use (`gcloud auth list` shows it).") from None
  except (requests.RequestException, exceptions.GoogleAPIError) as e:
    raise StorageError(f"Cannot reach Cloud Storage at {where} for gs://{bucket} ({type(e).__name__}); check the "
                       "network (or STORAGE_EMULATOR_HOST when using an emulator).") from None


@contextlib.contextmanager
def open_atomic(p: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
  """A file that appears at `p` whole when the block ends without an error (see the module docstring). It is
  written locally first: under `p`.tmp, recreated so that a symlink there is replaced, never written through;
  or, for a remote `p`, in a temporary file that is then uploaded in one put."""
  remote = is_remote(p)
  if remote:
    path(p)  # checks the bucket before any work
    fd, tmp = tempfile.mkstemp(prefix="albert_jax_upload_")
    os.close(fd)
  else:
    os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    tmp = f"{os.fspath(p)}.tmp"
    if os.path.lexists(tmp):
      os.unlink(tmp)
  try:
    with open(tmp, mode, encoding=None if "b" in mode else "utf-8") as f:
      yield f
    if remote:
      with open(tmp, "rb") as fin, path(p).open("wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 24)
    else:
      os.replace(tmp, p)
  finally:
    if remote or os.path.lexists(tmp):
      os.unlink(tmp)


def write_atomic(p: str | os.PathLike, data: str | bytes) -> None:
  with open_atomic(p, "w" if isinstance(data, str) else "wb") as f:
    f.write(data)


def create_new_object(url: str, data: str) -> bool:
  """Uploads `data` to the gs:// `url` only if no object is there (the precondition `ifGenerationMatch=0`, checked
  by the server, so of two writers starting together exactly one succeeds); False if one is there."""
  from google.api_core import exceptions
  from google.cloud import storage as gcs
  parts = urllib.parse.urlparse(url)
  check_bucket(parts.netloc)
  try:
    gcs.Client().bucket(parts.netloc).blob(parts.path.lstrip("/")).upload_from_string(data, if_generation_match=0)
  except exceptions.PreconditionFailed:
    return False
  return True


def copy_atomic(src: str | os.PathLike, dst: str | os.PathLike) -> None:
  """Copies a file from and to anywhere (local or remote), atomically at `dst`."""
  with path(src).open("rb") as fin, open_atomic(dst, "wb") as fout:
    shutil.copyfileobj(fin, fout, 1 << 24)


def remove(p: str | os.PathLike) -> None:
  """Deletes a file (a local symlink itself, not its target) if it exists."""
  if is_remote(p):
    path(p).unlink(missing_ok=True)
  elif os.path.lexists(p):
    os.unlink(p)


def open_read(p: str | os.PathLike) -> IO[bytes]:
  """A binary reader with the whole io interface (readline(limit), relative seeks), for objects too."""
  return io.BufferedReader(path(p).open("rb"), 1 << 20) if is_remote(p) else open(p, "rb")


def glob(pattern: str) -> list[str]:
  """Sorted matches of a pattern; in a URL, wildcards go in the last component only (gs://b/books/*.txt)."""
  if not is_remote(pattern):
    return sorted(glob_lib.glob(os.path.expanduser(pattern)))
  folder, name = pattern.rsplit("/", 1)
  return sorted(os.fspath(p) for p in path(folder).glob(name))


def size_and_mtime_ns(p: str | os.PathLike) -> tuple[int, int]:
  """Object stores keep modification times in whole seconds; local files keep nanoseconds, as before."""
  if is_remote(p):
    stat = path(p).stat()
    return stat.length, stat.mtime * 10**9
  stat = os.stat(p)
  return stat.st_size, stat.st_mtime_ns


class Mirror:
  """A local folder whose changed files are uploaded whole to `dest` at each `sync`: how files that grow reach
  an object store. For a local `dest` it is `dest` itself and syncing does nothing. `resume` names files copied
  down first, so that appending continues them."""

  def __init__(self, dest: str, resume: tuple[str, ...] = ()):
    self.dest = dest
    self.remote = is_remote(dest)
    self.local = tempfile.mkdtemp(prefix="albert_jax_mirror_") if self.remote else dest
    os.makedirs(self.local, exist_ok=True)
    self._synced: dict[str, tuple[int, int]] = {}
    for name in resume if self.remote else ():
      if path(dest).joinpath(name).exists():
        copy_atomic(os.path.join(dest, name), os.path.join(self.local, name))

  def sync(self) -> None:
    if not self.remote:
      return
    for folder, _, names in os.walk(self.local):
      for name in names:
        local = os.path.join(folder, name)
        stat = os.stat(local)
        if self._synced.get(local) != (stat.st_size, stat.st_mtime_ns):
          copy_atomic(local, os.path.join(self.dest, os.path.relpath(local, self.local)))
          self._synced[local] = (stat.st_size, stat.st_mtime_ns)

  def close(self) -> None:
    if self.remote:
      self.sync()
      shutil.rmtree(self.local, ignore_errors=True)
