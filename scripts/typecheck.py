"""mypy over the repository, with the top-level `sync/` checked under its installed name.

`sync/` installs as the subpackage `localstate._sync` (pyproject's `package-dir` mapping); an
editable install reaches it through setuptools' import hook, which mypy does not follow. mypy
names a file after the folders above it, so it would call `sync/flush/worker.py` `sync.worker` and
find no `localstate._sync` at all. This runs mypy exactly as `mypy` would (same configuration,
same arguments, same output and exit status), except that each source under `sync/` is given
its installed module name before the build.

    .venv/bin/python scripts/typecheck.py            # what CI runs
    .venv/bin/python scripts/typecheck.py sync/flush/worker.py tests/unit/test_sync_worker.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent
SYNC_DIR = ROOT / "sync"
SYNC_PACKAGE = "localstate._sync"


def installed_name(source: BuildSource) -> BuildSource:
    """The source renamed to its installed module when it lives under `sync/`."""
    if source.path is None:
        return source
    path = Path(source.path).resolve()
    if not path.is_relative_to(SYNC_DIR):
        return source
    parts = path.relative_to(SYNC_DIR).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return BuildSource(source.path, ".".join((SYNC_PACKAGE, *parts)), source.text,
                       base_dir=str(ROOT))


def sync_sources() -> list[BuildSource]:
    return [BuildSource(str(path), None, base_dir=str(ROOT))
            for path in sorted(SYNC_DIR.rglob("*.py"))]


def main(args: list[str]) -> int:
    started = time.time()
    fscache = FileSystemCache()
    sources, options = process_options(args, fscache=fscache)
    sources = [installed_name(source) for source in sources]
    # mypy follows an import only to a module it can find on its search path, and none of
    # sync/ is there: a selection of files is checked with every module of sync/ beside it
    named = {source.module for source in sources}
    sources += [module for module in map(installed_name, sync_sources())
                if module.module not in named]
    _result, messages, blockers = run_build(sources, options, fscache, started,
                                            sys.stdout, sys.stderr)
    n_errors, _notes, n_files = util.count_stats(messages)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    if n_errors:
        summary = formatter.format_error(n_errors, n_files, len(sources),
                                         blockers=blockers, use_color=options.color_output)
        print(summary, file=sys.stdout)
        return 2 if blockers else 1
    print(formatter.format_success(len(sources), options.color_output), file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
