"""The trace context of each request (W3C ``traceparent``, ``tracestate``)
made current while it is handled, so that the jobs it enqueues carry it and
their handlers' spans join the caller's trace (docs/tracing.md). Only with
tracing on (``pgqueue.tracing.enabled``); otherwise nothing is added.

No server span of its own: an application that wants one instruments its
ASGI app, and then this middleware leaves that span current.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import tracing
from ..core.settings import Settings

__all__ = ["TraceContext", "add_trace_context"]


class TraceContext:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # ASGI header names are lower case, as the propagator looks them up.
        headers = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
        }
        with tracing.remote_context(headers):
            await self.app(scope, receive, send)


def add_trace_context(app: FastAPI, settings: Settings) -> None:
    """With tracing on, add the middleware (first to run)."""
    if tracing.enabled(settings):
        app.add_middleware(TraceContext)
