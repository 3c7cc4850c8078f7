"""Settings: every knob of a store, and where each value came from.

Each setting is resolved in this order, the first that has it wins:

1. an explicit argument (``StateStore.open(flush_interval=0.5)``);
2. the environment, ``AIRFLOW__LOCALSTATE__<NAME>`` (as Airflow reads its own settings), then,
   for the secret settings (``api_token``, ``api_tokens``), ``AIRFLOW__LOCALSTATE__<NAME>_CMD``
   (a command whose output is the value) and ``AIRFLOW__LOCALSTATE__<NAME>_SECRET`` (a key of
   Airflow's configured secrets backend), in Airflow's order;
3. the ``[localstate]`` section of ``airflow.cfg``: through Airflow's own ``conf`` when this
   process has already loaded it (so Airflow's interpolation applies), else parsed from
   ``$AIRFLOW_CONFIG``, else ``$AIRFLOW_HOME/airflow.cfg`` (``$AIRFLOW_HOME`` defaults to
   ``~/airflow`` as in Airflow); then ``<name>_cmd`` and ``<name>_secret`` there, for the
   secret settings;
4. the default.

The ``_cmd``/``_secret`` forms are read here, not only through Airflow's ``conf``, so they
work in every process that reads settings: the ``localstate`` command too. A command runs
without a shell (split as Airflow's ``run_command`` splits it); a ``_secret`` asks the secrets
backend of Airflow's ``[secrets] backend`` (Airflow is imported for it). Another setting in
either form is refused: they are for secrets, as Airflow allows them only for its sensitive
options.

Each setting is declared once, in `localstate._core.setting_specs` (parser, default, description);
this module resolves them. Nothing is read at import: `Settings.resolve()` reads the sources when
called. A bad value raises
`ConfigError` naming the setting, the source it came from and what is allowed.
"""

from __future__ import annotations

import configparser
import dataclasses
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from localstate._core.api_connection import DEFAULT_CONN_ID, airflow_connection_endpoint
from localstate._core.model import Durability
from localstate._core.protocol import MAX_BATCH_BODY
from localstate._core.retention_rules import RetentionRule
from localstate._core.setting_specs import (
    DEFAULTS,
    SETTING_NAMES,
    SPECS,
    ApiToken,
    Spec,
)
from localstate.errors import ConfigError

__all__ = ["Settings", "airflow_home", "config_file_path", "default_triggerer_id",
           "max_batch_body"]

_ENV_PREFIX: Final = "AIRFLOW__LOCALSTATE__"
_SECTION: Final = "localstate"
#: the indirect forms of a secret setting (suffix of its option or variable), in Airflow's order
_INDIRECT: Final = ("_cmd", "_secret")
#: seconds a _cmd command may take
_CMD_TIMEOUT: Final = 60.0

def airflow_home(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("AIRFLOW_HOME") or Path.home() / "airflow").expanduser()


def config_file_path(environ: Mapping[str, str] | None = None) -> Path:
    """The airflow.cfg settings are read from: ``$AIRFLOW_CONFIG``, else in ``$AIRFLOW_HOME``."""
    env = os.environ if environ is None else environ
    return Path(env.get("AIRFLOW_CONFIG") or airflow_home(env) / "airflow.cfg")


def default_triggerer_id(hostname: str | None = None) -> str:
    """The host name (`hostname`, else this host's), made safe for a file name: stable across
    restarts of the triggerer (a StatefulSet's pod: its name)."""
    host = socket.gethostname() if hostname is None else hostname
    return re.sub(r"[^A-Za-z0-9_.-]", "_", host) or "triggerer"


#: what a row takes in a body besides its value: three names of up to 250 characters (4 bytes
#: each at most in UTF-8; names hold no control characters, so no 6-byte escapes), its
#: numbers and punctuation
_ROW_OVERHEAD: Final = 4 * 1024
#: what a batch body takes besides its rows: the field headers, writer, policies, fleet report
_BODY_OVERHEAD: Final = 64 * 1024


def max_batch_body(max_rows: int, max_value_bytes: int) -> int:
    """The largest flush body a client can need to send a server that takes at most
    `max_rows` rows and values of at most `max_value_bytes`: `max_rows` rows of the largest
    encoding a value may have (4 bytes a byte, escapes included) and their names, but never
    more than a client sends (it splits a batch over `MAX_BATCH_BODY`, down to one row), plus
    the body's own fields. The API server's default ``api_max_request_bytes``: 32 MiB + 64 KiB
    with the default limits."""
    row = 4 * max_value_bytes + _ROW_OVERHEAD
    return min(max_rows * row, max(MAX_BATCH_BODY, row)) + _BODY_OVERHEAD


@dataclass(frozen=True)
class Settings:
    """The resolved settings of one store. Build with `Settings.resolve()`.

    One field per entry of `SPECS`, in the same order, its default taken from there.
    """

    enabled: bool = DEFAULTS["enabled"]
    cache_dir: Path | None = DEFAULTS["cache_dir"]
    cache_path: Path | None = DEFAULTS["cache_path"]
    central_url: str | None = DEFAULTS["central_url"]
    triggerer_id: str | None = DEFAULTS["triggerer_id"]
    durability: Durability = DEFAULTS["durability"]
    flush_interval: float = DEFAULTS["flush_interval"]
    max_batch: int = DEFAULTS["max_batch"]
    max_value_bytes: int = DEFAULTS["max_value_bytes"]
    central_budget_rows_per_s: float | None = DEFAULTS["central_budget_rows_per_s"]
    conflict_policy: str | dict[str, str] = DEFAULTS["conflict_policy"]
    local_sync: str = DEFAULTS["local_sync"]
    memory_window: float = DEFAULTS["memory_window"]
    central_timeout: float = DEFAULTS["central_timeout"]
    close_timeout: float = DEFAULTS["close_timeout"]
    flush_timeout: float = DEFAULTS["flush_timeout"]
    central_transaction_timeout: float = DEFAULTS["central_transaction_timeout"]
    absent_ttl: float = DEFAULTS["absent_ttl"]
    max_keys_in_memory: int = DEFAULTS["max_keys_in_memory"]
    upgrade_schema: bool = DEFAULTS["upgrade_schema"]
    sink: str = DEFAULTS["sink"]
    central_thread: bool = DEFAULTS["central_thread"]
    api_url: str | None = DEFAULTS["api_url"]
    api_ca_bundle: Path | None = DEFAULTS["api_ca_bundle"]
    api_token: str | None = DEFAULTS["api_token"]
    api_tokens: tuple[ApiToken, ...] = DEFAULTS["api_tokens"]
    api_open: bool = DEFAULTS["api_open"]
    api_trusted_origins: tuple[str, ...] = DEFAULTS["api_trusted_origins"]
    api_max_request_bytes: int | None = DEFAULTS["api_max_request_bytes"]
    api_max_batch_rows: int = DEFAULTS["api_max_batch_rows"]
    api_fleet_details: bool = DEFAULTS["api_fleet_details"]
    api_host: str = DEFAULTS["api_host"]
    api_port: int = DEFAULTS["api_port"]
    statsd_host: str | None = DEFAULTS["statsd_host"]
    statsd_port: int = DEFAULTS["statsd_port"]
    statsd_prefix: str = DEFAULTS["statsd_prefix"]
    statsd_tags: bool = DEFAULTS["statsd_tags"]
    otel: bool = DEFAULTS["otel"]
    metrics_interval: float = DEFAULTS["metrics_interval"]
    asset_mirror: str = DEFAULTS["asset_mirror"]
    watch_config: bool = DEFAULTS["watch_config"]
    history: bool = DEFAULTS["history"]
    history_max_rows: int = DEFAULTS["history_max_rows"]
    history_max_age: float = DEFAULTS["history_max_age"]
    history_watermark_every: float = DEFAULTS["history_watermark_every"]
    retention: tuple[RetentionRule, ...] = DEFAULTS["retention"]
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
        unknown = set(explicit) - set(SPECS)
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
        _refuse_indirect_forms(env, cfg, cfg_path)
        for name, spec in SPECS.items():
            env_name = _ENV_PREFIX + name.upper()
            env_form = next((env_name + s.upper() for s in _INDIRECT
                             if spec.secret and env_name + s.upper() in env), None)
            cfg_form = next((name + s for s in _INDIRECT if spec.secret and name + s in cfg),
                            None)
            if name in explicit:
                raw, source = explicit[name], "argument"
            elif env_name in env:
                raw, source = env[env_name], f"environment {env_name}"
            elif env_form is not None:
                raw, source = _indirect(env[env_form], env_form, f"environment {env_form}")
            elif name in cfg:
                where = str(cfg_path) if name in file_cfg else f"Airflow's conf ({cfg_path})"
                raw, source = cfg[name], f"{where} [{_SECTION}] {name}"
            elif cfg_form is not None:
                raw, source = _indirect(cfg[cfg_form], cfg_form,
                                        f"{cfg_path} [{_SECTION}] {cfg_form}")
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
        if values["sink"] == "api" and values["api_url"] is None:
            _api_from_connection(values, sources)
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

    @property
    def resolved_max_request_bytes(self) -> int:
        """The largest flush or batched-read body the API server reads: the setting, else
        what `api_max_batch_rows` rows can need (`max_batch_body`)."""
        if self.api_max_request_bytes is not None:
            return self.api_max_request_bytes
        return max_batch_body(self.api_max_batch_rows, self.max_value_bytes)

    @classmethod
    def with_arguments(cls, settings: Settings | None, arguments: Mapping[str, Any]
                       ) -> Settings:
        """`settings` (None: resolved from the sources) with the arguments that are not None
        applied on top: how a store takes its keyword arguments."""
        given = {k: v for k, v in arguments.items() if v is not None}
        if settings is None:
            return cls.resolve(given)
        return settings.replace(**given) if given else settings

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` applied (parsed and checked as arguments are)."""
        parsed: dict[str, Any] = {}
        for name, raw in changes.items():
            spec = SPECS.get(name)
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
            (name, _value_shown(SPECS[name], getattr(self, name)),
             self.sources.get(name, "default"))
            for name in SPECS
        ]


def _api_from_connection(values: dict[str, Any], sources: dict[str, str]) -> None:
    """``sink = api`` with no ``api_url``: the API of Airflow's ``localstate_default``
    connection, as `LocalStateHook` uses it (its token too, unless ``api_token`` is set)."""
    found = airflow_connection_endpoint(DEFAULT_CONN_ID)
    if found is None:
        return
    source = f"Airflow connection {DEFAULT_CONN_ID!r}"
    try:
        values["api_url"] = SPECS["api_url"].parse(found.url)
        if values["api_token"] is None and found.token is not None:
            values["api_token"] = SPECS["api_token"].parse(found.token)
            sources["api_token"] = source
        if values["api_ca_bundle"] is None and found.ca_bundle is not None:
            values["api_ca_bundle"] = SPECS["api_ca_bundle"].parse(found.ca_bundle)
            sources["api_ca_bundle"] = source
    except ValueError as exc:
        raise ConfigError(f"{source} does not name the localstate API: {exc}") from None
    sources["api_url"] = source


def _refuse_indirect_forms(env: Mapping[str, str], cfg: Mapping[str, str],
                           cfg_path: Path) -> None:
    """A `_cmd`/`_secret` form of a setting that is not secret: refused, naming the ones
    that take it (a silently ignored form would leave the default in force)."""
    secret = sorted(n for n, s in SPECS.items() if s.secret)
    for name, spec in SPECS.items():
        if spec.secret:
            continue
        for suffix in _INDIRECT:
            for where, found in ((f"environment {_ENV_PREFIX}{(name + suffix).upper()}",
                                  _ENV_PREFIX + (name + suffix).upper() in env),
                                 (f"{cfg_path} [{_SECTION}] {name}{suffix}",
                                  name + suffix in cfg)):
                if found:
                    raise ConfigError(
                        f"{where}: only the secret settings ({', '.join(secret)}) take the "
                        f"{suffix} form; set {name} itself")


def _indirect(given: str, form: str, source: str) -> tuple[str, str]:
    """The value a ``_cmd`` (a command's output) or ``_secret`` (a key of Airflow's secrets
    backend) form gives, and its source as `localstate config` shows it."""
    if form.lower().endswith("_cmd"):
        return _command_output(given, source), f"{source} (command)"
    value, backend = _secrets_backend_value(given, source)
    return value, f"{source} ({backend} {given!r})"


def _command_output(command: str, source: str) -> str:
    try:
        done = subprocess.run(shlex.split(command), capture_output=True, timeout=_CMD_TIMEOUT,
                              check=False)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"{source}: cannot run {command!r} ({exc}); fix the command "
                          "(it runs without a shell)") from None
    if done.returncode != 0:
        # its output is not shown: it may be the secret
        stderr = done.stderr.decode(errors="replace").strip()[-500:]
        raise ConfigError(f"{source}: {command!r} exited with {done.returncode}"
                          f"{f' ({stderr})' if stderr else ''}; fix the command")
    return done.stdout.decode(errors="replace").rstrip("\r\n")


def _secrets_backend_value(key: str, source: str) -> tuple[str, str]:
    """The value of config `key` in Airflow's configured secrets backend, and its class."""
    try:
        from airflow.configuration import get_custom_secret_backend
    except ImportError:
        raise ConfigError(f"{source}: reading a _secret needs Airflow (its [secrets] backend); "
                          "install apache-airflow, or use the _cmd form") from None
    try:
        backend = get_custom_secret_backend()
        value = None if backend is None else backend.get_config(key)
    except Exception as exc:  # a backend's own errors (a vault down, a file unreadable)
        raise ConfigError(f"{source}: Airflow's secrets backend cannot give {key!r} "
                          f"({type(exc).__name__}: {exc})") from None
    if backend is None:
        raise ConfigError(f"{source}: no secrets backend is configured in Airflow "
                          "([secrets] backend); configure one, or use the _cmd form")
    if value is None:
        raise ConfigError(f"{source}: Airflow's secrets backend "
                          f"({type(backend).__name__}) has no config {key!r}; add it there")
    return value, type(backend).__name__


def _shown(spec: Spec, raw: Any) -> str:
    return "<hidden>" if spec.secret else repr(raw)


def _value_shown(spec: Spec, value: Any) -> str:
    """A resolved value for `localstate config`: a secret string never (ApiToken's own repr
    leaves its secret out)."""
    return "<hidden>" if spec.secret and isinstance(value, str) else repr(value)


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
    for name in SPECS:
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
