"""How busy the machine was during a benchmark: on a shared CPU the ratios move with the load (contention slows
PyTorch's OpenMP threads more than XLA's), so a figure is only reproducible next to the load it was taken under.

`START` is sampled when the benches import this module (their first lines), before the run adds load of its own;
`report()` adds the end and the other processes' share over the whole run. Linux /proc only, no dependency:
"other" = all CPUs' busy time (/proc/stat) minus this process's CPU time and that of the children it waited for.
"""
from __future__ import annotations

import os
import time
from typing import Any, NamedTuple

WINDOW_S = 0.5   # the start/end samples of the others' share: 1% resolution at 100 jiffies/s on 2 cores


class Sample(NamedTuple):
  wall: float
  busy: float | None    # CPU seconds of all cores since boot, None without /proc/stat
  total: float | None
  own: float            # this process's CPU seconds (and its waited-for children's)


def cores() -> int:
  """The machine's cores (the load average counts runnable threads machine-wide, not per process)."""
  return os.cpu_count() or 1


def sample() -> Sample:
  busy = total = None
  try:
    with open("/proc/stat") as f:
      user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    hz = os.sysconf("SC_CLK_TCK")
    busy = (user + nice + system + irq + softirq + steal) / hz   # guest time is already inside user
    total = busy + (idle + iowait) / hz
  except (OSError, ValueError):
    pass
  t = os.times()
  return Sample(time.perf_counter(), busy, total, t.user + t.system + t.children_user + t.children_system)


def others_share(a: Sample, b: Sample) -> float | None:
  """The fraction of all cores' time other processes used between two samples (0: only us, 1: all cores)."""
  if a.total is None or b.total is None or b.total <= a.total:
    return None
  return round(max(0.0, (b.busy - a.busy - (b.own - a.own)) / (b.total - a.total)), 3)


def state(window_s: float = WINDOW_S) -> tuple[dict[str, Any], Sample]:
  """The 1/5/15-minute load average and the others' CPU share over the next `window_s` seconds."""
  first = sample()
  time.sleep(window_s)
  last = sample()
  return {"loadavg": [round(x, 2) for x in os.getloadavg()], "other_cpu_share": others_share(first, last),
          "window_s": window_s}, last


START, _START_SAMPLE = state()


def report(matmul_tflops_per_s: float | None = None) -> dict[str, Any]:
  """What every bench JSON records under environment.machine; `noisy` as `noisy_note` decides."""
  end, last = state()
  out = {"cores": cores(), "start": START, "end": end,
         "other_cpu_share_during_run": others_share(_START_SAMPLE, last),
         "run_s": round(last.wall - _START_SAMPLE.wall, 1), "matmul_tflops_per_s": matmul_tflops_per_s}
  out["noisy"] = noisy_note(out)
  return out


def noisy_note(machine: dict[str, Any] | None = None) -> str | None:
  """The flag "noisy: load X on N cores" when the load at the start, or the others' CPU use during the run (in
  cores), exceeds half the cores; else None. The load at the end is not used: it counts this run's own threads."""
  if machine is None:
    machine = {"cores": cores(), "start": START, "other_cpu_share_during_run": others_share(_START_SAMPLE, sample())}
  n, load = machine["cores"], machine["start"]["loadavg"][0]
  others = (machine["other_cpu_share_during_run"] or 0.0) * n
  if max(load, others) <= n / 2:
    return None
  return f"noisy: load {load:.2f} on {n} cores (other processes used {others:.2f} cores during the run)"
