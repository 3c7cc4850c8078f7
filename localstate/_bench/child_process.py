"""What a workload in a process of its own tells its parent: one tab-separated line per report
on stdout, with figures about itself (its resident memory, the size of its files).

The benchmarks and the soak tests run their workloads in child processes so that the memory
measured is the workload's alone; they all speak this one line format.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["file_bytes", "report_line", "rss_bytes"]


def report_line(*fields: object) -> None:
    """Write `fields` as one tab-separated line on stdout, unbuffered: a parent reading the
    pipe sees it at once, and a line written before a SIGKILL is never lost in a buffer."""
    os.write(1, ("\t".join(str(f) for f in fields) + "\n").encode())


def rss_bytes() -> int:
    """This process's resident set size (Linux: ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def file_bytes(path: Path) -> int:
    """The size of `path`, 0 while it does not exist (a WAL file comes and goes)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
