"""Churn: owners coming and going through one store, in a process of its own.

``python -m localstate._bench.churn <json options>`` is the workload (the churn soak in
``tests/faults/test_churn_soak.py`` and ``localstate bench`` run it); `run_churn` starts it and
reads its reports.

It opens a `StateStore` (local durability, ``max_keys_in_memory`` as given) and keeps `live`
triggers running while `owners` distinct ones pass through it: each trigger takes the next
owner number ``i``, reads its watermark (a miss: read through, absent), sets it ``1 + i % 3``
times (the last value is that count) and, for every third owner, a cursor ``{"i": i}``, then
leaves: ``await store.release(owner)``, as the mixin's cleanup does. Each time another
`every` owners have left it reports one tab-separated line on stdout: ``SAMPLE <owners done>
<VmRSS bytes> <cache db bytes> <cache wal bytes> <keys in memory> <evictions> <released
keys>``. At the end it flushes, closes and reports ``DONE <owners> <seconds>``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localstate._bench.child_process import file_bytes, report_line, rss_bytes
from localstate._store import StateStore

__all__ = ["OWNER_PREFIX", "ChurnResult", "ChurnSample", "owner_name", "run_churn", "writes_of"]

OWNER_PREFIX = "trigger:churn:"


def owner_name(i: int) -> str:
    return f"{OWNER_PREFIX}{i:07d}"


def writes_of(i: int) -> int:
    """How many times owner `i` sets its watermark (so its last value)."""
    return 1 + i % 3


async def main(options: dict[str, Any]) -> None:
    cache = Path(options["cache_path"])
    owners, every = int(options["owners"]), int(options["every"])
    store = await StateStore.open(
        central_url=options["central_url"], cache_path=cache, triggerer_id="churn",
        flush_interval=options["flush_interval"], max_keys_in_memory=options["max_keys"],
    )
    started = time.monotonic()
    next_owner = 0
    done = 0

    async def trigger() -> None:
        nonlocal next_owner, done
        while next_owner < owners:
            i = next_owner
            next_owner += 1
            owner = owner_name(i)
            if await store.get(owner, "watermark") is not None:
                raise AssertionError(f"{owner} is new, yet has a watermark")
            for n in range(1, writes_of(i) + 1):
                await store.set(owner, "watermark", n)
                await asyncio.sleep(0)  # the trigger's poll
            if i % 3 == 0:
                await store.set(owner, "cursor", {"i": i})
            report_ = await store.release(owner)
            if report_.unflushed:
                raise AssertionError(f"{owner}: {report_}")
            done += 1
            if done % every == 0:
                s = store.stats()
                report_line("SAMPLE", done, rss_bytes(), file_bytes(cache),
                            file_bytes(cache.with_name(cache.name + "-wal")),
                            s.keys_in_memory, s.evictions, s.released_keys)

    await asyncio.gather(*(trigger() for _ in range(int(options["live"]))))
    await store.close()
    report_line("DONE", done, f"{time.monotonic() - started:.1f}")


@dataclass(frozen=True)
class ChurnSample:
    owners: int
    rss: int
    cache_bytes: int
    keys_in_memory: int


@dataclass
class ChurnResult:
    owners: int
    live: int
    max_keys: int
    seconds: float = 0.0
    samples: list[ChurnSample] = field(default_factory=list)

    def at(self, owners: int) -> ChurnSample:
        """The sample taken when `owners` had passed through (the first one at or after)."""
        return next(s for s in self.samples if s.owners >= owners)

    def as_dict(self) -> dict[str, Any]:
        return {"owners": self.owners, "live": self.live, "max_keys": self.max_keys,
                "seconds": self.seconds, "samples": [s.__dict__ for s in self.samples]}


async def run_churn(*, central_url: str, cache_path: Path, owners: int, live: int = 1000,
                    max_keys: int = 10_000, every: int = 1000, flush_interval: float = 1.0
                    ) -> ChurnResult:
    """Run the workload in a process of its own (its RSS is its own); raise on its failure."""
    options = {"central_url": central_url, "cache_path": str(cache_path), "owners": owners,
               "every": every, "live": live, "max_keys": max_keys,
               "flush_interval": flush_interval}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "localstate._bench.churn", json.dumps(options),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the churn process failed ({proc.returncode}): "
                           f"{err.decode()[-4000:]}")
    result = ChurnResult(owners=0, live=live, max_keys=max_keys)
    for line in out.decode().splitlines():
        fields = line.split("\t")
        if fields[0] == "SAMPLE":
            n, rss, db, wal, keys = (int(f) for f in fields[1:6])
            result.samples.append(ChurnSample(n, rss, db + wal, keys))
        elif fields[0] == "DONE":
            result.owners, result.seconds = int(fields[1]), float(fields[2])
    return result


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
