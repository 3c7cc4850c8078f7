"""Short GC pauses in Airflow's trigger runner: its start-up heap leaves the collector's scans.

A full (generation 2) collection walks every container object the process holds. In a trigger
runner most of them are made once, at start-up: the modules, classes and functions of Airflow,
its providers and the triggers, which live as long as the process. Walking them is what makes
a full collection pause the trigger loop (issue #20: about 0.2 s, about once a minute, and
Airflow's "async thread was blocked" warning). `freeze_startup_heap` moves the objects alive
when the first trigger opens its state into the permanent generation (``gc.freeze``): the
collector stays on, for everyone's triggers, and later collections walk only what was made
since. The cost: a reference cycle among those start-up objects that becomes garbage later is
never collected (start-up objects rarely do).

``gc.freeze()`` is cheap (it splices the generations' lists onto the permanent one), but
``gc.get_freeze_count()`` walks the whole permanent generation: about 290,000 objects in a
trigger runner, tens of milliseconds on a busy core. This module never counts: it runs as each
trigger opens its state, on the trigger loop.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]

_done = [False]


def freeze_startup_heap() -> bool:
    """Freeze the heap once per process: True for the call that froze it, False after."""
    if _done[0]:
        return False
    _done[0] = True
    gc.freeze()
    return True
