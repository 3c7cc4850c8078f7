"""serve: the REST API and web UI over a store of their own (needs the api extra)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import signal
import sys
from collections.abc import Iterator

from localstate.cli._cache_files import cache_folder
from localstate.cli._central import settings_for
from localstate.cli._exit_codes import EXIT_ERROR
from localstate.errors import ConfigError, LocalStateError

__all__ = ["cmd_serve", "is_loopback"]


def _hidden(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) only listens on this machine."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    host = args.host or settings.api_host
    port = args.port or settings.api_port
    if settings.api_open and not settings.api_tokens and not is_loopback(host):
        raise ConfigError(
            f"refusing to serve on {host}: api_open serves the API with no token, to anyone "
            "who reaches it, so it binds loopback only. Bind 127.0.0.1, or turn api_open off "
            "(a token is then generated) or set api_tokens"
        )
    try:
        import uvicorn

        from localstate.api import create_app
    except ImportError as exc:
        raise LocalStateError(
            f"localstate serve needs the api extra ({exc.name} is missing): "
            "pip install 'localstate[api]'"
        ) from None
    from localstate._store import StateStore

    store_id = args.store_id or f"{settings.resolved_triggerer_id}-api"
    cache = args.cache_path or cache_folder(settings) / f"{store_id}.db"
    # the server writes the central DB itself, whatever sink its clients use
    store_settings = settings.replace(triggerer_id=store_id, cache_path=str(cache), sink="sql")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")

    class Server(uvicorn.Server):
        # uvicorn re-raises SIGTERM/SIGINT once it has shut down, which would end the process
        # before the store below is closed (its last flush, its cache lock): take the signals
        # here instead, and let the store close after the server stops.
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    def stop(server: uvicorn.Server) -> None:
        if server.should_exit:
            server.force_exit = True  # a second Ctrl-C: stop waiting for open connections
        server.should_exit = True

    tokens = settings.api_tokens
    login = ""
    if not tokens and not settings.api_open:
        from localstate.api._serve_token import serve_token, token_file

        generated = serve_token(settings)
        tokens = (generated,)
        login = f"?token={generated.secret}"
        auth = f"a generated token, kept in {token_file(settings)}"
    elif tokens:
        auth = f"{len(tokens)} token{'s' if len(tokens) != 1 else ''}"
    else:
        auth = "api_open: no token, open to this machine"

    async def go() -> bool:
        async with StateStore(settings=store_settings) as store:
            app = create_app(store_settings, local=store, tokens=tokens)
            config = uvicorn.Config(app, host=host, port=port, log_level=args.log_level,
                                    server_header=False, lifespan="on")
            server = Server(config)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop, server)
            print(f"localstate API and UI on http://{host}:{port}/{login} (store {store_id!r}, "
                  f"central DB {_hidden(settings.resolved_central_url)}, "
                  f"{auth})", file=sys.stderr, flush=True)
            await server.serve()
            return server.started

    return 0 if asyncio.run(go()) else EXIT_ERROR
