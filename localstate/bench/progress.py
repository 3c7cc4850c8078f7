"""A one-line progress bar on stderr (a plain line per step when stderr is not a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, total: int, *, label: str = "", stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self.total = max(1, total)
        self.done = 0
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self._tty = self.stream.isatty()
        self._started = time.monotonic()

    def step(self, what: str) -> None:
        """Mark one more step done; `what` says what it was."""
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self._started
        width = 24
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "-" * (width - filled)
        line = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.0f}s  {what}"
        if self._tty:
            self.stream.write("\r\x1b[2K" + line[:160])
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
