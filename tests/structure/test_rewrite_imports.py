"""scripts/rewrite_imports.py, which renamed the modules: the checkout names no old module
(re-run the script after a merge when this fails), its rewrite is idempotent, and it leaves
logger and metric names alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import rewrite_imports  # noqa: E402


def test_the_checkout_names_no_old_module() -> None:
    """Every mention is rewritten: a merged branch that imports `localstate.store` or
    `localstate.sync.worker` fails here until `scripts/rewrite_imports.py` runs again."""
    files = rewrite_imports.files(rewrite_imports.default_paths())
    assert len(files) > 200
    stale = [path.relative_to(ROOT).as_posix() for path in files
             if path.name != "rewrite_imports.py"
             and rewrite_imports.rewrite(text := path.read_text(),
                                         rewrite_imports.module_of(path)) != text]
    assert stale == [], ("run: .venv/bin/python scripts/rewrite_imports.py --mv && "
                         ".venv/bin/python scripts/rewrite_imports.py")


@pytest.mark.parametrize(("before", "after"), [
    ("from localstate.store import StateStore\n", "from localstate._store import StateStore\n"),
    ("from localstate.sync.worker import SyncWorker\n",
     "from localstate._sync.worker import SyncWorker\n"),
    ("from localstate.api import routes\n", "import localstate.api._routes as routes\n"),
    ('"StateStore": "localstate.store",\n', '"StateStore": "localstate._store",\n'),
    ("see `localstate/bench/runner.py` and `localstate/store.py`\n",
     "see `localstate/_bench/runner.py` and `localstate/_store.py`\n"),
    ("from localstate.claims import ClaimBook\n",
     "from localstate._sync.claims import ClaimBook\n"),
    # names that are a logger's or a metric's, not a module's
    ('log = logging.getLogger("localstate.sync.worker")\n',
     'log = logging.getLogger("localstate.sync.worker")\n'),
    ('caplog.set_level(logging.INFO, logger="localstate.store")\n',
     'caplog.set_level(logging.INFO, logger="localstate.store")\n'),
    ('assert statsd.total("localstate.conflicts") == 1\n',
     'assert statsd.total("localstate.conflicts") == 1\n'),
    # public modules keep their names; a longer name is not a shorter one's
    ("from localstate.errors import OwnerLost\nlocalstate.entry_table\n",
     "from localstate.errors import OwnerLost\nlocalstate._entry_table\n"),
])
def test_the_rewrite(before: str, after: str) -> None:
    assert rewrite_imports.rewrite(before) == after
    assert rewrite_imports.rewrite(after) == after  # idempotent


def test_a_logger_keeps_the_name_of_its_module_before_the_renames() -> None:
    text = "log = logging.getLogger(__name__)\n"
    assert rewrite_imports.rewrite(text, "localstate._sync.worker") == (
        'log = logging.getLogger("localstate.sync.worker")\n')
    assert rewrite_imports.rewrite(text, "localstate.api._routes") == (
        'log = logging.getLogger("localstate.api.routes")\n')


def test_the_previous_release_code_is_not_rewritten() -> None:
    writer = ROOT / "tests" / "upgrade" / "old_release_writer.py"
    assert "from localstate.sync.worker import" in writer.read_text()
    assert writer not in rewrite_imports.files(rewrite_imports.default_paths())
