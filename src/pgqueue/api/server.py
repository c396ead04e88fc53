"""``pgqueue api``: run the app with uvicorn, refusing to expose it unprotected."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import threading
from collections.abc import Iterator

import uvicorn

from ..errors import InvalidSettings
from ..settings import Settings
from .app import create_app

__all__ = ["is_loopback", "resolve_bind", "serve"]

log = logging.getLogger("pgqueue.api")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def resolve_bind(
    settings: Settings, host: str | None, port: int | None, *, allow_public: bool = False
) -> tuple[str, int]:
    """The address to bind. Without tokens, only loopback, unless ``allow_public``."""
    host = host or settings.api_host
    port = settings.api_port if port is None else port
    if not 0 <= port <= 65535:
        raise InvalidSettings(f"port must be between 0 and 65535, got {port}")
    if not (settings.api_tokens or settings.api_read_tokens):
        if not is_loopback(host) and not allow_public:
            raise InvalidSettings(
                f"refusing to serve the API on {host} without authentication: set "
                "PGQUEUE_API_TOKENS (and optionally PGQUEUE_API_READ_TOKENS), or allow it "
                "explicitly (pgqueue api --allow-public)"
            )
        if is_loopback(host):
            log.warning(
                "no API token configured: serving on %s (loopback) only",
                host,
                extra={"action": "api_loopback_only"},
            )
        else:
            log.warning(
                "no API token configured and serving on %s: anyone who can reach "
                "this address can enqueue and cancel jobs",
                host,
                extra={"action": "api_public_without_auth"},
            )
    return host, port


def serve(
    settings: Settings,
    *,
    host: str | None = None,
    port: int | None = None,
    allow_public: bool = False,
    access_log: bool = False,
) -> None:
    """Serve the API in this process (one uvicorn worker); return after a
    graceful stop on SIGINT or SIGTERM. Raises InvalidSettings for a
    non-loopback host without tokens, unless ``allow_public``."""
    bind_host, bind_port = resolve_bind(settings, host, port, allow_public=allow_public)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=bind_host,
        port=bind_port,
        lifespan="on",
        access_log=access_log,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=10,
    )
    with _return_after_signals():
        uvicorn.Server(config).run()


@contextlib.contextmanager
def _return_after_signals() -> Iterator[None]:
    """uvicorn stops gracefully on SIGINT/SIGTERM, then raises the signal again
    to the handler it found. Give it one that does nothing, so that serve()
    returns (exit status 0) instead of dying by the signal after a clean stop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
