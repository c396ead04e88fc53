"""Two checks that run before routing and before the body is parsed.

``BearerAuth``: when any token is configured, every path except /healthz
and /dashboard needs ``Authorization: Bearer <token>``. The dashboard is a
static page that holds no data: it must load so it can ask for the token that
its own requests then carry. Admin tokens may do everything; read
tokens only GET and HEAD. Tokens are compared as SHA-256 digests with
``hmac.compare_digest`` against every configured token, so the time taken
says nothing about how much of a token was right, or which one matched.

``BodyLimit``: a request body larger than the limit gets 413 before anything
reads it as JSON: at once when Content-Length says so, otherwise as soon as
the bytes received pass the limit.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from typing import Literal

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["PUBLIC_PATHS", "READ_METHODS", "BearerAuth", "BodyLimit", "TokenSet"]

PUBLIC_PATHS = frozenset({"/healthz", "/dashboard"})
READ_METHODS = frozenset({"GET", "HEAD"})

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


def _bearer(scope: Scope) -> bytes | None:
    """The token of a well-formed ``Authorization: Bearer <token>`` header."""
    values: list[bytes] = [v for k, v in scope.get("headers", ()) if k == b"authorization"]
    if len(values) != 1:
        return None
    scheme, _, token = values[0].strip().partition(b" ")
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
