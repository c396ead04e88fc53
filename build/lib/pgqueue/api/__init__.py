"""The HTTP API: producers enqueue, operators inspect, Prometheus scrapes.

    app.py          create_app(): the routes, over one AsyncQueue
    models.py       request and response bodies (strict; limits in the schema)
    middleware.py   before parsing: bearer-token auth (or, without tokens, the
                    Host and same-origin checks), the body size limit, HEAD
    http_errors.py  one JSON error shape; exceptions -> statuses
    metrics.py      /metrics from one read-only snapshot
    pages.py        /openapi.json, /docs (Swagger UI, offline), /dashboard
    server.py       serve(): uvicorn, loopback only unless tokens are set,
                    slow clients cut off

Endpoints, auth and metrics are documented in docs/api.md.
"""

from __future__ import annotations

from .app import create_app
from .server import serve

__all__ = ["create_app", "serve"]
