"""`python -m data_pipeline.download`: fixture files built from ../shared/data, served by an HTTP server on
127.0.0.1 inside the test (`--mirror` points at it), land in the layout the task configs read; a rerun skips what
is whole and fetches again what changed; a cut download resumes; 404, a wrong checksum, no network and a full disk
stop with one line naming the fix."""
import dataclasses
import hashlib
import importlib.util
import http.server
import io
import json
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import types
import zipfile
from pathlib import Path

import pytest

from albert_jax.errors import InputError
from data_pipeline import download, fetch
from experiments import glue as glue_experiment, race as race_experiment
from tests.helpers import REPO, squad_task, task_of

SERVER_LIFETIME_S = 120  # the server shuts itself down after this, whatever the tests do


class Server:
  """Serves `files` ({name: bytes}) under any folder, with Range requests; `cut[name] = n` sends the full length
  but only n bytes, once; `ignore_range` answers 200 with the whole file. `requests` logs (name, Range header)."""

  def __init__(self):
    self.files, self.cut, self.ignore_range, self.requests = {}, {}, False, []
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_GET(self):  # noqa: N802 - http.server's name
        name = self.path.rsplit("/", 1)[-1]
        server.requests.append((name, self.headers.get("Range")))
        if name not in server.files or "/missing/" in self.path:
          self.send_error(404)
          return
        data, start = server.files[name], 0
        if self.headers.get("Range") and not server.ignore_range:
          start = int(self.headers["Range"].split("=")[1].rstrip("-"))
          if start >= len(data):
            self.send_error(416)
            return
          self.send_response(206)
          self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
          self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:start + server.cut.pop(name, len(data))])

      def log_message(self, *args):
        pass

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/mirror"
    threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
    self.timer = threading.Timer(SERVER_LIFETIME_S, self.httpd.shutdown)
    self.timer.start()

  def close(self):
    self.timer.cancel()
    self.httpd.shutdown()
    self.httpd.server_close()


def _zip(folder: str, files: dict[str, bytes]) -> bytes:
  out = io.BytesIO()
  with zipfile.ZipFile(out, "w") as z:
    for name, data in files.items():
      z.writestr(f"{folder}/{name}", data)
  return out.getvalue()


def _fixtures(shared: Path) -> dict[str, bytes]:
  """The sources of rte, ax, mrpc, squad_v1 and race, cut from the real files."""
  glue = shared / "glue"
  rte_dev = (glue / "RTE" / "dev.tsv").read_bytes()
  rte_test = b"".join(line.rsplit(b"\t", 1)[0] + b"\n" for line in rte_dev.splitlines())
  mrpc_train, mrpc_dev = (glue / "MRPC" / "train.tsv").read_bytes(), (glue / "MRPC" / "dev.tsv").read_bytes()
  race = io.BytesIO()
  with tarfile.open(fileobj=race, mode="w:gz") as t:
    for split in ("train", "dev", "test"):
      for level in ("middle", "high"):
        for path in sorted((shared / "race" / "dev" / level).iterdir())[:3]:
          t.add(path, f"RACE/{split}/{level}/{path.name}")
  squad_dev = (shared / "squad" / "dev-v1.1.json").read_bytes()
  small = json.loads(squad_dev)
  small["data"] = small["data"][:1]
  return {
      "RTE.zip": _zip("RTE", {"train.tsv": (glue / "RTE" / "train.tsv").read_bytes(), "dev.tsv": rte_dev,
                              "test.tsv": rte_test}),
      "AX.tsv": b"index\tsentence1\tsentence2\n0\tThe cat sat.\tA cat sat.\n1\tIt rained.\tIt was dry.\n",
      # GLUE's train file holds dev's rows too; the split must give back both files byte for byte.
      "msr_paraphrase_train.txt": mrpc_train + mrpc_dev.split(b"\n", 1)[1],
      "msr_paraphrase_test.txt": mrpc_dev.replace("\ufeff".encode(), b"", 1),
      "dev_ids.tsv": (glue / "MRPC" / "dev_ids.tsv").read_bytes(),
      "train-v1.1.json": json.dumps(small).encode(), "dev-v1.1.json": squad_dev,
      "RACE.tar.gz": race.getvalue(),
  }


def _table(files: dict[str, bytes], names=("rte", "ax", "mrpc", "squad_v1", "race")) -> list:
  """The data sets `names` with the fixtures' checksums in place of the canonical ones."""
  return [dataclasses.replace(download.DATASETS[n], sources=tuple(
      dataclasses.replace(s, sha256=hashlib.sha256(files[s.name]).hexdigest(), size=len(files[s.name]))
      for s in download.DATASETS[n].sources)) for n in names]


@pytest.fixture(scope="module")
def files(shared_data):
  return _fixtures(shared_data)


@pytest.fixture
def server(files):
  s = Server()
  s.files.update(files)
  yield s
  s.close()


def _lines(output, datasets, mirror):
  said = []
  download.download(datasets, str(output), mirror, said.append)
  return said


def test_fetched_layout_is_what_the_tasks_read_and_a_rerun_skips_or_refetches(server, files, shared_data, tmp_path,
                                                                               capsys):
  data = tmp_path / "DATA"
  said = _lines(data, _table(files), server.url)
  assert said[:2] == [f"rte: fetching {server.url}/RTE.zip", f"rte: {data}/glue/RTE (3 files)"]
  assert f"race: {data}/RACE (18 files)" in said
  assert "RTE.zip: 1,023,657 bytes in 0 s" in capsys.readouterr().err  # the progress's last line
  rte = task_of(glue_experiment, f"task=rte,data={data}/glue")
  assert [len(rte.read_examples(rte.split_path(s), s != "test")) for s in ("train", "dev", "test")] == [2490, 277, 277]
  mnli_companion = task_of(glue_experiment, f"task=ax,data={data}/glue")
  assert len(mnli_companion.read_examples(mnli_companion.split_path("test"), False)) == 2
  for name in ("train.tsv", "dev.tsv"):  # GLUE's split of the MSR files, as the real folder holds it
    assert (data / "glue/MRPC" / name).read_bytes() == (shared_data / "glue/MRPC" / name).read_bytes()
  mrpc = task_of(glue_experiment, f"task=mrpc,data={data}/glue")
  assert len(mrpc.read_examples(mrpc.split_path("test"), False)) == 408
  squad = squad_task(1, data / "squad")
  assert len(squad.read_examples(squad.split_path("dev"))) == 10570
  race = task_of(race_experiment, f"data={data}/RACE", max_qa_length=8)
  questions = sum(len(json.loads(p.read_text())["questions"]) for level in ("middle", "high")
                  for p in sorted((shared_data / "race/dev" / level).iterdir())[:3])
  assert len(race.read_examples(race.split_path("test"), True)) == questions
  manifest = json.loads((data / "downloads.json").read_text())
  assert set(manifest) == {"rte", "ax", "mrpc", "squad_v1", "race"}
  assert manifest["rte"]["files"]["glue/RTE/dev.tsv"] == fetch.sha256_of(shared_data / "glue/RTE/dev.tsv")
  assert manifest["rte"]["sources"] == {"RTE.zip": hashlib.sha256(files["RTE.zip"]).hexdigest()}
  assert not (data / ".downloads").exists()  # no archive, no .part, no staging, no lock left

  served = len(server.requests)
  said = _lines(data, _table(files), server.url)
  assert len(server.requests) == served and all("done already" in line for line in said), said
  (data / "glue/RTE/dev.tsv").write_text("damaged")
  said = _lines(data, _table(files), server.url)
  assert [name for name, _ in server.requests[served:]] == ["RTE.zip"]
  assert "rte: glue/RTE/dev.tsv differs from the recorded sha256; fetching it again" in said
  assert (data / "glue/RTE/dev.tsv").read_bytes() == (shared_data / "glue/RTE/dev.tsv").read_bytes()


def test_a_cut_download_resumes_and_a_bad_partial_file_restarts(server, files, tmp_path):
  race = _table(files, ("race",))
  server.cut["RACE.tar.gz"] = 3000
  with pytest.raises(fetch.DownloadError, match=r"RACE.tar.gz ended after 3.0 kB of 7.3 kB; rerun the same command to continue: it resumes"):
    _lines(tmp_path, race, server.url)
  part = tmp_path / ".downloads" / "RACE.tar.gz.part"
  assert part.stat().st_size == 3000 and not (tmp_path / "RACE").exists() and "race" not in download.read_manifest(
      str(tmp_path))
  _lines(tmp_path, race, server.url)
  assert server.requests[-1] == ("RACE.tar.gz", "bytes=3000-")
  assert (tmp_path / "RACE/dev/high").is_dir() and not part.exists()

  # A partial file whose bytes are wrong: continued, found wrong, fetched again from the start.
  shutil.rmtree(tmp_path / "RACE")
  (tmp_path / "downloads.json").unlink()
  part.write_bytes(b"x" * 100)
  _lines(tmp_path, race, server.url)
  assert server.requests[-2:] == [("RACE.tar.gz", "bytes=100-"), ("RACE.tar.gz", None)]
  assert (tmp_path / "RACE/dev/high").is_dir()

  # A server that ignores Range sends the whole file: the partial one is restarted, not appended to.
  shutil.rmtree(tmp_path / "RACE")
  (tmp_path / "downloads.json").unlink()
  part.write_bytes(files["RACE.tar.gz"][:100])
  server.ignore_range = True
  _lines(tmp_path, race, server.url)
  assert server.requests[-1] == ("RACE.tar.gz", "bytes=100-") and (tmp_path / "RACE/dev/high").is_dir()


def _cli_error(*args) -> str:
  result = subprocess.run([sys.executable, "-m", "data_pipeline.download", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
  last = result.stderr.splitlines()[-1]
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  assert last.startswith("data_pipeline.download: error: "), result.stderr
  return last


def test_a_wrong_checksum_is_refused_in_one_line_and_leaves_no_file(server, tmp_path):
  """The fixture's train-v1.1.json is not the canonical one, whose sha256 the code pins."""
  line = _cli_error("--tasks=squad_v1", f"--output={tmp_path}", f"--mirror={server.url}")
  sha256 = hashlib.sha256(server.files["train-v1.1.json"]).hexdigest()
  assert line == (f"data_pipeline.download: error: {server.url}/train-v1.1.json has sha256 {sha256}, expected "
                  "3527663986b8295af4f7fcdff1ba1ff3f72d07d61a20f487cb238a6ef92fd955: the file was damaged on the way "
                  "or the source serves another file; rerun to fetch it again, or fetch it from another copy with "
                  "--mirror=<a folder or URL holding train-v1.1.json>.")
  assert not (tmp_path / ".downloads").exists() and not (tmp_path / "squad").exists()


def test_404_no_network_and_a_full_disk_name_the_fix(server, files, tmp_path, monkeypatch):
  line = _cli_error("--tasks=ax", f"--output={tmp_path}", f"--mirror={server.url}/missing")
  assert line.endswith(f"HTTP 404 (Not Found) for {server.url}/missing/AX.tsv: the file is not at that address; "
                       "check --mirror, or fetch it by hand into the output folder's .downloads/.")
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
  with pytest.raises(fetch.DownloadError, match=rf"cannot reach 127.0.0.1:{closed} for .*AX.tsv .*check the network"):
    _lines(tmp_path, _table(files, ("ax",)), f"http://127.0.0.1:{closed}")
  ax = _table(files, ("ax",))[0]
  moved = dataclasses.replace(ax.sources[0], url=f"{server.url}/missing/AX.tsv", fallbacks=(f"{server.url}/AX.tsv",))
  said = _lines(tmp_path / "moved", [dataclasses.replace(ax, sources=(moved,))], None)
  assert said[1] == (f"ax: HTTP 404 (Not Found) for {server.url}/missing/AX.tsv: the file is not at that address; "
                     "check --mirror, or fetch it by hand into the output folder's .downloads/. Trying the next "
                     "address.")
  assert said[2:] == [f"ax: fetching {server.url}/AX.tsv", f"ax: {tmp_path}/moved/glue/diagnostic (1 file)"]
  with pytest.raises(fetch.DownloadError, match=r"no space left on the disk of .* \(this step needs about 1.0 MB\); free some space or pass --output="):
    monkeypatch.setattr(fetch.shutil, "disk_usage", lambda _: types.SimpleNamespace(free=0))
    _lines(tmp_path, _table(files, ("rte",)), server.url)
  with pytest.raises(InputError, match=r"--output=gs://b/data: download to a local folder, then copy it"):
    download.download([], "gs://b/data")
  with pytest.raises(InputError, match=r"--tasks: unknown 'sst2'; choose from glue, squad, race, cola, sst-2"):
    download.selected("rte,sst2")
  assert [d.name for d in download.selected("squad, rte,glue")] == [*download.GROUPS["glue"], "squad_v1", "squad_v2"]


def test_a_local_folder_as_mirror(files, tmp_path):
  mirror = tmp_path / "copy"
  mirror.mkdir()
  with pytest.raises(fetch.DownloadError, match=r"copy/AX.tsv cannot be read .*put the file there, or drop --mirror"):
    _lines(tmp_path / "DATA", _table(files, ("ax",)), str(mirror))
  (mirror / "AX.tsv").write_bytes(files["AX.tsv"])
  _lines(tmp_path / "DATA", _table(files, ("ax",)), str(mirror))
  assert (tmp_path / "DATA/glue/diagnostic/diagnostic.tsv").read_bytes() == files["AX.tsv"]


def test_pinned_checksums_are_tensorflow_datasets_ones_and_the_real_files(shared_data):
  """Every source's sha256 and size as tensorflow_datasets pins them for the same file (QQP-clean.zip is its
  QQP.zip, AX.tsv and dev_ids.tsv are its copies from GLUE's older host); the real files we have match too."""
  root = Path(importlib.util.find_spec("tensorflow_datasets").origin).parent  # a dependency; not imported
  pinned, by_url = {}, {}
  for path in [*root.glob("url_checksums/*.txt"), *root.glob("datasets/*/checksums.tsv")]:
    for line in path.read_text().splitlines():
      fields = line.split("\t")
      if len(fields) == 4:
        pinned[fields[3]] = by_url[fields[0]] = (fields[2], int(fields[1]))
  aliases = {"QQP-clean.zip": "QQP.zip", "AX.tsv": "tsvsWithoutLabels_AX.tsv", "dev_ids.tsv": "data_mrpc_dev_ids.tsv"}
  sources = [s for d in download.DATASETS.values() for s in d.sources]
  assert len(sources) == 17
  for s in sources:
    assert pinned[aliases.get(s.name, s.name)] == (s.sha256, s.size), s.name
    assert all(by_url[url] == (s.sha256, s.size) for url in s.fallbacks), s.name
  by_name = {s.name: s.sha256 for s in sources}
  assert fetch.sha256_of(shared_data / "squad/dev-v1.1.json") == by_name["dev-v1.1.json"]
  assert fetch.sha256_of(shared_data / "glue/MRPC/dev_ids.tsv") == by_name["dev_ids.tsv"]
