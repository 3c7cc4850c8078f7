"""config: the resolved settings, and where each came from."""

from __future__ import annotations

import argparse

from localstate.config import Settings

__all__ = ["cmd_config"]


def cmd_config(args: argparse.Namespace) -> int:
    settings = Settings.resolve()
    width = max(len(name) for name, _, _ in settings.describe())
    for name, value, source in settings.describe():
        print(f"{name:<{width}}  {value:<40}  {source}")
    print(f"{'(cache file)':<{width}}  {settings.resolved_cache_path!s:<40}")
    print(f"{'(central url)':<{width}}  {settings.resolved_central_url:<40}")
    return 0
