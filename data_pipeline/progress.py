"""Progress for the long data phases (SentencePiece training, shard preparation), so a slow machine is told apart
from a hang: a tqdm bar where stderr is a terminal, and otherwise plain lines in the style of the training step
line at most every `every` seconds (readable in a log file or a TPU VM's serial console). With the input's size
known, both say how much of it was read and the time left."""
from __future__ import annotations

import sys
import time

import tqdm


def duration(seconds: float) -> str:
  """`1 h 02 min`, `3 min 05 s`, `42 s`."""
  seconds = int(round(seconds))
  if seconds >= 3600:
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
  if seconds >= 60:
    return f"{seconds // 60} min {seconds % 60:02d} s"
  return f"{seconds} s"


def amount(value: float, unit: str) -> str:
  """`12.3 MB` for bytes, `1,234 records` otherwise."""
  if unit != "bytes":
    return f"{value:,.0f} {unit}"
  for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
    if value >= scale:
      return f"{value / scale:,.1f} {name}"
  return f"{value:,.0f} B"


class Progress:
  """`update(count, position)` as work advances (`position` of `total` input read, when known); `done()` at the
  end. `bar`: a tqdm bar instead of lines (default: when stderr is a terminal)."""

  def __init__(self, label: str, unit: str, total: tuple[int, str] | None = None, every: float = 10.0,
               bar: bool | None = None):
    self.label, self.unit, self.every = label, unit, every
    self.total, self.total_unit = total if total and total[0] > 0 else (None, None)
    self.start = self.last = time.time()
    self.count = 0
    use_bar = sys.stderr.isatty() if bar is None else bar
    self.bar = tqdm.tqdm(total=self.total, desc=label, unit="B" if self.total_unit == "bytes" else "",
                         unit_scale=self.total_unit == "bytes", file=sys.stderr, mininterval=0.5,
                         dynamic_ncols=True) if use_bar else None

  def _line(self, text: str) -> None:
    print(f"{self.label}: {text}", file=sys.stderr, flush=True)

  def update(self, count: int, position: int | None = None) -> None:
    self.count = count
    now = time.time()
    if self.bar is not None:
      if now - self.last >= self.bar.mininterval:
        self.last = now
        self.bar.set_postfix_str(f"{count:,} {self.unit}", refresh=False)
        self.bar.update((position or 0) - self.bar.n)
    elif now - self.last >= self.every:
      self.last = now
      self._line(self.status(count, position, now - self.start))

  def status(self, count: int, position: int | None, seconds: float) -> str:
    """`12,345 documents read (1,234/s), 40% of 1.2 GB, 15 s left` (the bar shows the same its own way)."""
    text = f"{count:,} {self.unit} ({count / max(seconds, 1e-9):,.0f}/s)"
    if self.total and position:
      fraction = min(position / self.total, 1.0)
      left = seconds * (1 - fraction) / fraction
      text += f", {fraction:.0%} of {amount(self.total, self.total_unit)}, {duration(left)} left"
    return text

  def done(self, count: int | None = None) -> float:
    """Ends the bar and says the total and the time it took; returns the seconds."""
    count = self.count if count is None else count
    seconds = time.time() - self.start
    if self.bar is not None:
      self.bar.set_postfix_str(f"{count:,} {self.unit}", refresh=False)
      self.bar.update((self.total or 0) - self.bar.n)
      self.bar.close()
    self._line(f"{count:,} {self.unit} in {duration(seconds)}")
    return seconds
