"""Progress lines for the long data phases (SentencePiece training, shard preparation), in the style of the
training step line: plain lines on stderr at most every `every` seconds, so logs stay readable in a terminal, a
file or a TPU VM's serial console alike, and a slow machine is told apart from a hang."""
from __future__ import annotations

import sys
import time


class Progress:
  """`update(count)` as work advances; `done(count)` once at the end."""

  def __init__(self, label: str, unit: str, every: float = 10.0):
    self.label, self.unit, self.every = label, unit, every
    self.start = self.last = time.time()

  def _line(self, text: str) -> None:
    print(f"{self.label}: {text}", file=sys.stderr, flush=True)

  def update(self, count: int) -> None:
    now = time.time()
    if now - self.last >= self.every:
      self.last = now
      self._line(f"{count:,} {self.unit} ({count / max(now - self.start, 1e-9):,.0f}/s)")

  def done(self, count: int) -> float:
    seconds = time.time() - self.start
    self._line(f"{count:,} {self.unit} in {seconds:.1f} s")
    return seconds
