"""The queues over HTTP: their numbers, and their controls (pause, resume,
limits; admin: every write is).

    GET   /queues                 per queue: live jobs by state, outcome
                                  totals, lag, and its controls
    POST  /queues/{name}/pause    no job of the queue starts from now on
    POST  /queues/{name}/resume   jobs start again; the workers are woken
    PATCH /queues/{name}/limits   a JSON merge patch of the limits: a limit
                                  given changes (null removes it), one not
                                  given stays
    GET   /queues/{name}/keys     the queue's per-key latency objectives,
                                  each with its key's wait and shortfall
    GET   /keys                   every queue's, in one read (the
                                  dashboard's); not under /queues/, where
                                  a queue may be named "keys"
    PUT   /queues/{name}/keys/{key}/objective
                                  declare one ({"max_start_lag_seconds": 2};
                                  null removes it)

Each write of the controls answers with the queue's controls, one of an
objective with the objective. The values are judged by
``queue_controls.change`` and ``key_objectives.set_objective``, as in the
library and the command line; a bad one is a 422 naming it, and nothing is
written.
"""

# No "from __future__ import annotations": FastAPI reads the signatures at
# run time, and the patch body's model is made at import.

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field, create_model
from starlette.convertors import StringConvertor, register_url_convertor

from ..core import stats
from ..core.key_objectives import RULES as KEY_OBJECTIVE_RULES
from ..core.key_objectives import removed
from ..core.queue_controls import LIMITS
from ..queue import AsyncQueue
from .http_errors import ERROR_RESPONSES, documented_errors
from .models import (
    QUEUE_PATTERN,
    AllKeyObjectives,
    KeyObjectiveList,
    KeyObjectiveOut,
    QueueControlsOut,
    QueueJobs,
    QueueLimits,
    QueueList,
    QueueOut,
    QueueTotals,
)

__all__ = ["router"]

router = APIRouter(tags=["queues"])

QueueName = Annotated[str, Path(pattern=QUEUE_PATTERN, description="The queue's name.")]


class _KeySegments(StringConvertor):
    """Whatever stands between /keys/ and /objective: a key may hold a
    slash or a line break (which Starlette's ``path`` does not match, a 404)
    and is judged by its rule (key_objectives.set_objective), so that an
    empty or bad key is a 422 naming ``key``."""

    regex = r"[\s\S]*"


register_url_convertor("pgqueue_key", _KeySegments())

KeyName = Annotated[str, Path(description="The concurrency_key, 1 to 255 characters.")]
RESPONSES: dict[int | str, dict[str, Any]] = {
    status: ERROR_RESPONSES[status] for status in (400, 401, 403, 413, 422, 500, 503)
}


class _Patch(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _patch_model() -> type[_Patch]:
    # Any: the values are judged by controls.change, not by pydantic; the
    # schema still says what each may be.
    fields: dict[str, Any] = {
        name: (
            Any,
            Field(
                default=None,
                description=f"{text} null removes it.",
                json_schema_extra={"anyOf": [rule.json_schema(), {"type": "null"}]},
            ),
        )
        for name, (rule, text) in LIMITS.items()
    }
    return create_model("QueueLimitsPatch", __base__=_Patch, **fields)


class KeyObjectivePut(_Patch):
    # Any: judged by key_objectives.set_objective, as in the library.
    max_start_lag_seconds: Any = Field(
        description="The longest the key's runnable jobs should wait to start; null removes "
        "the objective.",
        json_schema_extra={
            "anyOf": [KEY_OBJECTIVE_RULES["max_start_lag_seconds"].json_schema(), {"type": "null"}]
        },
    )


if TYPE_CHECKING:
    QueueLimitsPatch = _Patch
else:
    QueueLimitsPatch = _patch_model()


def _queue(request: Request) -> AsyncQueue:
    queue: AsyncQueue = request.app.state.queue
    return queue


@router.get(
    "/queues",
    response_model=QueueList,
    responses=documented_errors(),
    summary="Per queue: live jobs by state, outcome totals, lag",
)
async def list_queues(request: Request) -> QueueList:
    rows = await _queue(request).run(stats.per_queue(), transaction=True)
    return QueueList(
        queues=[
            QueueOut(
                queue=name,
                jobs=QueueJobs(
                    queued=row.queued,
                    scheduled=row.scheduled,
                    running=row.running,
                    waiting=row.waiting,
                ),
                totals=QueueTotals(
                    succeeded=row.succeeded,
                    failed_attempts=row.failed,
                    dead=row.dead,
                    cancelled=row.cancelled,
                    snoozed=row.snoozed,
                ),
                oldest_runnable_seconds=row.oldest_runnable_seconds,
                start_lag_shortfall_seconds=row.start_lag_shortfall_seconds,
                paused=row.paused,
                limits=QueueLimits(**row.limits()),
            )
            for name, row in rows.items()
        ]
    )


def _pausing(paused: bool) -> Callable[[str, Request], Awaitable[QueueControlsOut]]:
    """The route that pauses (or resumes) the queue it names."""

    async def route(name: QueueName, request: Request) -> QueueControlsOut:
        queue = _queue(request)
        return QueueControlsOut.of(await (queue.pause(name) if paused else queue.resume(name)))

    return route


for _action, _paused, _summary, _description in (
    (
        "pause",
        True,
        "Pause a queue",
        "No job of the queue starts from now on, on any worker; running jobs finish. "
        "A queue may be paused before it has jobs.",
    ),
    ("resume", False, "Resume a queue", "Its jobs start again; idle workers are woken at once."),
):
    router.add_api_route(
        f"/queues/{{name}}/{_action}",
        _pausing(_paused),
        methods=["POST"],
        name=f"{_action}_queue",
        response_model=QueueControlsOut,
        responses=RESPONSES,
        summary=_summary,
        description=_description,
    )


@router.patch(
    "/queues/{name}/limits",
    response_model=QueueControlsOut,
    responses=RESPONSES,
    summary="Change a queue's limits",
    description="A JSON merge patch: each limit given changes (null removes it), the others "
    "stay. A rate limit needs rate_period_seconds (given now, or already set).",
)
async def set_queue_limits(
    name: QueueName, body: QueueLimitsPatch, request: Request
) -> QueueControlsOut:
    limits = body.model_dump(exclude_unset=True)
    return QueueControlsOut.of(await _queue(request).set_limits(name, **limits))


@router.get(
    "/queues/{name}/keys",
    response_model=KeyObjectiveList,
    responses=RESPONSES,
    summary="A queue's per-key latency objectives",
    description="Each concurrency_key with an objective, the wait of its next job (as the "
    "claims weigh it) and how far that is past the objective.",
)
async def list_key_objectives(name: QueueName, request: Request) -> KeyObjectiveList:
    objectives = await _queue(request).key_objectives(name)
    return KeyObjectiveList(queue=name, keys=[KeyObjectiveOut.of(o) for o in objectives])


@router.get(
    "/keys",
    response_model=AllKeyObjectives,
    responses=documented_errors(),
    summary="Every queue's per-key latency objectives",
    description="As GET /queues/{name}/keys, for every queue in one read, by queue and key.",
)
async def list_all_key_objectives(request: Request) -> AllKeyObjectives:
    objectives = await _queue(request).key_objectives()
    return AllKeyObjectives(keys=[KeyObjectiveOut.of(o) for o in objectives])


@router.put(
    "/queues/{name}/keys/{key:pgqueue_key}/objective",
    response_model=KeyObjectiveOut,
    responses=RESPONSES,
    summary="Declare a key's latency objective",
    description="In a fair queue, a key whose next job has waited half of its objective is "
    "claimed before the round robin, the furthest behind first. null removes it.",
)
async def set_key_objective(
    name: QueueName, key: KeyName, body: KeyObjectivePut, request: Request
) -> KeyObjectiveOut:
    seconds = body.max_start_lag_seconds
    objective = await _queue(request).set_key_objective(name, key, seconds)
    return KeyObjectiveOut(**(objective.to_dict() if objective else removed(name, key)))
