"""Settings: every knob of a store, and where each value came from.

Each setting is resolved in this order, the first that has it wins:

1. an explicit argument (``StateStore.open(flush_interval=0.5)``);
2. the environment, ``AIRFLOW__LOCALSTATE__<NAME>`` (as Airflow reads its own settings);
3. the ``[localstate]`` section of ``airflow.cfg`` (``$AIRFLOW_CONFIG``, else
   ``$AIRFLOW_HOME/airflow.cfg``; ``$AIRFLOW_HOME`` defaults to ``~/airflow`` as in Airflow);
4. the default.

Nothing is read at import: `Settings.resolve()` reads the sources when called. A bad value raises
`ConfigError` naming the setting, the source it came from and what is allowed.
"""

from __future__ import annotations

import configparser
import dataclasses
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from localstate.errors import ConfigError
from localstate.model import DURABILITIES, Durability

__all__ = ["SETTING_NAMES", "Settings", "airflow_home", "default_triggerer_id"]

_ENV_PREFIX: Final = "AIRFLOW__LOCALSTATE__"
_SECTION: Final = "localstate"
_POLICY_NAMES: Final = frozenset({"reject", "last_writer_wins", "max"})


def airflow_home(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("AIRFLOW_HOME") or Path.home() / "airflow").expanduser()


def default_triggerer_id() -> str:
    """The host name, made safe for a file name: stable across restarts of the triggerer."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "triggerer"


# -- parsers: str (or the native type) -> value, raising ValueError with what is allowed -------


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _positive_float(raw: Any) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError("expected a number of seconds greater than 0") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError("expected a number of seconds greater than 0")
    return value


def _positive_int(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError("expected a whole number greater than 0")
    try:
        value = int(str(raw).strip()) if not isinstance(raw, int) else raw
    except ValueError:
        raise ValueError("expected a whole number greater than 0") from None
    if value <= 0:
        raise ValueError("expected a whole number greater than 0")
    return value


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        text = str(raw).strip().lower()
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return text

    return parse


def _optional_str(raw: Any) -> str | None:
    if raw is None:
        return None
    text = str(raw).strip()
    return text or None


def _optional_path(raw: Any) -> Path | None:
    if raw is None or str(raw).strip() == "":
        return None
    return Path(str(raw)).expanduser()


def _policy_spec(raw: Any) -> str:
    text = str(raw).strip()
    name, _, fld = text.partition(":")
    if name not in _POLICY_NAMES or (fld and name != "max") or (name == "max" and ":" in text
                                                                 and not fld):
        raise ValueError(
            "expected reject, last_writer_wins, max or max:<field>"
        )
    return text


def _conflict_policy(raw: Any) -> str | dict[str, str]:
    """A policy name, or owner-glob=policy pairs ("asset_watcher:*=max, *=reject")."""
    if isinstance(raw, Mapping):
        return {str(k): _policy_spec(v) for k, v in raw.items()}
    text = str(raw).strip()
    if "=" not in text:
        return _policy_spec(text)
    mapping: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        pattern, sep, policy = part.partition("=")
        if not sep or not pattern.strip():
            raise ValueError("expected owner-glob=policy pairs separated by commas")
        mapping[pattern.strip()] = _policy_spec(policy)
    return mapping


@dataclass(frozen=True)
class _Spec:
    parse: Callable[[Any], Any]
    default: Any
    help: str


_SPECS: Final[dict[str, _Spec]] = {
    "enabled": _Spec(_bool, True, "local-first cache on (true) or every call straight to the "
                     "central DB (false)"),
    "cache_dir": _Spec(_optional_path, None, "folder of the cache files; default "
                       "$AIRFLOW_HOME/localstate"),
    "cache_path": _Spec(_optional_path, None, "the cache file itself; default "
                        "<cache_dir>/<triggerer_id>.db"),
    "central_url": _Spec(_optional_str, None, "SQLAlchemy URL of the central DB; default "
                         "sqlite:///$AIRFLOW_HOME/localstate-central.db"),
    "triggerer_id": _Spec(_optional_str, None, "this process's id (updated_by, cache file "
                          "name); default the host name"),
    "durability": _Spec(_choice(*sorted(DURABILITIES)), "local", "when a set is acknowledged"),
    "flush_interval": _Spec(_positive_float, 1.0, "seconds between flushes to the central DB"),
    "max_batch": _Spec(_positive_int, 10_000, "dirty keys that trigger a flush at once, and rows "
                       "per central transaction"),
    "max_value_bytes": _Spec(_positive_int, 64 * 1024, "largest encoded value"),
    "conflict_policy": _Spec(_conflict_policy, "reject", "reject, last_writer_wins, max, "
                             "max:<field>, or owner-glob=policy pairs"),
    "local_sync": _Spec(_choice("full", "normal"), "full", "SQLite synchronous pragma of the "
                        "cache: full survives power loss, normal only a crash"),
    "memory_window": _Spec(_positive_float, 0.05, "seconds within which a memory-durability "
                           "write reaches the local WAL"),
    "central_timeout": _Spec(_positive_float, 30.0, "seconds a central-durability write waits"),
    "close_timeout": _Spec(_positive_float, 10.0, "seconds close() spends flushing"),
    "absent_ttl": _Spec(_positive_float, 5.0, "seconds a key found absent centrally is "
                        "remembered as absent"),
    "upgrade_schema": _Spec(_bool, True, "create or upgrade the central schema on open"),
}

SETTING_NAMES: Final = tuple(_SPECS)


@dataclass(frozen=True)
class Settings:
    """The resolved settings of one store. Build with `Settings.resolve()`."""

    enabled: bool = True
    cache_dir: Path | None = None
    cache_path: Path | None = None
    central_url: str | None = None
    triggerer_id: str | None = None
    durability: Durability = "local"
    flush_interval: float = 1.0
    max_batch: int = 10_000
    max_value_bytes: int = 64 * 1024
    conflict_policy: str | dict[str, str] = "reject"
    local_sync: str = "full"
    memory_window: float = 0.05
    central_timeout: float = 30.0
    close_timeout: float = 10.0
    absent_ttl: float = 5.0
    upgrade_schema: bool = True
    #: where each value came from: "argument", "env AIRFLOW__LOCALSTATE__X", "airflow.cfg", ...
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    home: Path = field(default_factory=airflow_home, compare=False)

    @classmethod
    def resolve(
        cls,
        explicit: Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        config_file: Path | None = None,
    ) -> Settings:
        env = os.environ if environ is None else environ
        explicit = {k: v for k, v in (explicit or {}).items() if v is not None}
        unknown = set(explicit) - set(_SPECS)
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {sorted(unknown)}; known: {', '.join(SETTING_NAMES)}"
            )
        home = airflow_home(env)
        cfg_path = config_file or Path(env.get("AIRFLOW_CONFIG") or home / "airflow.cfg")
        cfg = _read_cfg(cfg_path)
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, spec in _SPECS.items():
            env_name = _ENV_PREFIX + name.upper()
            if name in explicit:
                raw, source = explicit[name], "argument"
            elif env_name in env:
                raw, source = env[env_name], f"environment {env_name}"
            elif name in cfg:
                raw, source = cfg[name], f"{cfg_path} [{_SECTION}] {name}"
            else:
                values[name] = spec.default
                sources[name] = "default"
                continue
            try:
                values[name] = spec.parse(raw)
            except ValueError as exc:
                raise ConfigError(
                    f"setting {name!r} from {source} is {raw!r}: {exc}"
                ) from None
            sources[name] = source
        return cls(**values, sources=sources, home=home)

    # -- derived -------------------------------------------------------------------------

    @property
    def resolved_triggerer_id(self) -> str:
        return self.triggerer_id or default_triggerer_id()

    @property
    def resolved_cache_path(self) -> Path:
        if self.cache_path is not None:
            return self.cache_path
        folder = self.cache_dir or self.home / "localstate"
        return folder / f"{self.resolved_triggerer_id}.db"

    @property
    def resolved_central_url(self) -> str:
        return self.central_url or f"sqlite:///{self.home / 'localstate-central.db'}"

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` applied (parsed and checked as arguments are)."""
        parsed: dict[str, Any] = {}
        for name, raw in changes.items():
            spec = _SPECS.get(name)
            if spec is None:
                raise ConfigError(f"unknown setting {name!r}; known: {', '.join(SETTING_NAMES)}")
            try:
                parsed[name] = spec.parse(raw)
            except ValueError as exc:
                raise ConfigError(f"setting {name!r} from argument is {raw!r}: {exc}") from None
        sources = dict(self.sources)
        sources.update(dict.fromkeys(parsed, "argument"))
        return dataclasses.replace(self, **parsed, sources=sources)

    def describe(self) -> list[tuple[str, str, str]]:
        """(name, value, source) for every setting, for `localstate config`."""
        return [
            (name, repr(getattr(self, name)), self.sources.get(name, "default"))
            for name in _SPECS
        ]


def _read_cfg(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot parse {path}: {exc}") from None
    if not parser.has_section(_SECTION):
        return {}
    return dict(parser.items(_SECTION))
