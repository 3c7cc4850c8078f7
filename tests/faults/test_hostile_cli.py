"""Hostile input through the CLI: ``localstate get/set/delete`` with generated names and JSON.

2,000 examples run through `localstate.cli.main(argv)` in this process (a subprocess each would
take minutes); a handful then run through the installed ``localstate`` command in a subprocess
(argv as bytes, invalid UTF-8 included) and must answer exactly as `main` did. The oracle reads
the central DB directly (`sqlite3`) before and after every call: a refused call (exit 2, 3 or 4)
changed nothing, an accepted ``set`` left the value as JSON decodes it at the next version.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from fault_tally import FaultTally
from hostile import (
    AWKWARD_NAMES,
    FIXED,
    RELAXED,
    Row,
    as_json,
    central_row,
    cli_value_texts,
    json_text,
    name_ok,
    names,
    parse_json_text,
    same_json,
    settle,
    valid_values,
    value_problem,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st
from localstate_cli import localstate_command

from localstate.cli import EXIT_CONFLICT, EXIT_NOT_FOUND, EXIT_USAGE, main

EXAMPLES: Final = 2_000
MAX_VERSION: Final = 2**63 - 1  # versions are 64-bit integers


@dataclass
class CliCase:
    op: str  # set, get, delete
    owner: str
    key: str
    value: str  # the JSON argument of set ("-": read stdin)
    stdin: str
    expected_version: str | None  # set --expected-version, as typed


# "--" itself cannot be a name on the command line: it ends the options, and argparse (3.11)
# gives a second one as an empty list (a lone "--" value is covered by an explicit example)
_CLI_NAMES: Final = st.one_of(st.sampled_from(AWKWARD_NAMES), names()).filter(
    lambda n: n != "--")
_VALID_TEXTS: Final = st.builds(lambda v: json_text(v, ascii_only=False) or "null",
                                valid_values())


# built once: a strategy built inside each draw costs Hypothesis more than the example itself
_OPS: Final = st.sampled_from(["set"] * 5 + ["get", "get", "delete"])
_PAIRS: Final = st.one_of(st.just(FIXED), st.tuples(_CLI_NAMES, _CLI_NAMES))
_TEXTS: Final = st.one_of(_VALID_TEXTS, cli_value_texts())
_VALUES: Final = st.one_of(_TEXTS, st.just("-"))
_EXPECTED: Final = st.one_of(
    st.none(), st.none(), st.sampled_from(["current", "current", "stale"]),
    st.sampled_from(["-1", "1e3", "x", "", " 1", "+0", "99999999999999999999999", "٣"]))


@st.composite
def cli_cases(draw: st.DrawFn) -> CliCase:
    op = draw(_OPS)
    owner, key = draw(_PAIRS)
    value = draw(_VALUES)
    stdin = draw(_TEXTS) if value == "-" else ""
    return CliCase(op, owner, key, value, stdin, draw(_EXPECTED))


def run_main(argv: list[str], stdin: str) -> tuple[int, str, str]:
    """`main(argv)` as the command runs it: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    saved, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: Any = main(argv)
            except SystemExit as exc:  # argparse refusing the command line
                code = exc.code
    finally:
        sys.stdin = saved
    assert isinstance(code, int), f"exit {code!r}"
    return code, out.getvalue(), err.getvalue()


def argv_for(case: CliCase, url: str) -> list[str]:
    argv = [case.op, "--central-url", url]
    if case.op == "set" and case.expected_version is not None:
        argv += ["--expected-version", case.expected_version]
    if case.op != "delete":
        argv.append("--json")
    argv += ["--", case.owner, case.key]  # "--": names may start with "-"
    return [*argv, case.value] if case.op == "set" else argv


def expected_exit(case: CliCase, before: Row | None) -> int:
    """The exit code the documented rules give (0 ok, 2 bad input, 3 not found, 4 conflict)."""
    current = 0 if before is None or before[0] is None else before[1]
    expected_version: int | None = None
    if case.op == "set" and case.expected_version is not None:
        try:
            expected_version = int(case.expected_version)  # what argparse's type= does
        except ValueError:
            return EXIT_USAGE
        if not 0 <= expected_version <= MAX_VERSION:
            return EXIT_USAGE
    if not (name_ok(case.owner) and name_ok(case.key)):
        return EXIT_USAGE
    if case.op != "set":
        return EXIT_NOT_FOUND if current == 0 else 0
    parsed, value = parse_json_text(case.stdin if case.value == "-" else case.value)
    if not parsed or value_problem(value) is not None:
        return EXIT_USAGE
    if expected_version is not None and expected_version != current:
        return EXIT_CONFLICT
    return 0


def check_cli_case(case: CliCase, url: str, db: Path) -> str:
    """Run `case` through `main`; check the exit code and the central DB; return the outcome."""
    names_ok = name_ok(case.owner) and name_ok(case.key)
    before = central_row(db, case.owner, case.key) if names_ok else None
    if case.expected_version in ("current", "stale"):
        current = 0 if before is None or before[0] is None else before[1]
        case.expected_version = str(current + (case.expected_version == "stale"))
    want = expected_exit(case, before)
    code, out, err = run_main(argv_for(case, url), case.stdin)
    assert code == want, f"exit {code}, expected {want}: {err[-500:]}"
    after = central_row(db, case.owner, case.key) if names_ok else None
    if code != 0:
        assert err.strip(), "a refusal without a message"
        assert "Traceback" not in err
        assert after == before, f"a refused {case.op} changed the central DB"
        return "refused"
    version = 0 if before is None else before[1]
    if case.op == "get":
        assert before is not None
        assert before[0] is not None
        assert same_json(json.loads(out)["value"], json.loads(before[0]))
        assert after == before
    elif case.op == "delete":
        assert after == (None, version + 1), after
    else:
        _parsed, value = parse_json_text(case.stdin if case.value == "-" else case.value)
        assert after is not None
        assert after[0] is not None
        assert after[1] == version + 1 == json.loads(out)["version"]
        assert same_json(json.loads(after[0]), as_json(value))  # as stored
        assert same_json(json.loads(out)["value"], as_json(value))  # as the CLI reports it
    return case.op


@pytest.fixture
def cli_central(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """An embedded central DB, created once, opened by each call without a migration check."""
    db = tmp_path / "central.db"
    url = f"sqlite:///{db}"
    assert run_main(["db", "upgrade", "--central-url", url], "")[0] == 0
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__UPGRADE_SCHEMA", "false")
    assert run_main(["set", "--central-url", url, "--", *FIXED, "0"], "")[0] == 0
    return url, db


def test_cli_gives_exit_2_3_4_or_round_trips(cli_central: tuple[str, Path],
                                              fault_tally: FaultTally) -> None:
    url, db = cli_central
    outcomes: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=RELAXED)
    @given(case=cli_cases())
    # found by this test: a value orjson read as a float (silently rounded), and a crash
    @example(case=CliCase("set", *FIXED, "123456789012345678901234567890", "", None))
    @example(case=CliCase("set", *FIXED, "--", "", None))
    @example(case=CliCase("set", *FIXED, "1", "", "99999999999999999999999"))
    # and a value nested as deep as may be stored (254) crashed `--json` after writing it
    @example(case=CliCase("set", *FIXED, "[" * 254 + "]" * 254, "", None))
    @example(case=CliCase("get", *FIXED, "", "", None))
    def one(case: CliCase) -> None:
        outcomes[check_cli_case(case, url, db)] += 1

    one()
    # a lost or partial write fails its example: reaching here, none was found
    settle(fault_tally, "cli", outcomes, examples=EXAMPLES, write="set",
           others=("get", "delete"))


#: through the installed command: argv as bytes, as a shell passes them
SUBPROCESS_CASES: Final[list[tuple[str, bytes, bytes, bytes]]] = [
    # (name, owner, key, value)
    ("integer beyond 64 bits", b"dag:x", b"big", b"123456789012345678901234567890"),
    ("NaN", b"dag:x", b"nan", b"NaN"),
    ("invalid UTF-8 in the value", b"dag:x", b"utf", b'"\xff\xfe"'),
    ("invalid UTF-8 in the owner", b"dag:\xed\xa0\x80", b"k", b"1"),
    ("control character in the key", b"dag:x", b"a\x1bb", b"1"),
    ("70 KB value", b"dag:x", b"big-text", b'"' + b"x" * 70_000 + b'"'),
    ("awkward but valid", "-x 💥".encode(), "a%2Fb\u2028".encode(), '{"é": [1.5, null]}'.encode()),
]


@pytest.mark.parametrize(("what", "owner", "key", "value"), SUBPROCESS_CASES,
                         ids=[c[0] for c in SUBPROCESS_CASES])
def test_installed_command_answers_as_main_does(
    cli_central: tuple[str, Path], what: str, owner: bytes, key: bytes, value: bytes,
    fault_tally: FaultTally,
) -> None:
    url, db = cli_central
    proc = subprocess.run(
        [localstate_command(), b"set", b"--central-url", url.encode(), b"--json", b"--",
         owner, key, value], capture_output=True, timeout=120, env=os.environ.copy())
    # the same command line as Python decodes it (undecodable bytes as lone surrogates)
    names = (os.fsdecode(owner), os.fsdecode(key))
    stored = central_row(db, *names) if all(map(name_ok, names)) else None
    in_process = run_main(["set", "--central-url", url, "--json", "--", *names,
                           os.fsdecode(value)], "")
    fault_tally.add("inputs tried", 1)
    fault_tally.add("inputs tried (cli subprocess)", 1)
    assert proc.returncode == in_process[0], (proc.returncode, in_process, proc.stderr)
    assert b"Traceback" not in proc.stderr
    if proc.returncode == 0:
        assert stored is not None  # the subprocess wrote it, main wrote it again
        assert json.loads(proc.stdout)["value"] == json.loads(in_process[1])["value"]
        assert json.loads(in_process[1])["version"] == stored[1] + 1
    else:
        assert proc.returncode == EXIT_USAGE, proc.stderr
        assert stored is None  # refused by the subprocess: nothing was written
