"""What a scraper and a load balancer call:

    GET /metrics   Prometheus text from one database snapshot (metrics.py)
    GET /healthz   200 when the database answers, takes writes and its
                   schema is up to date; 503 within 2 s otherwise
    GET /health/details
                   the doctor (core/doctor.py): capacity and what threatens
                   it, as JSON; behind the API's tokens like every route
                   but /healthz

The other monitoring routes are workers.py (GET /workers) and access.py
(GET /access).
"""

# No "from __future__ import annotations": FastAPI reads the signatures at run time.

import asyncio
import logging
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field

from ..core import reads
from ..core.doctor import DoctorOptions
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

__all__ = ["HEALTH_TIMEOUT_SECONDS", "HealthCheckOut", "HealthReportOut", "router"]

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


class HealthCheckOut(BaseModel):
    name: str
    status: Literal["ok", "warn", "fail"]
    finding: str = Field(description="One line, with the number.")
    advice: str = Field(description="What to do (empty when nothing).")
    source: str = Field(description="Where the number came from.")
    value: float | None = Field(description="The number, in unit; null: not measured.")
    unit: str


class HealthReportOut(BaseModel):
    status: Literal["ok", "warn", "fail"] = Field(description="The worst check's status.")
    window_seconds: float = Field(description="The window the rate and costs were measured over.")
    role: str = Field(description="The database role the checks ran as.")
    measured_at: datetime
    checks: list[HealthCheckOut]


_DEFAULTS = DoctorOptions()


@router.get(
    "/health/details",
    response_model=HealthReportOut,
    responses=documented_errors(),
    summary="The doctor: measured cost and headroom, and what threatens them "
    "(waits window_seconds to measure the rate)",
)
async def health_details(
    request: Request,
    window_seconds: Annotated[
        float, Query(ge=0.1, le=60, description="How long to measure the rate over.")
    ] = _DEFAULTS.window_seconds,
    long_transaction_seconds: Annotated[
        float, Query(gt=0, le=86_400, description="A transaction open longer is reported.")
    ] = _DEFAULTS.long_transaction_seconds,
    cores: Annotated[
        int | None,
        Query(ge=1, le=4096, description="The server's cores, for the headroom in jobs/s."),
    ] = None,
) -> HealthReportOut:
    queue: AsyncQueue = request.app.state.queue
    report = await queue.doctor(
        window_seconds=window_seconds,
        long_transaction_seconds=long_transaction_seconds,
        cores=cores,
    )
    return HealthReportOut.model_validate(report.to_dict())
