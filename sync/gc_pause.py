"""`gc_paused`: the cyclic garbage collector held off while a big batch is built and parsed.

A flush of thousands of rows allocates tens of thousands of tuples, lists and strings, and
each allocation burst starts collections that walk every tracked object of the process; none
of these objects forms a cycle. A server answers several flushes at once, so the pause is
counted: the collector is enabled again when the last overlapping pause ends (and only if it
was enabled when the first began).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Final

__all__ = ["GC_PAUSE_BYTES", "gc_paused"]

#: request bodies from this size on are handled with the collector paused (~1,000 rows)
GC_PAUSE_BYTES: Final = 64 * 1024

_pauses = 0
_was_enabled = False


@contextlib.contextmanager
def gc_paused(pause: bool = True) -> Iterator[None]:
    """Hold the collector off inside the block (nested and overlapping blocks count)."""
    global _pauses, _was_enabled
    if not pause:
        yield
        return
    if _pauses == 0:
        _was_enabled = gc.isenabled()
        gc.disable()
    _pauses += 1
    try:
        yield
    finally:
        _pauses -= 1
        if _pauses == 0 and _was_enabled:
            gc.enable()
