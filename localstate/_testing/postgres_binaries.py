"""Where the PostgreSQL programs the test server runs are: on PATH first, else the highest
version under /usr/lib/postgresql (Debian's layout)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

__all__ = ["INSTALL_HINT", "PostgresBinaries", "find_postgres_binaries"]

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found on PATH nor "
    "under /usr/lib/postgresql/*/bin. The test suite needs a real PostgreSQL server: "
    "install it with `apt-get install postgresql` (Debian/Ubuntu), or put a directory "
    "containing initdb, pg_ctl and postgres on PATH."
)

_DEBIAN_ROOT = pathlib.Path("/usr/lib/postgresql")


class PostgresBinaries:
    """Absolute paths of the PostgreSQL programs this module runs."""

    def __init__(self, bin_dir: pathlib.Path) -> None:
        self.bin_dir = bin_dir
        self.initdb = bin_dir / "initdb"
        self.pg_ctl = bin_dir / "pg_ctl"
        self.postgres = bin_dir / "postgres"
        self.psql = _first_existing(bin_dir / "psql", shutil.which("psql"), "/usr/bin/psql")
        self.pg_config = _first_existing(bin_dir / "pg_config", shutil.which("pg_config"))

    def major_version(self) -> int:
        out = subprocess.run(
            [str(self.pg_ctl), "--version"], capture_output=True, text=True, check=True
        ).stdout
        match = re.search(r"(\d+)(?:\.\d+)?", out)
        if match is None:
            raise RuntimeError(f"cannot parse the PostgreSQL version from {out!r}")
        return int(match.group(1))

    def pkglibdir(self) -> pathlib.Path | None:
        if self.pg_config is None:
            return None
        try:
            out = subprocess.run(
                [str(self.pg_config), "--pkglibdir"],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
        return pathlib.Path(out) if out else None


def _first_existing(*candidates: pathlib.Path | str | None) -> pathlib.Path | None:
    for candidate in candidates:
        if candidate is not None and os.access(candidate, os.X_OK):
            return pathlib.Path(candidate)
    return None


def _version_key(path: pathlib.Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.name)) or (-1,)


def find_postgres_binaries() -> PostgresBinaries:
    """Locate initdb/pg_ctl/postgres: on PATH first, else the highest Debian version."""
    names = ("initdb", "pg_ctl", "postgres")
    found = [shutil.which(name) for name in names]
    if all(found):
        # /usr/local/bin/initdb may be a symlink into /usr/lib/postgresql/N/bin: resolve it
        # so the sibling psql/pg_config of the same version are used.
        bin_dirs = {pathlib.Path(path).resolve().parent for path in found if path}
        if len(bin_dirs) == 1:
            return PostgresBinaries(bin_dirs.pop())
        return PostgresBinaries(pathlib.Path(str(found[0])).resolve().parent)
    candidates = sorted(
        (
            d / "bin"
            for d in (_DEBIAN_ROOT.iterdir() if _DEBIAN_ROOT.is_dir() else ())
            if all(os.access(d / "bin" / name, os.X_OK) for name in names)
        ),
        key=lambda bin_dir: _version_key(bin_dir.parent),
        reverse=True,
    )
    if not candidates:
        raise RuntimeError(INSTALL_HINT)
    return PostgresBinaries(candidates[0])
