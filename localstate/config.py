"""Settings: every knob of a store, and where each value came from.

Each setting is resolved in this order, the first that has it wins:

1. an explicit argument (``StateStore.open(flush_interval=0.5)``);
2. the environment, ``AIRFLOW__LOCALSTATE__<NAME>`` (as Airflow reads its own settings);
3. the ``[localstate]`` section of ``airflow.cfg``: through Airflow's own ``conf`` when this
   process has already loaded it (so ``_cmd``/``_secret`` options and Airflow's interpolation
   apply), else parsed from ``$AIRFLOW_CONFIG``, else ``$AIRFLOW_HOME/airflow.cfg``
   (``$AIRFLOW_HOME`` defaults to ``~/airflow`` as in Airflow);
4. the default.

Nothing is read at import: `Settings.resolve()` reads the sources when called. A bad value raises
`ConfigError` naming the setting, the source it came from and what is allowed.
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from localstate.errors import ConfigError
from localstate.model import DURABILITIES, Durability
from localstate.sync.conflicts import ConflictPolicy

__all__ = [
    "API_ROLES",
    "LIVE_SETTINGS",
    "SETTING_NAMES",
    "ApiToken",
    "Settings",
    "airflow_home",
    "config_file_path",
    "default_triggerer_id",
    "setting_specs",
]

_ENV_PREFIX: Final = "AIRFLOW__LOCALSTATE__"
_SECTION: Final = "localstate"

ApiRole = Literal["read", "read-write"]
API_ROLES: Final[tuple[ApiRole, ...]] = ("read", "read-write")
#: shortest bearer token accepted: a guessable token is no protection
MIN_TOKEN_LENGTH: Final = 16
# printable ASCII without spaces: what an HTTP Authorization header can carry verbatim
_TOKEN_CHARS: Final = re.compile(r"[!-~]+")


@dataclass(frozen=True)
class ApiToken:
    """One bearer token of the REST API: its role and the owner prefixes it may touch.

    The secret is left out of `repr()`, so a logged `Settings` never shows it.
    """

    secret: str = field(repr=False)
    role: ApiRole
    #: owner prefixes this token may read (and write, for read-write); "" means every owner
    owners: tuple[str, ...]
    #: a label for messages ("token 2" unless the JSON form names it)
    name: str = ""

    @property
    def can_write(self) -> bool:
        return self.role == "read-write"

    def allows(self, owner: str) -> bool:
        return any(owner.startswith(prefix) for prefix in self.owners)


def airflow_home(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("AIRFLOW_HOME") or Path.home() / "airflow").expanduser()


def config_file_path(environ: Mapping[str, str] | None = None) -> Path:
    """The airflow.cfg settings are read from: ``$AIRFLOW_CONFIG``, else in ``$AIRFLOW_HOME``."""
    env = os.environ if environ is None else environ
    return Path(env.get("AIRFLOW_CONFIG") or airflow_home(env) / "airflow.cfg")


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


_TRIGGERER_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,200}")


def _triggerer_id(raw: Any) -> str | None:
    # It names the cache file (<cache_dir>/<id>.db) and stamps updated_by: a "/" or ".." would
    # put the file elsewhere, a control character would garble logs and the CLI's tables.
    text = _optional_str(raw)
    if text is None:
        return None
    if not _TRIGGERER_ID.fullmatch(text) or text in {".", ".."}:
        raise ValueError("expected 1 to 200 of A-Z a-z 0-9 _ . : @ - (it names the cache file)")
    return text


def _optional_path(raw: Any) -> Path | None:
    if raw is None or str(raw).strip() == "":
        return None
    return Path(str(raw)).expanduser()


def _policy_spec(raw: Any) -> str:
    text = str(raw).strip()
    ConflictPolicy.parse(text)  # raises ConfigError (a ValueError) naming what is allowed
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


def _optional_host(raw: Any) -> str | None:
    text = _optional_str(raw)
    if text is not None and (any(c.isspace() for c in text) or "/" in text):
        raise ValueError("expected a host name or an IP address")
    return text


def _host(raw: Any) -> str:
    text = _optional_host(raw)
    if text is None:
        raise ValueError("expected a host name or an IP address")
    return text


def _port(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError("expected a port number from 1 to 65535")
    try:
        value = int(str(raw).strip()) if not isinstance(raw, int) else raw
    except ValueError:
        raise ValueError("expected a port number from 1 to 65535") from None
    if not 0 < value < 65536:
        raise ValueError("expected a port number from 1 to 65535")
    return value


def _metric_prefix(raw: Any) -> str:
    text = str(raw).strip().strip(".")
    if not text or not re.fullmatch(r"[A-Za-z0-9_.-]+", text):
        raise ValueError("expected letters, digits, '_', '-' and '.' (e.g. localstate)")
    return text


def _http_url(raw: Any) -> str | None:
    text = _optional_str(raw)
    if text is not None and (not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", text)):
        raise ValueError("expected an http:// or https:// URL without query "
                         "(e.g. http://127.0.0.1:8686)")
    return text


def _optional_token(raw: Any) -> str | None:
    text = _optional_str(raw)
    if text is not None and not _TOKEN_CHARS.fullmatch(text):
        raise ValueError("the token must be printable ASCII without spaces")
    return text


_TOKEN_FORMAT: Final = (
    "expected TOKEN:ROLE:PREFIX|PREFIX entries separated by commas (ROLE read or read-write, "
    "PREFIX an owner prefix or * for every owner), or a JSON list of "
    '{"token": ..., "role": ..., "owners": [...], "name": ...} objects'
)


def _api_token(secret: Any, role: Any, owners: Any, name: str, label: str) -> ApiToken:
    # messages name the token by position or label, never by its secret
    if not isinstance(secret, str) or not _TOKEN_CHARS.fullmatch(secret):
        raise ValueError(f"{label}: the token must be printable ASCII without spaces")
    if len(secret) < MIN_TOKEN_LENGTH:
        raise ValueError(
            f"{label}: the token is {len(secret)} characters long; use at least "
            f"{MIN_TOKEN_LENGTH} (python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if role not in API_ROLES:
        raise ValueError(f"{label}: role {role!r} is not one of {', '.join(API_ROLES)}")
    if not isinstance(owners, list | tuple) or not owners or not all(
        isinstance(o, str) and o for o in owners
    ):
        raise ValueError(f"{label}: owners must be a non-empty list of owner prefixes (* for all)")
    prefixes = tuple(sorted({"" if o == "*" else o for o in owners}))
    if "" in prefixes:
        prefixes = ("",)
    return ApiToken(secret=secret, role=role, owners=prefixes, name=name)


def _api_tokens(raw: Any) -> tuple[ApiToken, ...]:
    """API bearer tokens, as text (TOKEN:ROLE:PREFIX|PREFIX, ...) or a JSON list."""
    if raw is None:
        return ()
    if isinstance(raw, tuple | list) and all(isinstance(t, ApiToken) for t in raw):
        tokens = tuple(raw)
    else:
        items: list[Any]
        if isinstance(raw, list | tuple):
            items = list(raw)
        else:
            text = str(raw).strip()
            if not text:
                return ()
            if text[0] in "[{":
                try:
                    loaded = json.loads(text)
                except ValueError:
                    raise ValueError(f"not valid JSON; {_TOKEN_FORMAT}") from None
                items = loaded if isinstance(loaded, list) else [loaded]
            else:
                items = [part.strip() for part in re.split(r"[,\n]", text) if part.strip()]
        parsed: list[ApiToken] = []
        for n, item in enumerate(items, 1):
            label = f"token {n}"
            if isinstance(item, Mapping):
                unknown = set(item) - {"token", "role", "owners", "name"}
                if unknown:
                    raise ValueError(f"{label}: unknown field(s) {sorted(unknown)}")
                given = item.get("name")
                name = given if isinstance(given, str) and given else f"token {n}"
                label = f"token {given!r}" if name == given else label
                parsed.append(_api_token(item.get("token"), item.get("role"),
                                         item.get("owners"), name, label))
            elif isinstance(item, str):
                secret, sep1, rest = item.partition(":")
                role, sep2, owners = rest.partition(":")
                if not (sep1 and sep2 and owners):
                    raise ValueError(f"{label} has no TOKEN:ROLE:PREFIXES form; {_TOKEN_FORMAT}")
                parsed.append(_api_token(secret.strip(), role.strip(),
                                         [o.strip() for o in owners.split("|")], label, label))
            else:
                raise ValueError(f"{label}: {_TOKEN_FORMAT}")
        tokens = tuple(parsed)
    secrets_seen: set[str] = set()
    for t in tokens:
        if t.secret in secrets_seen:
            raise ValueError(f"{t.name}: the same token is listed twice")
        secrets_seen.add(t.secret)
    return tokens


@dataclass(frozen=True)
class _Spec:
    parse: Callable[[Any], Any]
    default: Any
    help: str
    #: never shown: error messages say <hidden> instead of the value
    secret: bool = False


_SPECS: Final[dict[str, _Spec]] = {
    "enabled": _Spec(_bool, True, "local-first cache on (true) or every call straight to the "
                     "central DB (false)"),
    "cache_dir": _Spec(_optional_path, None, "folder of the cache files; default "
                       "$AIRFLOW_HOME/localstate"),
    "cache_path": _Spec(_optional_path, None, "the cache file itself; default "
                        "<cache_dir>/<triggerer_id>.db"),
    "central_url": _Spec(_optional_str, None, "SQLAlchemy URL of the central DB; default "
                         "sqlite:///$AIRFLOW_HOME/localstate-central.db"),
    "triggerer_id": _Spec(_triggerer_id, None, "this process's id (updated_by, cache file "
                          "name); default the host name"),
    "durability": _Spec(_choice(*sorted(DURABILITIES)), "local", "when a set is acknowledged"),
    "flush_interval": _Spec(_positive_float, 1.0, "seconds between flushes to the central DB"),
    "max_batch": _Spec(_positive_int, 10_000, "dirty keys that trigger a flush at once, and rows "
                       "per central transaction"),
    "max_value_bytes": _Spec(_positive_int, 64 * 1024, "largest encoded value"),
    "conflict_policy": _Spec(_conflict_policy, "reject", "reject, last_writer_wins, max, "
                             "max:<int|timestamp|text>, max:<field>[:<order>], or "
                             "owner-glob=policy pairs"),
    "local_sync": _Spec(_choice("full", "normal"), "full", "SQLite synchronous pragma of the "
                        "cache: full survives power loss, normal only a crash"),
    "memory_window": _Spec(_positive_float, 0.05, "seconds within which a memory-durability "
                           "write reaches the local WAL"),
    "central_timeout": _Spec(_positive_float, 30.0, "seconds a central-durability write waits"),
    "close_timeout": _Spec(_positive_float, 10.0, "seconds close() spends flushing"),
    "absent_ttl": _Spec(_positive_float, 5.0, "seconds a key found absent centrally is "
                        "remembered as absent"),
    "max_keys_in_memory": _Spec(_positive_int, 100_000, "entries a store keeps in memory; "
                                "beyond it the least recently used clean ones are evicted "
                                "and read through again when asked for"),
    "upgrade_schema": _Spec(_bool, True, "create or upgrade the central schema on open"),
    "sink": _Spec(_choice("sql", "airflow", "api"), "sql", "where flushes go: sql "
                  "(localstate's own central table at central_url), airflow (Airflow 3.3's "
                  "asset state store, through the accessors the triggerer gives watcher "
                  "triggers) or api (a localstate API server at api_url: no database "
                  "credentials in this process)"),
    "central_thread": _Spec(_bool, True, "talk to the central DB from a thread of its own, so "
                            "busy triggers never delay a flush"),
    "api_url": _Spec(_http_url, None, "with sink = api: the localstate API server to flush "
                     "and read through (http://host:8686, or Airflow's API server with the "
                     "plugin: http://host:8080/localstate)"),
    "api_token": _Spec(_optional_token, None, "with sink = api: the bearer token sent to "
                       "api_url (a read-write token of the server's api_tokens whose owner "
                       "prefixes cover this process's owners)", secret=True),
    "api_tokens": _Spec(_api_tokens, (), "REST API bearer tokens: TOKEN:ROLE:PREFIX|PREFIX, ... "
                        "(ROLE read or read-write; PREFIX an owner prefix, * for all) or a JSON "
                        "list of {token, role, owners, name}; none: `localstate serve` "
                        "generates one (see api_open)", secret=True),
    "api_open": _Spec(_bool, False, "with no api_tokens, serve the API with no token at all "
                      "(loopback only); off: `localstate serve` generates a token, kept in "
                      "$AIRFLOW_HOME/localstate/api-token (mode 0600)"),
    "api_host": _Spec(_host, "127.0.0.1", "address `localstate serve` binds"),
    "api_port": _Spec(_port, 8686, "port `localstate serve` listens on"),
    "statsd_host": _Spec(_optional_host, None, "StatsD host to send metrics to (UDP); "
                         "none: StatsD off"),
    "statsd_port": _Spec(_port, 8125, "StatsD port"),
    "statsd_prefix": _Spec(_metric_prefix, "localstate", "prefix of every metric name"),
    "otel": _Spec(_bool, False, "report the same metrics as OpenTelemetry instruments (needs "
                  "opentelemetry-api)"),
    "metrics_interval": _Spec(_positive_float, 10.0, "seconds between two metric reports "
                              "(sampled from stats(), never per set)"),
    "asset_mirror": _Spec(_choice("auto", "on", "off"), "auto", "also write each flushed "
                          "row of an asset_watcher:<asset> owner to Airflow's asset_state_store "
                          "in the flush's transaction; auto: when the central DB is Airflow's"),
    "watch_config": _Spec(_bool, False, "watch airflow.cfg and apply changes of the live "
                          "settings (enabled, flush_interval, max_batch, durability) to the "
                          "running store"),
}

SETTING_NAMES: Final = tuple(_SPECS)
#: each setting's default, written once (in `_SPECS`); `Settings` takes its field defaults here
_DEFAULTS: Final[dict[str, Any]] = {name: spec.default for name, spec in _SPECS.items()}
#: the settings a running store takes on without a restart (`StateStore.reconfigure`)
LIVE_SETTINGS: Final = ("enabled", "flush_interval", "max_batch", "durability")


def setting_specs() -> dict[str, tuple[Any, str, bool]]:
    """Each setting's (default, description, secret): for `localstate config` and the
    ``[localstate]`` section the Airflow provider declares (one source of truth)."""
    return {name: (spec.default, spec.help, spec.secret) for name, spec in _SPECS.items()}


@dataclass(frozen=True)
class Settings:
    """The resolved settings of one store. Build with `Settings.resolve()`.

    One field per entry of `_SPECS`, in the same order, its default taken from there.
    """

    enabled: bool = _DEFAULTS["enabled"]
    cache_dir: Path | None = _DEFAULTS["cache_dir"]
    cache_path: Path | None = _DEFAULTS["cache_path"]
    central_url: str | None = _DEFAULTS["central_url"]
    triggerer_id: str | None = _DEFAULTS["triggerer_id"]
    durability: Durability = _DEFAULTS["durability"]
    flush_interval: float = _DEFAULTS["flush_interval"]
    max_batch: int = _DEFAULTS["max_batch"]
    max_value_bytes: int = _DEFAULTS["max_value_bytes"]
    conflict_policy: str | dict[str, str] = _DEFAULTS["conflict_policy"]
    local_sync: str = _DEFAULTS["local_sync"]
    memory_window: float = _DEFAULTS["memory_window"]
    central_timeout: float = _DEFAULTS["central_timeout"]
    close_timeout: float = _DEFAULTS["close_timeout"]
    absent_ttl: float = _DEFAULTS["absent_ttl"]
    max_keys_in_memory: int = _DEFAULTS["max_keys_in_memory"]
    upgrade_schema: bool = _DEFAULTS["upgrade_schema"]
    sink: str = _DEFAULTS["sink"]
    central_thread: bool = _DEFAULTS["central_thread"]
    api_url: str | None = _DEFAULTS["api_url"]
    api_token: str | None = _DEFAULTS["api_token"]
    api_tokens: tuple[ApiToken, ...] = _DEFAULTS["api_tokens"]
    api_open: bool = _DEFAULTS["api_open"]
    api_host: str = _DEFAULTS["api_host"]
    api_port: int = _DEFAULTS["api_port"]
    statsd_host: str | None = _DEFAULTS["statsd_host"]
    statsd_port: int = _DEFAULTS["statsd_port"]
    statsd_prefix: str = _DEFAULTS["statsd_prefix"]
    otel: bool = _DEFAULTS["otel"]
    metrics_interval: float = _DEFAULTS["metrics_interval"]
    asset_mirror: str = _DEFAULTS["asset_mirror"]
    watch_config: bool = _DEFAULTS["watch_config"]
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
        cfg_path = config_file or config_file_path(env)
        # Airflow's conf adds what the file alone does not say (`_cmd`/`_secret` options,
        # `conf.set` calls); the file itself is read afresh either way, so an edit applies
        # at the next resolve (live reload) although conf parsed the file only at start.
        file_cfg = _read_cfg(cfg_path)
        cfg = {**(_airflow_conf_section(cfg_path) or {}), **file_cfg}
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, spec in _SPECS.items():
            env_name = _ENV_PREFIX + name.upper()
            if name in explicit:
                raw, source = explicit[name], "argument"
            elif env_name in env:
                raw, source = env[env_name], f"environment {env_name}"
            elif name in cfg:
                where = str(cfg_path) if name in file_cfg else f"Airflow's conf ({cfg_path})"
                raw, source = cfg[name], f"{where} [{_SECTION}] {name}"
            else:
                values[name] = spec.default
                sources[name] = "default"
                continue
            try:
                values[name] = spec.parse(raw)
            except ValueError as exc:
                raise ConfigError(
                    f"setting {name!r} from {source} is {_shown(spec, raw)}: {exc}"
                ) from None
            sources[name] = source
        return cls(**values, sources=sources, home=home)

    # -- derived -------------------------------------------------------------------------

    @property
    def resolved_triggerer_id(self) -> str:
        return self.triggerer_id or default_triggerer_id()

    @property
    def resolved_cache_dir(self) -> Path:
        """The folder of this host's cache files (each triggerer's `<id>.db`)."""
        return self.cache_dir or self.home / "localstate"

    @property
    def resolved_cache_path(self) -> Path:
        if self.cache_path is not None:
            return self.cache_path
        return self.resolved_cache_dir / f"{self.resolved_triggerer_id}.db"

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
                raise ConfigError(
                    f"setting {name!r} from argument is {_shown(spec, raw)}: {exc}"
                ) from None
        sources = dict(self.sources)
        sources.update(dict.fromkeys(parsed, "argument"))
        return dataclasses.replace(self, **parsed, sources=sources)

    def describe(self) -> list[tuple[str, str, str]]:
        """(name, value, source) for every setting, for `localstate config`."""
        return [
            (name, repr(getattr(self, name)), self.sources.get(name, "default"))
            for name in _SPECS
        ]


def _shown(spec: _Spec, raw: Any) -> str:
    return "<hidden>" if spec.secret else repr(raw)


def _airflow_conf_section(cfg_path: Path) -> dict[str, str] | None:
    """The ``[localstate]`` options set in Airflow's conf, when this process loaded Airflow's.

    Never imports Airflow (that takes seconds): only a process where Airflow already
    initialised its configuration from the same file reads through it. Provider defaults
    (`get_provider_info` declares every option with its default) are left out, so their
    source reads "default".
    """
    module = sys.modules.get("airflow.configuration")
    conf = getattr(module, "conf", None)
    loaded_from = getattr(module, "AIRFLOW_CONFIG", None)
    if conf is None or loaded_from is None or Path(loaded_from) != cfg_path:
        return None
    found: dict[str, str] = {}
    for name in _SPECS:
        try:
            value = conf.get(_SECTION, name, fallback=None)
            default = conf.get_default_value(_SECTION, name)
        except Exception as exc:  # a failing _cmd, a secrets backend down: Airflow's errors
            raise ConfigError(
                f"Airflow's conf cannot give [{_SECTION}] {name} ({cfg_path}): {exc}; fix the "
                "option (or its _cmd/_secret) in airflow.cfg"
            ) from None
        if value is None or value == default:
            continue
        found[name] = str(value)
    return found


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
