"""``pgqueue api``: run the app with uvicorn, refusing to expose it unprotected
and cutting off clients that send their requests too slowly."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..core.errors import InvalidSettings
from ..core.settings import Settings
from .app import create_app

__all__ = [
    "REQUEST_READ_TIMEOUT_SECONDS",
    "Server",
    "is_loopback",
    "resolve_bind",
    "serve",
    "slow_client_cutoff",
    "uvicorn_config",
]

log = logging.getLogger("pgqueue.api")

# A client has this long to send a whole request, headers and body (at most
# api_max_body_bytes), from when the server starts waiting for it.
REQUEST_READ_TIMEOUT_SECONDS = 20.0


class _ReadDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with one more timer. uvicorn alone waits
    forever for headers that trickle in a byte at a time (slowloris), for a
    body that never ends, and for the first request of a silent connection:
    each holds a socket. Here every request must arrive whole within
    ``read_timeout`` of when the server began to wait for it, or the
    connection is closed."""

    read_timeout = REQUEST_READ_TIMEOUT_SECONDS
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._restart_deadline()

    def on_response_complete(self) -> None:
        self._restart_deadline()  # for the next request on this connection
        super().on_response_complete()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._stop_deadline()  # the request is in, or the connection is over

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        super().connection_lost(exc)

    def _restart_deadline(self) -> None:
        self._stop_deadline()
        self._deadline = self.loop.call_later(self.read_timeout, self._too_slow)

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            log.warning(
                "closed a connection whose request did not arrive within %g s",
                self.read_timeout,
                extra={"action": "api_slow_client", "client": self.client},
            )
            self.transport.close()


def slow_client_cutoff(read_timeout: float = REQUEST_READ_TIMEOUT_SECONDS) -> type[H11Protocol]:
    """The HTTP protocol class for uvicorn, with this read timeout."""
    return type("ReadDeadline", (_ReadDeadline,), {"read_timeout": read_timeout})


def uvicorn_config(app: Any, **options: Any) -> uvicorn.Config:
    """How pgqueue runs uvicorn: the read timeout, no proxy headers (they
    would let any client claim any address), no Server header."""
    defaults: dict[str, Any] = {
        "http": slow_client_cutoff(),
        "lifespan": "on",
        "proxy_headers": False,
        "server_header": False,
    }
    return uvicorn.Config(app, **{**defaults, **options})


class Server(uvicorn.Server):
    """uvicorn's server, which first ends the app's event streams (GET
    /events) when it stops: uvicorn waits for every response to end before
    it stops, and a stream would not end by itself."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        hub = getattr(getattr(self.config.app, "state", None), "events", None)
        if hub is not None:
            await hub.close()
        await super().shutdown(sockets)


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
    own_logging: bool = False,
) -> None:
    """Serve the API in this process (one uvicorn worker); return after a
    graceful stop on SIGINT or SIGTERM. Raises InvalidSettings for a
    non-loopback host without tokens, unless ``allow_public``. With
    ``own_logging``, uvicorn's records go to the root logger's handlers (the
    caller's format) instead of uvicorn's own."""
    bind_host, bind_port = resolve_bind(settings, host, port, allow_public=allow_public)
    # The bound name is one the API answers to (when it checks Host).
    app = create_app(settings.replace(api_host=bind_host, api_port=bind_port))
    logging_options: dict[str, Any] = {"log_config": None} if own_logging else {}
    config = uvicorn_config(
        app,
        host=bind_host,
        port=bind_port,
        access_log=access_log,
        timeout_graceful_shutdown=10,
        **logging_options,
    )
    with _return_after_signals():
        Server(config).run()


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
