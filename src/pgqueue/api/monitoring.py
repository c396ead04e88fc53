"""What a scraper and a load balancer call:

    GET /metrics   Prometheus text from one database snapshot (metrics.py)
    GET /healthz   200 when the database answers, takes writes and its
                   schema is up to date; 503 within 2 s otherwise

The other monitoring routes are workers.py (GET /workers) and access.py
(GET /access).
"""

# No "from __future__ import annotations": FastAPI reads the signatures at run time.

import asyncio
import logging

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from ..core import reads
from ..core.errors import DatabaseReadOnly, DatabaseUnavailable, SchemaNotMigrated
from ..queue import AsyncQueue
from . import metrics
from .http_errors import (
    ERROR_RESPONSES,
    documented_errors,
    error_response,
    read_only,
    schema_not_migrated,
)
from .models import Health

__all__ = ["HEALTH_TIMEOUT_SECONDS", "router"]

log = logging.getLogger("pgqueue.api")

# /healthz answers within 2 s: its database check gives up after this long.
HEALTH_TIMEOUT_SECONDS = 1.5
PROMETHEUS_TEXT = CONTENT_TYPE_LATEST

router = APIRouter(tags=["monitoring"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "content": {PROMETHEUS_TEXT: {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition.",
        },
        **documented_errors(),
    },
    summary="Prometheus metrics, from one database snapshot",
)
async def get_metrics(request: Request) -> Response:
    queue: AsyncQueue = request.app.state.queue
    snap = await queue.run(metrics.snapshot(), transaction=True)
    return Response(
        metrics.render(snap, queue.settings.latency_buckets), media_type=PROMETHEUS_TEXT
    )


@router.get(
    "/healthz",
    response_model=Health,
    responses={503: ERROR_RESPONSES[503], 500: ERROR_RESPONSES[500]},
    summary="200 when the database answers, takes writes and its schema is up to date; "
    "503 (within 2 s) when it does not answer, is read-only or is not migrated",
)
async def healthz(request: Request) -> Health | JSONResponse:
    queue: AsyncQueue = request.app.state.queue
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT_SECONDS):
            pending = await queue.run(reads.health())
    except DatabaseReadOnly as exc:
        return read_only(exc)
    except (TimeoutError, DatabaseUnavailable) as exc:
        log.warning(
            "health check failed: %s", exc or "timed out", extra={"action": "api_health_failed"}
        )
        return error_response(
            503,
            "database_unavailable",
            "the database did not answer",
            headers={"Retry-After": "1"},
        )
    if pending:
        return schema_not_migrated(SchemaNotMigrated(pending))
    return Health(status="ok")
