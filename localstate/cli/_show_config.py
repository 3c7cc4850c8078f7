"""config: the resolved settings, where each came from, and where reads and writes really go."""

from __future__ import annotations

import argparse

from localstate._core.config import Settings
from localstate.cli._state_backend import describe_backend
from localstate.errors import ConfigError

__all__ = ["cmd_config", "routes"]


def routes(settings: Settings) -> list[tuple[str, str]]:
    """Where state goes under `settings`: (what, where) lines."""
    token = "with api_token" if settings.api_token else "WITHOUT api_token"
    if settings.sink == "api":
        flushes = f"API {settings.api_url} ({token}); no database credentials here"
    elif settings.sink == "airflow":
        flushes = "Airflow's asset state store, through the triggerer's accessors"
        if settings.api_url:
            flushes += f"; misses read in batches through {settings.api_url} ({token})"
    else:
        flushes = f"central DB {settings.resolved_central_url}"
    try:
        kind, where = describe_backend(settings)
        commands = f"{'API' if kind == 'api' else kind} {where}"
    except ConfigError as exc:
        commands = f"none: {exc}"
    return [("(cache file)", f"{settings.resolved_cache_path} (every write lands here first)"),
            ("(flushes go to)", flushes),
            ("(CLI get/set/ls/status)", commands)]


def cmd_config(args: argparse.Namespace) -> int:
    settings = Settings.resolve()
    lines = routes(settings)
    width = max(*(len(name) for name, _, _ in settings.describe()),
                *(len(name) for name, _ in lines))
    for name, value, source in settings.describe():
        print(f"{name:<{width}}  {value:<40}  {source}")
    print()
    for name, where in lines:
        print(f"{name:<{width}}  {where}")
    return 0
