"""Helpers for tests that run several `albert_jax.main` processes as one multi-host job."""
import concurrent.futures
import socket
import subprocess


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def communicate_all(procs: list[subprocess.Popen], timeout: float) -> list[str]:
  """Every process's output, read from all pipes at once. Reading them one after another deadlocks once a process
  not yet read fills its pipe (64 KiB): it blocks in write() while its peer waits for it in a collective."""
  with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
    return list(pool.map(lambda p: p.communicate(timeout=timeout)[0], procs))
