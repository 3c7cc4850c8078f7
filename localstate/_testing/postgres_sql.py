"""The SQL text the PostgreSQL test server sends through psql: quoting, and the locale clause
of CREATE DATABASE (ICU where the server has it, else an installed libc locale)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

__all__ = ["locale_clause", "quote_ident", "quote_literal"]

_LANGUAGE_TAG = re.compile(r"^([A-Za-z]{2,3})-([A-Za-z]{2})$")  # en-US


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def quote_ident(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


def _libc_has_locale(name: str) -> bool:
    """Whether the C library has the locale `name` (``en_US.UTF-8``) installed."""
    try:
        out = subprocess.run(["locale", "-a"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    wanted = name.lower().replace("-", "")
    return any(line.strip().lower().replace("-", "") == wanted for line in out.splitlines())


def locale_clause(locale: str, major_version: int, has_icu: Callable[[], bool]) -> str:
    """The CREATE DATABASE clause ordering text as the language tag `locale` (``en-US``)
    does; `has_icu` is asked only for a valid tag."""
    match = _LANGUAGE_TAG.match(locale)
    if match is None:
        raise ValueError(f"locale {locale!r} is not a language tag such as 'en-US'")
    if has_icu():
        return f"LOCALE_PROVIDER icu ICU_LOCALE {quote_literal(locale)} TEMPLATE template0"
    libc = f"{match.group(1).lower()}_{match.group(2).upper()}.UTF-8"
    if not _libc_has_locale(libc):
        raise RuntimeError(
            f"cannot create a database ordered as {locale!r}: this PostgreSQL "
            f"{major_version} has no ICU (needs 15+ built with ICU) and the system "
            f"has no {libc} locale: `apt-get install locales-all`, or install `locales`, "
            f"add '{libc} UTF-8' to /etc/locale.gen and run locale-gen"
        )
    return f"LOCALE {quote_literal(libc)} TEMPLATE template0"
