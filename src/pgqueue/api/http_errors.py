"""Every error as one JSON shape, and the mapping from exceptions to statuses.

{"error": "invalid_input", "message": "priority: must be ...",
 "field": "priority", "problems": [{"field": "priority", "problem": "..."}]}

RequestValidationError (pydantic)    422 invalid_input  (400 malformed_json)
InvalidJob, InvalidQueueControl,     422 invalid_input
InvalidSchedule
The server refusing a value (DataError) 422 invalid_input  (the database refused a value)
JobNotFound, WorkflowNotFound,       404 not_found
ScheduleNotFound
BatchNotFound                        404 not_found (field: batch, jobs[3].batch or batch_id)
JobStateConflict, ScheduleConflict   409 conflict
BatchClosed                          409 conflict  (field: batch, jobs[3].batch)
DatabaseUnavailable                  503 database_unavailable  (Retry-After: 1)
DatabaseReadOnly                     503 database_read_only    (Retry-After: 1; failover)
EnqueueOutcomeUnknown                503 enqueue_outcome_unknown (Retry-After: 1; job_ids:
                                     the jobs may exist: GET them)
OutcomeUnknown (any other write)     503 outcome_unknown (Retry-After: 1; it may have
                                     been done: read the state)
SchemaNotMigrated                    503 schema_not_migrated   (run `pgqueue migrate`)
HTTPException (404 route, 405, ...)  its status
anything else                        500 internal_error, logged, no traceback sent
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ..core.errors import (
    BatchClosed,
    BatchNotFound,
    DatabaseReadOnly,
    DatabaseUnavailable,
    EnqueueOutcomeUnknown,
    InvalidJob,
    InvalidQueueControl,
    InvalidSchedule,
    JobNotFound,
    JobStateConflict,
    OutcomeUnknown,
    ScheduleConflict,
    ScheduleNotFound,
    SchemaNotMigrated,
    WorkflowNotFound,
)
from ..db.driver import REFUSED_VALUE_ERRORS
from .models import ErrorBody

__all__ = [
    "ERROR_RESPONSES",
    "documented_errors",
    "error_response",
    "install_handlers",
    "outcome_unknown",
    "read_only",
    "schema_not_migrated",
]

log = logging.getLogger("pgqueue.api")

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    503: "database_unavailable",
}


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    field: str | None = None,
    problems: Sequence[tuple[str, str]] = (),
    headers: dict[str, str] | None = None,
    job_ids: Sequence[int] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "error": code,
        "message": message,
        "field": field,
        "problems": [{"field": f, "problem": p} for f, p in problems],
    }
    if job_ids is not None:
        body["job_ids"] = list(job_ids)
    return JSONResponse(body, status_code=status, headers=headers)


def _field_name(loc: Sequence[Any]) -> str:
    """('body', 'jobs', 3, 'priority') -> 'jobs[3].priority'; ('query', 'limit') -> 'limit'."""
    parts = list(loc[1:]) if loc and loc[0] in ("body", "query", "path", "header") else list(loc)
    name = ""
    for part in parts:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += ("." if name else "") + str(part)
    return name or (str(loc[0]) if loc else "body")


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = []
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            reason = (error.get("ctx") or {}).get("error", "invalid JSON")
            position = error["loc"][1] if len(error.get("loc", ())) > 1 else "?"
            return error_response(
                400,
                "malformed_json",
                f"the body is not valid JSON: {reason} (at character {position})",
                field="body",
            )
        field = _field_name(error.get("loc", ()))
        problem = str(error.get("msg", "is invalid")).removeprefix("Value error, ")
        kind = error.get("type")
        if kind == "missing":
            problem = "is required"
        elif kind == "extra_forbidden":
            problem = "is not a known field"
        elif kind == "string_unicode":  # a field name with a lone surrogate
            problem = "has a field name that is not valid Unicode text (a lone surrogate)"
        elif field == "body" and kind in ("model_attributes_type", "dict_type"):
            problem = "must be a JSON object, sent with Content-Type: application/json"
        problems.append((field, problem))
    first_field, first_problem = problems[0] if problems else ("body", "is invalid")
    return error_response(
        422,
        "invalid_input",
        f"{first_field}: {first_problem}",
        field=first_field,
        problems=problems,
    )


async def _invalid_input(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidJob | InvalidQueueControl | InvalidSchedule)
    return error_response(
        422,
        "invalid_input",
        f"{exc.field}: {exc.problem}",
        field=exc.field,
        problems=[(exc.field, exc.problem)],
    )


async def _data_error(request: Request, exc: Exception) -> JSONResponse:
    # A value got past validation that PostgreSQL refuses (class 22 SQLSTATE).
    # The statement failed, so nothing was written.
    diag = getattr(exc, "diag", None)
    detail = getattr(diag, "message_primary", None) or "a value is out of range"
    log.warning("database refused a value", extra={"action": "api_data_error", "detail": detail})
    return error_response(422, "invalid_input", f"the database refused a value: {detail}")


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return error_response(404, "not_found", str(exc))


async def _batch_not_found(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BatchNotFound)
    return error_response(
        404, "not_found", str(exc), field=exc.field, problems=[(exc.field, exc.problem)]
    )


async def _conflict(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, JobStateConflict | ScheduleConflict | BatchClosed)
    return error_response(
        409, "conflict", str(exc), field=exc.field, problems=[(exc.field, exc.problem)]
    )


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", exc, extra={"action": "api_database_unavailable"})
    if isinstance(exc, DatabaseReadOnly):
        return read_only(exc)
    if isinstance(exc, EnqueueOutcomeUnknown):
        return outcome_unknown(exc)
    if isinstance(exc, OutcomeUnknown):
        return error_response(503, "outcome_unknown", str(exc), headers={"Retry-After": "1"})
    return error_response(
        503,
        "database_unavailable",
        "the database did not answer in time",
        headers={"Retry-After": "1"},
    )


def read_only(exc: DatabaseReadOnly) -> JSONResponse:
    """503: the database answers but takes no writes (a failover is under
    way, or the URL names a standby). Nothing was written."""
    return error_response(503, "database_read_only", str(exc), headers={"Retry-After": "1"})


def outcome_unknown(exc: EnqueueOutcomeUnknown) -> JSONResponse:
    """503: an enqueue's commit went out and its answer never came back, so
    its jobs may exist, under the ids it reserved (``job_ids``): never
    "nothing was written". GET /jobs/{id} tells; a retry without an
    idempotency key may make a second job."""
    return error_response(
        503,
        "enqueue_outcome_unknown",
        str(exc),
        field="id",
        problems=[("id", f"job {job_id} may exist: GET /jobs/{job_id}") for job_id in exc.job_ids],
        headers={"Retry-After": "1"},
        job_ids=exc.job_ids,
    )


def schema_not_migrated(exc: SchemaNotMigrated) -> JSONResponse:
    """503: the database answers, but pgqueue's tables are missing or older
    than this code. Not a bug: an operator has a command to run."""
    missing = f" (missing: {', '.join(exc.pending)})" if exc.pending else ""
    log.warning("schema not migrated%s", missing, extra={"action": "api_schema_not_migrated"})
    return error_response(
        503, "schema_not_migrated", f"schema not migrated{missing}: run `pgqueue migrate`"
    )


async def _schema_missing(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SchemaNotMigrated)
    return schema_not_migrated(exc)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        # FastAPI's answer to a body json.loads could not read at all.
        return error_response(
            400,
            "malformed_json",
            "the body could not be read as JSON (invalid UTF-8, "
            "nested too deeply, or a number too long)",
            field="body",
        )
    code = _CODES.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(_allowed_methods(request))
    return error_response(exc.status_code, code, message, headers=headers)


# The methods routes are declared with (HEAD is GET's: middleware.HeadAsGet).
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> list[str]:
    """Every method of the path, and HEAD where GET is (middleware.HeadAsGet).
    Starlette's own Allow header names only the first route that matched the
    path (POST /jobs, not GET /jobs as well). Each method is asked of every
    route: an included router answers for its own routes, which it may not
    list in app.routes."""
    methods = {
        method
        for method in _METHODS
        for route in request.app.routes
        if route.matches({**request.scope, "method": method})[0] == Match.FULL
    }
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    log.exception(
        "unhandled error in %s %s",
        request.method,
        request.url.path,
        extra={"action": "api_internal_error"},
    )
    return error_response(500, "internal_error", "internal error; the server log has the details")


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(InvalidJob, _invalid_input)
    app.add_exception_handler(InvalidQueueControl, _invalid_input)
    app.add_exception_handler(InvalidSchedule, _invalid_input)
    for refused in REFUSED_VALUE_ERRORS:
        app.add_exception_handler(refused, _data_error)
    app.add_exception_handler(JobNotFound, _not_found)
    app.add_exception_handler(WorkflowNotFound, _not_found)
    app.add_exception_handler(ScheduleNotFound, _not_found)
    app.add_exception_handler(JobStateConflict, _conflict)
    app.add_exception_handler(ScheduleConflict, _conflict)
    app.add_exception_handler(BatchNotFound, _batch_not_found)
    app.add_exception_handler(BatchClosed, _conflict)
    app.add_exception_handler(DatabaseUnavailable, _unavailable)
    app.add_exception_handler(SchemaNotMigrated, _schema_missing)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    # Exception goes to Starlette's outermost middleware: the response is
    # ours, and the exception is still raised afterwards for the server log.
    app.add_exception_handler(Exception, _internal)


def _doc(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


# Documented on every operation, so that clients (and schemathesis) know them.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _doc("Malformed JSON or an unreadable request."),
    401: _doc("Missing, malformed or unknown bearer token."),
    403: _doc("A read-only token on an endpoint that changes jobs."),
    413: _doc("The body is larger than the configured limit."),
    422: _doc("A field is missing, unknown, of the wrong type or out of range."),
    500: _doc("A bug; the server log has the details."),
    503: _doc(
        "The database did not answer in time (retry; nothing was written), or its schema is "
        "not migrated (run `pgqueue migrate`); enqueue_outcome_unknown: an enqueue's commit "
        "went out and no answer came back, so its jobs may exist (GET each of job_ids); "
        "outcome_unknown: another change's write went out unanswered, so it may have been "
        "done (read the state before doing it again)."
    ),
}


_DESCRIBE = {404: "No job has this id.", 409: "The job's state does not allow this."}


def documented_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of an operation: the errors every endpoint may
    answer, and ``statuses`` (403, 404, 409) where it may answer those too."""
    common = {400, 401, 413, 422, 500, 503}
    return {
        s: ERROR_RESPONSES.get(s) or {"model": ErrorBody, "description": _DESCRIBE[s]}
        for s in sorted(common | set(statuses))
    }
