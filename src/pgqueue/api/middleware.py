"""Checks that run before routing and before the body is parsed.

``BearerAuth``: when any token is configured, every path except /healthz
and /dashboard needs ``Authorization: Bearer <token>``. The dashboard is a
static page that holds no data: it must load so it can ask for the token that
its own requests then carry. Admin tokens may do everything; read
tokens only GET and HEAD. Tokens are compared as SHA-256 digests with
``hmac.compare_digest`` against every configured token, so the time taken
says nothing about how much of a token was right, or which one matched.

``SameOrigin`` (only when no token is configured): without tokens, the
danger is a browser on the same machine, whose pages may all send requests
here. With tokens, a page cannot send the token, so bearer auth covers it.
  * ``Host`` must name this server: an IP address, ``localhost``, the bound
    host name or a configured name. A page on another name that resolves to
    us (DNS rebinding) gets 400 and so cannot read jobs.
  * A request that changes jobs must be one that a page on another origin
    cannot send without a CORS preflight, which this API never grants:
    ``Content-Type: application/json`` (else 415). A foreign ``Origin``, or
    ``Sec-Fetch-Site`` other than same-origin, gets 403. Pages on another
    port of the same host are "same-site" but not same-origin: refused.

``BodyLimit``: a request body larger than the limit gets 413 before anything
reads it as JSON: at once when Content-Length says so, otherwise as soon as
the bytes received pass the limit.

``HeadAsGet``: HEAD wherever GET is: the route runs as GET and the body is
dropped, its headers (Content-Length included) kept.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Iterable
from typing import Literal
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "HEAD_SCOPE_KEY",
    "PUBLIC_PATHS",
    "READ_METHODS",
    "BearerAuth",
    "BodyLimit",
    "HeadAsGet",
    "SameOrigin",
    "TokenSet",
]

PUBLIC_PATHS = frozenset({"/healthz", "/dashboard"})
# Set in the scope of a HEAD request run as GET (HeadAsGet).
HEAD_SCOPE_KEY = "pgqueue.head"
READ_METHODS = frozenset({"GET", "HEAD"})
# Methods that change nothing; every other one is a write.
SAFE_METHODS = READ_METHODS | {"OPTIONS"}

Access = Literal["admin", "read"]


def _digest(token: str | bytes) -> bytes:
    raw = token.encode("utf-8") if isinstance(token, str) else token
    return hashlib.sha256(raw).digest()


class TokenSet:
    """The configured tokens, kept as digests."""

    def __init__(self, admin: Iterable[str], read: Iterable[str]) -> None:
        self._tokens: list[tuple[bytes, Access]] = [(_digest(t), "admin") for t in admin if t]
        self._tokens += [(_digest(t), "read") for t in read if t]

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def access(self, presented: bytes) -> Access | None:
        """What a presented token may do (None: it is no token of ours)."""
        candidate = _digest(presented)
        granted: Access | None = None
        for digest, access in self._tokens:  # no early exit: same work for every token
            if hmac.compare_digest(candidate, digest) and granted != "admin":
                granted = access
        return granted


async def send_json(
    send: Send, status: int, body: dict[str, object], headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _error(code: str, message: str) -> dict[str, object]:
    return {"error": code, "message": message, "field": None, "problems": []}


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The value of a header sent once (None when absent or repeated)."""
    values: list[bytes] = [v for k, v in scope.get("headers", ()) if k == name]
    return values[0] if len(values) == 1 else None


def _text(scope: Scope, name: bytes) -> str | None:
    value = _header(scope, name)
    return None if value is None else value.decode("latin-1").strip()


def _bearer(scope: Scope) -> bytes | None:
    """The token of a well-formed ``Authorization: Bearer <token>`` header."""
    value = _header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token or b" " in token:
        return None
    return token


class BearerAuth:
    def __init__(self, app: ASGIApp, tokens: TokenSet) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.tokens.enabled or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        token = _bearer(scope)
        access = None if token is None else self.tokens.access(token)
        if access is None:
            problem = (
                "the Authorization header is missing or not 'Bearer <token>'"
                if token is None
                else "unknown token"
            )
            await send_json(
                send,
                401,
                _error("unauthorized", problem),
                [(b"www-authenticate", b'Bearer realm="pgqueue"')],
            )
            return
        if access == "read" and scope["method"] not in READ_METHODS:
            await send_json(
                send,
                403,
                _error("forbidden", "this token may only read; changing jobs needs an admin token"),
            )
            return
        # For GET /access: the dashboard shows action buttons to admin tokens only.
        scope.setdefault("state", {})["access"] = access
        await self.app(scope, receive, send)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _too_large(self, send: Send) -> None:
        await send_json(
            send,
            413,
            _error("too_large", f"the request body is larger than {self.max_bytes} bytes"),
            [(b"connection", b"close")],
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lengths = [v for k, v in scope.get("headers", ()) if k == b"content-length"]
        if lengths:
            try:
                declared = int(lengths[0])
            except ValueError:
                declared = -1
            if len(lengths) > 1 or declared < 0:
                await send_json(send, 400, _error("bad_request", "invalid Content-Length"))
                return
            if declared > self.max_bytes:
                await self._too_large(send)
                return
        # Read the whole body, stopping at the limit, then hand it on.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _host_name(host: str) -> str:
    """'Example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    name, colon, port = host.rpartition(":")
    return name.rstrip(".") if colon and port.isdigit() and ":" not in name else host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class SameOrigin:
    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str], bound_host: str) -> None:
        self.app = app
        self.configured = {_host_name(h) for h in allowed_hosts if h.strip()}
        self.names = self.configured | {"localhost", _host_name(bound_host)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, code, message = refusal
        await send_json(send, status, _error(code, message))

    def _refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        host = _text(scope, b"host") or ""
        name = _host_name(host)
        if not (_is_ip(name) or name in self.names or "*" in self.names):
            return (
                400,
                "host_not_allowed",
                f"Host {host!r} is not a name of this server: add it to "
                "PGQUEUE_API_ALLOWED_HOSTS, or configure API tokens",
            )
        if scope["method"] in SAFE_METHODS:
            return None
        origin = _text(scope, b"origin")
        fetch_site = _text(scope, b"sec-fetch-site")
        if (origin is not None and not self._same_origin(origin, host)) or (
            fetch_site is not None and fetch_site not in ("same-origin", "none")
        ):
            return (
                403,
                "cross_site",
                f"a page on another site ({origin or fetch_site}) may not change jobs",
            )
        media_type = (_text(scope, b"content-type") or "").partition(";")[0].strip().lower()
        if media_type != "application/json":
            return (
                415,
                "unsupported_media_type",
                f"{scope['method']} needs Content-Type: application/json "
                "(so that no page on another site can send it)",
            )
        return None

    def _same_origin(self, origin: str, host: str) -> bool:
        """The page that sent the request is on this server: as the browser
        reached it (any scheme: a proxy may end TLS), or under a configured
        name (a proxy may rewrite Host)."""
        parts = urlsplit(origin.lower())
        if not parts.hostname:  # "null": a sandboxed frame, a file, a redirect
            return False
        return parts.netloc == host.lower() or _host_name(parts.netloc) in self.configured


class HeadAsGet:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        # HEAD_SCOPE_KEY: for a response that would never end (GET /events).
        await self.app({**scope, "method": "GET", HEAD_SCOPE_KEY: True}, receive, headers_only)
