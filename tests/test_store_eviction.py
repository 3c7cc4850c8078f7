"""A store's bounded working set (`max_keys_in_memory`), and a half-built store's quiet end."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_half_built_store_is_quiet_when_collected(tmp_path: object) -> None:
    # a constructor that raises leaves a half-built object; collecting it prints nothing
    script = textwrap.dedent("""
        import gc
        from localstate import StateStore
        from localstate.errors import LocalStateError
        try:
            StateStore(cache_path="x.db", no_such_setting=1)
        except LocalStateError as exc:
            print("refused:", type(exc).__name__)
        else:
            raise SystemExit("an unknown setting was accepted")
        gc.collect()
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path), env=os.environ,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:")
    assert "Traceback" not in done.stderr
    assert "Exception ignored" not in done.stderr
    assert done.stderr == ""
