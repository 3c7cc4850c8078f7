"""The chaos tests' diagnosis of a stuck process (tests/support/process_stacks.py): a Python
process started with the hook armed writes its threads' stacks on SIGUSR2, while it blocks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from process_stacks import dump_stacks, stack_dump_env

# "ready" once the main thread's frame is at its sleep (line 11), told by the other thread: a
# "ready" printed by the main thread itself comes a moment before it gets there, and a signal
# landing in that moment shows it still on the print's line
BLOCKED = """
import sys, threading, time
main, deadline = threading.get_ident(), time.monotonic() + 60
def parked_worker():
    while sys._current_frames()[main].f_lineno != 11 and time.monotonic() < deadline:
        time.sleep(0.001)
    print("ready", flush=True)
    threading.Event().wait()

threading.Thread(target=parked_worker, daemon=True).start()
time.sleep(600)
"""


def test_a_blocked_process_and_its_threads_show_where_they_wait(tmp_path: Path) -> None:
    env = {**os.environ, **stack_dump_env(tmp_path / "dumps", os.environ.get("PYTHONPATH", ""))}
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        started = time.monotonic()
        stacks = dump_stacks(proc.pid, tmp_path / "dumps", wait=1.0)
        assert time.monotonic() - started < 60
        assert proc.poll() is None  # the signal did not end it
        assert f"--- pid {proc.pid}" in stacks
        assert "parked_worker" in stacks  # the other thread
        assert 'File "<string>", line 11' in stacks  # the main thread, in its sleep
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
