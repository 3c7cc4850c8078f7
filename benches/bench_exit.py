"""How long a program takes to exit after its last statement, with its store closed or not.

    python benches/bench_exit.py [--rounds 7] [--json docs/bench-exit.json]

Each round runs one fresh subprocess per case, in turn, on a new cache file and an embedded
SQLite central DB: the program opens a `StateStore`, makes one ``local`` write and 100
``memory`` writes (a 30 s window: none committed yet), prints the time, and then

* ``closed``: closes the store (the baseline: what an exit costs a program that closes it,
  its final flush included);
* ``raised``: raises before ``close()`` (``asyncio.run``), the program's status 1;
* ``left open``: returns with the store open (``asyncio.run``);
* ``run_until_complete``: returns with the store open, its loop only stopped and closed;
* ``blocking``: a `BlockingStateStore` never closed.

The figure is the time from that print to the process's exit, as the parent sees it (its
median over the rounds), and its ratio to the baseline's median in the same run. A program
that hangs at exit would time out (`HUNG` seconds) and be reported as such. Every case also
checks that the cache file holds all 101 writes after the exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy

from localstate._core.version import __version__

HUNG = 60.0
WRITES = 101
CASES = ("closed", "raised", "left open", "run_until_complete", "blocking")

_PROGRAM = r"""
import asyncio, sys, time
from localstate import StateStore
from localstate.blocking import BlockingStateStore

case, folder = sys.argv[1], sys.argv[2]
options = dict(cache_path=f"{folder}/cache.db", central_url=f"sqlite:///{folder}/central.db",
               triggerer_id="bench", memory_window=30.0, flush_interval=600.0)

async def write(store):
    await store.set("o", "k0", 0)
    for i in range(1, WRITES):
        await store.set("o", f"k{i}", i, durability="memory")

async def main():
    store = await StateStore.open(**options)
    await write(store)
    if case == "closed":
        await store.close()
    print(time.monotonic(), flush=True)
    if case == "raised":
        raise RuntimeError("user code failed before close()")
    return store

if case == "run_until_complete":
    loop = asyncio.new_event_loop()
    kept = loop.run_until_complete(main())
    loop.close()
elif case == "blocking":
    blocking = BlockingStateStore(**options)
    blocking.set("o", "k0", 0)
    for i in range(1, WRITES):
        blocking.set("o", f"k{i}", i, durability="memory")
    print(time.monotonic(), flush=True)
else:
    kept = asyncio.run(main())
""".replace("WRITES", str(WRITES))


def run_case(case: str) -> float | None:
    """Seconds from the program's last print to its exit; None if it hung."""
    with tempfile.TemporaryDirectory(prefix="bench-exit-") as folder:
        proc = subprocess.Popen([sys.executable, "-c", _PROGRAM, case, folder],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=HUNG)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return None
        ended = time.monotonic()
        expected = 1 if case == "raised" else 0
        if proc.returncode != expected:
            raise SystemExit(f"{case}: exit status {proc.returncode}\n{err[-2000:]}")
        with contextlib.closing(sqlite3.connect(f"{folder}/cache.db")) as db:
            rows = db.execute("SELECT count(*) FROM state").fetchone()[0]
        if rows != WRITES:
            raise SystemExit(f"{case}: {rows} of {WRITES} writes in the cache file")
        return ended - float(out.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    seconds: dict[str, list[float | None]] = {case: [] for case in CASES}
    for r in range(args.rounds):
        for case in CASES:
            seconds[case].append(run_case(case))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{c} {s:.2f} s" if s is not None else f"{c} HUNG"
            for c, s in ((c, seconds[c][-1]) for c in CASES)), file=sys.stderr)
    baseline = statistics.median(s for s in seconds["closed"] if s is not None)
    results: list[dict[str, Any]] = []
    for case in CASES:
        done = [s for s in seconds[case] if s is not None]
        median = statistics.median(done) if done else None
        results.append({"case": case, "median_s": median,
                        "min_s": min(done) if done else None,
                        "max_s": max(done) if done else None,
                        "hung": len(seconds[case]) - len(done),
                        "x_closed": None if median is None else median / baseline})
    for row in results:
        print(f"{row['case']:>20}: median {row['median_s']:.3f} s "
              f"({row['x_closed']:.2f}x closed), hung {row['hung']}/{args.rounds}")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "rounds": args.rounds, "writes": WRITES, "results": results,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "sqlite": sqlite3.sqlite_version,
                        "sqlalchemy": sqlalchemy.__version__, "localstate": __version__},
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
