"""One file fetched from a URL (http, https or file) into place: continued where a previous run stopped, checked
against its sha256, and renamed to its final name only when whole and right, so a killed run never leaves a half
file under that name. Every failure is one line naming the fix (no network, an HTTP error, a full disk, a wrong
checksum)."""
from __future__ import annotations

import errno
import hashlib
import http.client
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request

from albert_jax.errors import EnvironmentUserError
from data_pipeline.progress import Progress, amount

CHUNK_BYTES = 1 << 20
TIMEOUT_S = 60.0
RERUN = "rerun the same command to continue"


class DownloadError(EnvironmentUserError):
  """A file could not be fetched; the message names the URL and the fix."""


class ChecksumError(DownloadError):
  """A fetched file is not the expected one."""


class DiskFullError(DownloadError):
  """The output's disk has no room for the next step."""


def sha256_of(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(CHUNK_BYTES), b""):
      digest.update(block)
  return digest.hexdigest()


def disk_full(where: str, needed: int) -> DiskFullError:
  return DiskFullError(f"no space left on the disk of {where} (this step needs about {amount(needed, 'bytes')}); "
                       f"free some space or pass --output=<a folder on a larger disk>, then {RERUN}.")


def check_free_space(folder: str, needed: int) -> None:
  if shutil.disk_usage(folder).free < needed:
    raise disk_full(folder, needed)


def fetch(url: str, dest: str, sha256: str, size: int) -> None:
  """`dest` appears with exactly the bytes whose sha256 is `sha256`, or not at all. Bytes arrive in `dest`.part,
  which a rerun continues with an HTTP Range request (a server that answers with the whole file restarts it). A
  continued file whose checksum is wrong is fetched once more from the start; a fresh one is an error."""
  part = f"{dest}.part"
  check_free_space(os.path.dirname(os.path.abspath(dest)), size - _size(part))
  continued = _download(url, part, size)
  if continued and sha256_of(part) != sha256:
    os.unlink(part)
    _download(url, part, size)
  digest = sha256_of(part)
  if digest != sha256:
    os.unlink(part)
    raise ChecksumError(f"{url} has sha256 {digest}, expected {sha256}: the file was damaged on the way or the "
                        f"source serves another file; rerun to fetch it again, or fetch it from another copy with "
                        f"--mirror=<a folder or URL holding {os.path.basename(dest)}>.")
  os.replace(part, dest)


def _size(path: str) -> int:
  return os.path.getsize(path) if os.path.exists(path) else 0


def _download(url: str, part: str, size: int) -> bool:
  """Fetches `url` into `part`, continuing it if it has bytes; True if it continued them."""
  have = _size(part)
  headers = {"User-Agent": "albert_jax-download"}
  if have:
    headers["Range"] = f"bytes={have}-"
  try:
    response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
  except urllib.error.HTTPError as e:
    if e.code == 416 and have:  # nothing after `have`: the part is whole already, the checksum decides
      return True
    fix = ("the file is not at that address; check --mirror, or fetch it by hand into the output folder's "
           ".downloads/" if e.code == 404 else "the server refused or failed; retry later, or use --mirror")
    raise DownloadError(f"HTTP {e.code} ({e.reason}) for {url}: {fix}.") from None
  except (urllib.error.URLError, OSError) as e:
    reason = getattr(e, "reason", e)
    if url.startswith("file:"):
      raise DownloadError(f"{urllib.request.url2pathname(urllib.parse.urlparse(url).path)} cannot be read "
                          f"({reason}): put the file there, or drop --mirror to fetch from the source.") from None
    raise DownloadError(f"cannot reach {_where(url)} for {url} ({reason}): check the network connection (or a "
                        "proxy: HTTPS_PROXY), or fetch from a copy with --mirror=<folder or URL>.") from None
  continued = have > 0 and getattr(response, "status", None) == 206
  start = have if continued else 0
  length = response.headers.get("Content-Length")
  total = start + int(length) if length else size
  progress = Progress(os.path.basename(part)[:-len(".part")], "bytes", total=(total, "bytes"))
  received = start
  try:
    with response, open(part, "ab" if continued else "wb") as out:
      for block in iter(lambda: response.read(CHUNK_BYTES), b""):
        out.write(block)
        received += len(block)
        progress.update(received, received)
  except OSError as e:
    if e.errno == errno.ENOSPC:
      raise disk_full(os.path.dirname(os.path.abspath(part)), total - received) from None
    raise DownloadError(f"the connection to {_where(url)} broke after {amount(received, 'bytes')} of {url} "
                        f"({e}); {RERUN}: it resumes from there.") from None
  except http.client.HTTPException as e:
    raise DownloadError(f"the connection to {_where(url)} broke after {amount(received, 'bytes')} of {url} "
                        f"({type(e).__name__}); {RERUN}: it resumes from there.") from None
  progress.done(received)
  if length and received < total:
    raise DownloadError(f"{url} ended after {amount(received, 'bytes')} of {amount(total, 'bytes')}; {RERUN}: "
                        "it resumes from there.")
  return continued


def _where(url: str) -> str:
  return urllib.parse.urlparse(url).netloc or url
