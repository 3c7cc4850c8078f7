"""A writer killed after a flush carried its last write to the central DB and before the local
commit of that write: ``python flush_before_commit_writer.py CENTRAL CACHE MARKED``.

A flush does not wait for the local commit of what it carries, so the central DB can get a
write that the cache file never does. This places the SIGKILL there on purpose: it writes
``k`` = 1 and flushes it; with MARKED ``yes`` it then commits the flush's mark-clean to the file
(through a local write of another key, which the same commit carries), so the file holds ``k``
clean at version 1. Then it writes ``k`` = 2 and, in the local writer's commit of that write
(before it reaches the file), flushes and SIGKILLs itself: ``k`` = 1 was acknowledged and is in
the file, 2 is in the central DB only. It prints ``k 1`` once 1 is acknowledged.

It runs under this tree's code (tests/faults) and under the previous release's
(tests/packaging/test_upgrade.py puts that release's source first on the path): only the public
`StateStore` and the local cache's commit, found where each release keeps it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from localstate import StateStore

try:  # the previous release kept it at the package's top (asked first: this tree's editable
    # install would find its own `localstate._cache` under the previous release's package)
    from localstate.local_cache import LocalCache  # type: ignore[import-not-found]
except ImportError:
    from localstate._cache.local_cache import LocalCache

OWNER = "asset_watcher:upgrade"


def killed_after_the_flush(central: str, cache: str, *, marked: bool,
                           release: Path | None = None) -> None:
    """Run this writer in a process of its own (under the previous release's source in
    `release`, if given) and check that it died as planned, with 1 acknowledged."""
    env = dict(os.environ)
    if release is not None:
        env["PYTHONPATH"] = str(release)
    proc = subprocess.run([sys.executable, __file__, central, cache, "yes" if marked else "no"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.split() == ["k", "1"], (proc.stdout, proc.stderr)


async def main(central: str, cache: str, marked: bool) -> None:
    store = await StateStore.open(central_url=central, cache_path=cache,
                                  triggerer_id="triggerer-old", flush_interval=3600.0,
                                  upgrade_schema=True)
    await store.set(OWNER, "k", 1)
    print("k", 1, flush=True)  # acknowledged: committed to the file
    await store.flush()
    if marked:
        await store.set(OWNER, "other", 1)  # its commit carries the mark-clean of k
    commit_batch = LocalCache._commit_batch

    async def flushed_then_killed(self: Any, staged: Any, *rest: Any) -> Any:
        if any(e.data == "2" for e in staged.values()):
            await store.flush()  # the central DB holds 2 now; the file never will
            os.kill(os.getpid(), signal.SIGKILL)
        return await commit_batch(self, staged, *rest)

    LocalCache._commit_batch = flushed_then_killed
    await store.set(OWNER, "k", 2)
    print("k", 2, flush=True)  # never reached


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] == "yes"))
