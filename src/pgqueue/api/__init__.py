"""The HTTP API: producers enqueue, operators inspect, Prometheus scrapes.

    app.py          create_app(): the middleware and the routers, over one
                    AsyncQueue (app.state.queue)
    jobs.py         enqueue (one, a batch), read, list, cancel, retry
    queues.py       per-queue numbers; pause, resume, limits
    monitoring.py   /metrics, /healthz
    events.py       /events: changes pushed (Server-Sent Events) over one
                    listening connection per process (EventHub)
    models.py       request and response bodies (strict; limits in the schema)
    middleware.py   before parsing: bearer-token auth (or, without tokens, the
                    Host and same-origin checks), the body size limit, HEAD
    http_errors.py  one JSON error shape; exceptions -> statuses
    metrics.py      what /metrics says: one read-only snapshot, as Prometheus text
    pages.py        /openapi.json, /docs (Swagger UI, offline), /dashboard
    server.py       serve(): uvicorn, loopback only unless tokens are set,
                    slow clients cut off, event streams ended when it stops

Endpoints, auth and metrics are documented in docs/api.md.
"""

from __future__ import annotations

from .app import create_app
from .server import serve

__all__ = ["create_app", "serve"]
