"""The docs' install commands, run: every distinct `pip install` line of the README's and the
pages' ```sh blocks installs for real, into a fresh virtual environment of its own.

Each command runs as a reader runs it: from a copy of this checkout (its tracked and new files,
what a clone of the branch holds), in a venv made for it at ``.venv`` there, with that venv's
``bin`` first on ``PATH`` (so the page's ``pip``, ``python`` and ``.venv/bin/pip`` are the
venv's). pip's cache makes the downloads local; nothing is left out (no ``--no-deps``). A
command the page shows that cannot work fails its test, which names the page and line:

* a wheel under ``dist/`` is built first by the line of the same block that runs
  ``python -m build`` (a page that installs a wheel it never builds fails);
* Airflow's constraints file ``constraints-X.Y.txt`` is the project's pinned set for that
  Python, ``tests/data/constraints-airflow-3.3.2-pyX.Y.txt`` (Airflow's published file is on
  GitHub, which the test machines cannot reach; that file's header says how it was made);
* after the install, ``pip check`` passes and the modules each extra brings import from the
  venv, not from this checkout;
* a ``mkdocs serve`` after the install on the same line serves the site (on a free port) with
  its generated reference pages: the install is enough to build the docs.

The installs with Airflow take minutes each: the module is dealt out with the suite's longest
tests (tests/conftest.py), beside tests/packaging/test_wheel.py.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from localstate._testing.db_server import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: the pages a reader copies commands from (docs/research/ is an internal note)
PAGES = [ROOT / "README.md",
         *sorted(p for p in DOCS.rglob("*.md") if "research" not in p.relative_to(DOCS).parts)]
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.S | re.M)
#: the modules each extra brings, imported after an install to show it is usable
EXTRA_MODULES = {
    "airflow": ["airflow.sdk", "localstate.airflow.hook", "localstate.airflow.plugin"],
    "api": ["fastapi", "uvicorn", "localstate.api"],
    "client": ["httpx", "localstate.client"],
    "postgres": ["asyncpg"],
    "mysql": ["aiomysql"],
    "docs": ["mkdocs", "material", "mkdocstrings"],
    "otel": ["opentelemetry"],
    "plot": ["matplotlib"],
    "kafka": ["confluent_kafka"],
    "redis": ["redis"],
    "sqs": ["aiobotocore"],
}
#: an install that brings Airflow: minutes on a loaded machine
AIRFLOW_INSTALL_TIMEOUT = 1500


@dataclass(frozen=True)
class Line:
    page: Path
    number: int
    #: the line's commands, split at ``&&``
    parts: tuple[tuple[str, ...], ...]

    @property
    def where(self) -> str:
        shown = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{shown}:{self.number}"


def _sh_lines(page: Path) -> list[list[Line]]:
    """The page's ```sh blocks, each a list of its command lines with their line numbers."""
    text = page.read_text()
    blocks = []
    for match in SH_BLOCK.finditer(text):
        first = text.count("\n", 0, match.start(1)) + 1
        lines = []
        for n, raw in enumerate(match.group(1).splitlines()):
            stripped = raw.strip()
            if not stripped or stripped.startswith("#"):
                continue
            parts = tuple(tuple(shlex.split(part, comments=True))
                          for part in stripped.split("&&"))
            lines.append(Line(page, first + n, parts))
        blocks.append(lines)
    return blocks


def _is_pip_install(argv: tuple[str, ...]) -> bool:
    if len(argv) >= 4 and argv[0] in ("python", "python3") and argv[1:3] == ("-m", "pip"):
        return argv[3] == "install"
    return (len(argv) >= 2 and (argv[0] in ("pip", "pip3") or argv[0].endswith("/bin/pip"))
            and argv[1] == "install")


def _is_build(argv: tuple[str, ...]) -> bool:
    return argv[:3] in (("python", "-m", "build"), ("python3", "-m", "build"))


@dataclass
class Install:
    """One distinct install command, with every place the docs show it."""

    argv: tuple[str, ...]
    #: the line (of the first place) that builds the wheel it installs, if it installs one
    build: Line | None
    #: what follows the install on its line (``mkdocs serve``), as the first place has it
    then: tuple[tuple[str, ...], ...]
    places: list[str]
    #: a reason it cannot work as shown, found while reading the page
    broken: str = ""

    @property
    def target(self) -> str:
        args = self.argv[self.argv.index("install") + 1:]
        return next(a for a in args if not a.startswith("-")
                    and args[args.index(a) - 1] not in ("--constraint", "-c", "-r"))

    @property
    def extras(self) -> list[str]:
        m = re.search(r"\[([\w,-]+)\]$", self.target)
        return m.group(1).split(",") if m else []


def _installs(pages: list[Path]) -> list[Install]:
    found: dict[tuple[str, ...], Install] = {}
    for page in pages:
        for block in _sh_lines(page):
            built: Line | None = None
            for line in block:
                for i, argv in enumerate(line.parts):
                    if _is_build(argv):
                        built = line
                    if not _is_pip_install(argv):
                        continue
                    install = found.setdefault(argv, Install(
                        argv, None, line.parts[i + 1:], []))
                    install.places.append(line.where)
                    if "dist/" in install.target and install.build is None:
                        if built is None:
                            install.broken += (f"{line.where}: installs {install.target}, "
                                               "which no line before it builds "
                                               "(python -m build)\n")
                        install.build = built
    return list(found.values())


INSTALLS = _installs(PAGES)


def test_the_docs_show_install_commands() -> None:
    """The extraction finds what the pages show: the quick start, the source and wheel installs
    (their build with them) and the docs' own."""
    targets = {install.target for install in INSTALLS}
    assert {".", ".[airflow,api,client,postgres]", ".[docs,api]"} <= targets, targets
    assert any(t.startswith("dist/") and t.endswith(".whl[airflow,api,client,postgres]")
               for t in targets), targets
    assert ("python", "-m", "pip", "install", "build") in {i.argv for i in INSTALLS}
    assert all(install.places for install in INSTALLS)


def test_a_wheel_install_the_page_never_builds_is_reported_with_its_line(tmp_path: Path
                                                                         ) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Install\n\n```sh\n# the wheel\n"
                    "pip install 'dist/localstate-0.2.0-py3-none-any.whl[api]'\n"
                    "python -m build\n```\n")
    (install,) = _installs([page])
    assert install.broken == (f"{page}:5: installs dist/localstate-0.2.0-py3-none-any.whl[api], "
                              "which no line before it builds (python -m build)\n")
    assert install.extras == ["api"]


def _checkout_copy(dest: Path) -> None:
    """The checkout's tracked and new (not ignored) files, as a clone of the branch has them."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True,
                            timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the work tree is not there
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def _run(argv: tuple[str, ...] | list[str], cwd: Path, env: dict[str, str], timeout: float,
         what: str) -> str:
    proc = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (f"{what}\n$ {shlex.join(argv)}\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-3000:]}")
    return proc.stdout


def _constraints(argv: tuple[str, ...], clone: Path, where: str) -> None:
    """Put Airflow's constraints file the command names where it reads it."""
    for flag in ("--constraint", "-c"):
        if flag in argv:
            name = argv[argv.index(flag) + 1]
            m = re.fullmatch(r"constraints-(\d+\.\d+)\.txt", name)
            assert m, f"{where}: {name} is not Airflow's constraints-X.Y.txt"
            python = f"{sys.version_info.major}.{sys.version_info.minor}"
            assert m.group(1) == python, f"{where}: {name}, on Python {python}"
            pinned = ROOT / "tests" / "data" / f"constraints-airflow-3.3.2-py{python}.txt"
            assert pinned.is_file(), f"{where}: no pinned set for Python {python}"
            shutil.copy(pinned, clone / name)


def _serve_the_site(argv: tuple[str, ...], clone: Path, env: dict[str, str],
                    where: str) -> None:
    """`mkdocs serve`, on a free port: the site is built (strictly, as mkdocs.yml asks) and
    served with the reference pages generated from the code."""
    assert argv == ("mkdocs", "serve"), f"{where}: {shlex.join(argv)}"
    port = free_port()
    log = clone / "mkdocs-serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*argv, "--dev-addr", f"127.0.0.1:{port}"], cwd=clone,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        index = ""
        while not index:
            assert proc.poll() is None, f"{where}: mkdocs serve exited\n{log.read_text()[-5000:]}"
            assert time.monotonic() < deadline, f"{where}: not serving\n{log.read_text()[-5000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
                    index = r.read().decode()
            except (urllib.error.URLError, ConnectionError):
                time.sleep(1)  # not listening yet: mkdocs builds the site first
        assert "localstate" in index
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/reference/rest-api/",
                                    timeout=30) as r:
            rest = r.read().decode()
        assert "POST /api/v1/flush" in rest, where  # generated from the API's app
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _id(install: Install) -> str:
    return shlex.join(install.argv)


@pytest.mark.parametrize("install", INSTALLS, ids=_id)
def test_the_install_command_installs(install: Install, tmp_path: Path) -> None:
    where = ", ".join(install.places)
    assert not install.broken, install.broken
    clone = tmp_path / "clone"
    clone.mkdir()
    _checkout_copy(clone)
    venv = clone / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW__", "LOCALSTATE_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               AIRFLOW_HOME=str(tmp_path / "airflow-home"), VIRTUAL_ENV=str(venv))
    timeout = AIRFLOW_INSTALL_TIMEOUT if "airflow" in install.extras else 600

    if install.build is not None:  # the wheel it installs, built as the page builds it
        for argv in install.build.parts:
            _run(argv, clone, env, 600, f"{install.build.where}: the build")
    _constraints(install.argv, clone, where)
    _run(install.argv, clone, env, timeout, f"{where}: the install")
    _run(["pip", "check"], clone, env, 120, f"{where}: pip check after the install")

    # what was installed is usable, and it is the venv's copy, not this checkout's
    project = install.target.startswith((".", "dist/"))
    modules = ["localstate"] if project else [install.target]
    for extra in install.extras:
        assert extra in EXTRA_MODULES, f"{where}: the extra {extra!r}: add its modules above"
        modules += EXTRA_MODULES[extra]
    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]:\n"
              "    module = importlib.import_module(name)\n"
              "    print(name, getattr(module, '__file__', None))\n")
    out = _run(["python", "-c", script, *modules], tmp_path, env, 300, f"{where}: imports")
    files = {name: file for name, _, file in (ln.partition(" ") for ln in out.splitlines())}
    editable = "-e" in install.argv or "--editable" in install.argv
    if "localstate" in files:
        home = clone if editable else venv
        assert files["localstate"].startswith(str(home)), (where, files["localstate"])

    for argv in install.then:
        if argv[0] == "mkdocs":
            _serve_the_site(argv, clone, env, where)
