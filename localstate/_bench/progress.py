"""A one-line progress bar on stderr (a plain line per step when stderr is not a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    #: seconds between two status lines when the stream is not a terminal
    QUIET = 5.0

    def __init__(self, total: int, *, label: str = "", stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self.total = max(1, total)
        self.done = 0
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self._tty = self.stream.isatty()
        self._started = time.monotonic()
        self._printed = 0.0

    def step(self, what: str) -> None:
        """Mark one more step done; `what` says what it was."""
        self.done += 1
        self._show(what)

    def status(self, what: str) -> None:
        """Say what a long step is doing, without counting a step (on a terminal the line is
        redrawn each time; elsewhere a line is printed at most every `QUIET` seconds)."""
        now = time.monotonic()
        if not self._tty and now - self._printed < self.QUIET:
            return
        self._show(what)

    def _show(self, what: str) -> None:
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
        self._printed = time.monotonic()
