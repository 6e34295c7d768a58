"""Helpers for tests that run `albert_jax.main` processes: several as one multi-host job, or one launch at a time
killed and relaunched (fault injection), with what its workdir logged."""
import concurrent.futures
import json
import signal
import socket
import subprocess
import threading
import time

TMP_MARK = ".orbax-checkpoint-tmp"  # in the names of orbax's temporary checkpoint directories
TIMING_FIELDS = {"step_time", "examples_per_sec", "tokens_per_sec", "mfu"}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def communicate_all(procs: list[subprocess.Popen], timeout: float) -> list[str]:
  """Every process's output, read from all pipes at once. Reading them one after another deadlocks once a process
  not yet read fills its pipe (64 KiB): it blocks in write() while its peer waits for it in a collective."""
  with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
    return list(pool.map(lambda p: p.communicate(timeout=timeout)[0], procs))


class Launch:
  """One launch of a victim run (a `cli(..., wait=False)` process), its output (stdout and stderr) read line by
  line as it comes."""

  def __init__(self, proc):
    self.start, self.start_ns = time.monotonic(), time.time_ns()
    self.proc = proc
    self.lines: list[tuple[float, str]] = []
    self.steps = 0  # progress lines seen
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      self.lines.append((self.elapsed(), line.rstrip("\n")))
      self.steps += line.startswith("step ")

  def elapsed(self) -> float:
    return time.monotonic() - self.start

  def saw(self, text: str) -> bool:
    return any(text in line for _, line in list(self.lines))

  def last_step(self) -> int:
    for _, line in reversed(list(self.lines)):
      if line.startswith("step "):
        return int(line.split()[1].split("/")[0])
    return 0

  def kill(self) -> None:
    self.proc.send_signal(signal.SIGKILL)
    self.proc.wait()
    self._reader.join()

  def finish(self) -> int:
    self.proc.wait(timeout=600)
    self._reader.join()
    return self.proc.returncode

  def output(self) -> str:
    return "\n".join(f"{t:6.2f} {line}" for t, line in self.lines)


def records(workdir) -> list[dict]:
  """Every record of the workdir's metrics.jsonl, in order."""
  return [json.loads(line) for line in open(workdir / "metrics.jsonl")]


def without_timing(record: dict) -> dict:
  return {k: v for k, v in record.items() if k not in TIMING_FIELDS}
