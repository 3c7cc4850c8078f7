"""`own_chain_step`: how a flushed row meets a central row of its writer's own chain, as a table.

The one decision both steps of a flush take (the central values read first under ``max``, and
the rows the SQL fence refused): on the base, a replay, the chain further on, or not the own
chain at all (the owner's policy decides). The flushes through it run in
tests/unit/test_central_store.py, tests/unit/test_sync_worker.py and
tests/unit/test_store_versions.py.
"""

from __future__ import annotations

import pytest

from localstate._core.rows import CentralRow, DirtyRow
from localstate._sync.central.fenced_write import OwnChainStep, own_chain_step
from localstate._sync.central.schema import LEGACY_WRITER

ME = "file-a"
OTHER = "file-b"
BY = "triggerer-1"


def central(version: int, writer: str | None = ME, at: float = 100.0,
            by: str = BY) -> CentralRow:
    return CentralRow("o", "k", '"central"', version, at, by, writer)


def row(version: int, base: int, at: float = 100.0, by: str = BY) -> DirtyRow:
    return DirtyRow("o", "k", '"local"', version, base, at, by)


CASES = [
    # (what, central row, flushed row, the flushing file, expected: None = the policy decides)
    ("another file's row", central(5, OTHER), row(6, 4), ME, None),
    ("a row of no file (the CLI, the API)", central(5, None), row(6, 4), ME, None),
    ("a flush of no file", central(5), row(6, 4), None, None),
    ("own row on the base: lands", central(4), row(6, 4), ME, OwnChainStep(False, 4)),
    ("own replay, between base and write", central(5), row(7, 4), ME, OwnChainStep(False, 4)),
    ("own replay, at the write's version", central(7), row(7, 4), ME, OwnChainStep(False, 4)),
    ("own chain further on, the row older", central(9, at=200.0), row(7, 4, at=150.0), ME,
     OwnChainStep(True, 9)),
    ("own chain further on, same time", central(9, at=150.0), row(7, 4, at=150.0), ME,
     OwnChainStep(True, 9)),
    ("own chain further on, the row newer (after a restart)", central(9, at=100.0),
     row(7, 4, at=150.0), ME, OwnChainStep(False, 9)),
    ("own row below the base (rule 1 rules it out)", central(3), row(7, 4), ME, None),
    ("earlier release's row, same triggerer: replay fenced on it",
     central(5, LEGACY_WRITER), row(7, 4), ME, OwnChainStep(False, 5)),
    ("earlier release's row at the write's version", central(7, LEGACY_WRITER), row(7, 4), ME,
     OwnChainStep(False, 7)),
    ("earlier release's row on the base", central(4, LEGACY_WRITER), row(7, 4), ME,
     OwnChainStep(False, 4)),
    ("earlier release's row further on, the row older",
     central(9, LEGACY_WRITER, at=200.0), row(7, 4, at=150.0), ME, OwnChainStep(True, 9)),
    ("earlier release's row of another triggerer", central(5, LEGACY_WRITER, by="t-2"),
     row(7, 4), ME, None),
]


@pytest.mark.parametrize(("central_row", "flushed", "writer", "expected"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_own_chain_step(central_row: CentralRow, flushed: DirtyRow, writer: str | None,
                        expected: OwnChainStep | None) -> None:
    assert own_chain_step(central_row, flushed, writer) == expected


def test_a_replay_fenced_on_its_base_keeps_its_version() -> None:
    """The SQL fence accepts a replay of the file's own rows fenced on the base, and the
    version written is the write's own (no bump): the acknowledged version stays."""
    from localstate._sync.central.fenced_write import next_version

    step = own_chain_step(central(7), row(7, 4), ME)
    assert step is not None
    assert next_version(7, step.fence) == 7
