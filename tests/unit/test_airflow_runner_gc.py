"""`localstate.airflow._runner_gc`: the trigger runner's start-up heap is frozen once."""

from __future__ import annotations

import json
import subprocess
import sys

# gc.freeze() is process-wide and lasts: it runs in a fresh interpreter, never in pytest's
SCRIPT = """
import gc, json
from localstate.airflow._runner_gc import freeze_startup_heap
before = gc.get_freeze_count()
first = freeze_startup_heap()
frozen = gc.get_freeze_count()
later = [[i] for i in range(1000)]  # made after start-up: stays collectable
second = freeze_startup_heap()
print(json.dumps({"before": before, "first": first, "frozen": frozen, "second": second,
                  "after": gc.get_freeze_count(), "later_tracked": gc.is_tracked(later[0])}))
"""


def test_the_start_up_heap_is_frozen_by_the_first_call_only() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=True, timeout=120)
    got = json.loads(out.stdout)
    assert got["before"] == 0
    assert got["first"] is True
    assert got["frozen"] > 1000  # the modules, classes and functions imported so far
    # a second call (every other trigger opening its state) freezes nothing more
    assert got["second"] is False
    assert got["after"] == got["frozen"]
    assert got["later_tracked"] is True
