"""OpenTelemetry tracing: spans for enqueue, claim and a handler's run, and
the enqueuer's trace context carried in the job (docs/tracing.md).

At enqueue, the trace context current in the caller (a span of theirs, or an
HTTP request's ``traceparent``) is written into each job's metadata under
``CONTEXT_KEY`` as W3C headers, by the propagator OpenTelemetry is set up
with (``stamper``). The worker reads it back, and the span of each attempt is
a child of that context (``running``): a request, the jobs it enqueued and
their runs are one trace.

Spans (``tracer`` "pgqueue"):

    enqueue {task}   PRODUCER  one per enqueue
    enqueue_many     PRODUCER  one per enqueue_many (its batch size)
    workflow         PRODUCER  one per workflow enqueued
    claim            CLIENT    one per claim statement that claimed jobs
    run {task}       CONSUMER  one per attempt, child of the enqueuer's context

Only this module imports OpenTelemetry (``opentelemetry-api``: ``pip install
'pgqueue[otel]'``). Without it, or with the setting ``tracing`` off, every
function here gives back what it was given, and nothing is written into jobs.
OpenTelemetry's API records nothing until the application installs an SDK
(a TracerProvider), so with the API alone the spans are no-ops.

Installed, it is imported only once the process uses it (``_in_use``: the
application imported its trace API, to install an SDK or to start a span,
or a job arrived carrying a trace context): a worker process of an
application that does not trace would pay its import (about 0.02 s of the
start) for spans that nobody records and no context to carry.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from .core.flows import Flow
from .core.job_spec import JobSpec
from .core.jobs import Job
from .core.json_text import dump_json
from .core.settings import Settings

if TYPE_CHECKING:
    from opentelemetry import context, propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    from .core import workflows
    from .core.dependencies import WorkflowJobs
    from .core.outcomes import Outcome

__all__ = [
    "CONTEXT_KEY",
    "EnqueueFlows",
    "SdkWatch",
    "available",
    "carried",
    "claims",
    "enabled",
    "failed",
    "outcome_name",
    "remote_context",
    "running",
]

P = ParamSpec("P")
T = TypeVar("T")

# The key of job metadata that holds the enqueuer's trace context.
CONTEXT_KEY = "otel"
SYSTEM = "pgqueue"


def _api_installed() -> bool:
    """Whether OpenTelemetry's API is installed, without importing it (the
    ``opentelemetry`` namespace alone, from another of its packages, is not
    the API)."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except ModuleNotFoundError:  # no opentelemetry package at all
        return False


_INSTALLED = _api_installed()
_loaded = False


def available() -> bool:
    """Whether OpenTelemetry's API is installed."""
    return _INSTALLED


def enabled(settings: Settings) -> bool:
    """Whether to trace: the API is installed and the setting is on."""
    return _INSTALLED and settings.tracing


def _load() -> None:
    """Import OpenTelemetry's API into this module's names, once (callers
    have checked ``enabled``)."""
    global _loaded, context, propagate, trace, SpanKind, Status, StatusCode
    if not _loaded:
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        _loaded = True


def _in_use() -> bool:
    """Whether this process uses OpenTelemetry (see the module's docstring):
    without its trace API imported, no span can be current and no SDK
    installed, so there is no context to carry and no span to record."""
    if not _loaded:
        if "opentelemetry.trace" not in sys.modules:
            return False
        _load()
    return True


def _tracer() -> trace.Tracer:
    # Made once: before the application installs its TracerProvider this is
    # OpenTelemetry's proxy, which hands over to the provider once there is one.
    global _TRACER
    if _TRACER is None:
        _load()
        _TRACER = trace.get_tracer(SYSTEM)
    return _TRACER


_TRACER: trace.Tracer | None = None


def _sdk_installed() -> bool:
    """Whether the application installed a TracerProvider (without one,
    every span is a no-op)."""
    return _in_use() and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


# -- the producer's side -----------------------------------------------------------


def _current_headers() -> dict[str, str] | None:
    """The current trace context as W3C headers (traceparent, tracestate,
    baggage), or None when no span is current."""
    if not _in_use() or not trace.get_current_span().get_span_context().is_valid:
        return None
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers or None


def _unchanged(specs: list[JobSpec]) -> list[JobSpec]:
    return specs


def _stamped(specs: list[JobSpec]) -> list[JobSpec]:
    """The specs with the caller's trace context in their metadata (a
    caller's other keys are kept; a ``CONTEXT_KEY`` of theirs is replaced
    while a span is current)."""
    headers = _current_headers()
    if headers is None:
        return specs
    alone = dump_json({CONTEXT_KEY: headers}, "metadata")  # the usual case: no other key

    def stamp(spec: JobSpec) -> JobSpec:
        if spec.metadata_json is None:
            return spec._replace(metadata_json=alone)
        metadata = json.loads(spec.metadata_json) | {CONTEXT_KEY: headers}
        return spec._replace(metadata_json=dump_json(metadata, "metadata"))

    return [stamp(spec) for spec in specs]


class EnqueueFlows:
    """A queue's flows that enqueue, each recorded as a PRODUCER span, and
    its ``stamp`` of the caller's trace context on new jobs (tracing off:
    the flows themselves, and a stamp that changes nothing). The stamp
    also seals the payloads of encrypted tasks (core/sealing.py): every
    job a queue writes passes it."""

    def __init__(self, settings: Settings) -> None:
        # Imported here, by the queues that enqueue: a worker process does
        # without these modules (their import is part of its start-up).
        from .core import workflows
        from .core.enqueue import enqueue, enqueue_many, enqueue_plain

        self.on = on = enabled(settings)
        traced = _stamped if on else _unchanged
        sealing = settings.sealing
        self.stamp: Callable[[list[JobSpec]], list[JobSpec]] = (
            (lambda specs: sealing.seal_specs(traced(specs))) if sealing.keys else traced
        )
        self.enqueue = _enqueued(on, enqueue)
        self.enqueue_many = _enqueued(on, enqueue_many, "enqueue_many")
        self.enqueue_plain = _enqueued(on, enqueue_plain, "enqueue_many")
        enqueue_workflow = _enqueued(on, workflows.enqueue, "workflow")
        self.workflow: Callable[[workflows.Workflow], Flow[WorkflowJobs]] = lambda flow: (
            enqueue_workflow(flow, settings.default_max_attempts, self.stamp)
        )

    async def grouped(self, write: Callable[[JobSpec], Awaitable[Job]], spec: JobSpec) -> Job:
        """``write(spec)``, a group committer's enqueue, recorded as the span
        of a single enqueue: from the call to its answer (the group's commit)."""
        if not self.on:
            return await write(spec)
        name, attributes, start = f"enqueue {spec.task}", _enqueue_attributes(spec), time.time_ns()
        try:
            job = await write(spec)
        except BaseException as exc:
            _end_span(name, "PRODUCER", attributes, start, error=exc)
            raise
        _end_span(name, "PRODUCER", attributes, start, result=job)
        return job


def _enqueued(on: bool, make: Callable[P, Flow[T]], name: str = "enqueue") -> Callable[P, Flow[T]]:
    if not on:
        return make

    def traced(*args: P.args, **kwargs: P.kwargs) -> Flow[T]:
        attributes = _enqueue_attributes(args[0])
        first = args[0]
        span_name = f"{name} {first.task}" if isinstance(first, JobSpec) else name
        return _recorded(make(*args, **kwargs), span_name, "PRODUCER", attributes)

    return traced


def _enqueue_attributes(jobs: Any) -> dict[str, Any]:
    if isinstance(jobs, JobSpec):
        return _attributes(jobs.queue, task=jobs.task)
    if isinstance(jobs, Sequence):
        return {"messaging.system": SYSTEM, "messaging.batch.message_count": len(jobs)}
    return {"messaging.system": SYSTEM}


def _recorded(
    flow: Flow[T],
    name: str,
    kind: str,
    attributes: dict[str, Any],
    keep: Callable[[T], bool] = lambda _: True,
) -> Flow[T]:
    """``flow``, recorded as a span from its first statement to its end,
    made when it ends (under the context current then: the caller's): a
    flow whose result ``keep`` refuses leaves no span. A flow that fails,
    or is abandoned (its statement failed), is a span with status ERROR."""
    start = time.time_ns()
    try:
        result = yield from flow
    except BaseException as exc:
        _end_span(name, kind, attributes, start, error=exc)
        raise
    if keep(result):
        _end_span(name, kind, attributes, start, result=result)
    return result


def _end_span(
    name: str,
    kind: str,
    attributes: dict[str, Any],
    start: int,
    *,
    error: BaseException | None = None,
    result: Any = None,
) -> None:
    """A span of ``kind`` (a SpanKind's name) that began at ``start`` and
    ends now: ERROR with ``error``, else with what ``result`` says. None
    when OpenTelemetry is not in use: no SDK could record it."""
    if not _in_use():
        return
    span = _tracer().start_span(name, kind=SpanKind[kind], attributes=attributes, start_time=start)
    if error is not None:
        if not isinstance(error, GeneratorExit):
            span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, _describe(error)))
    else:
        for key, value in _result_attributes(result).items():
            span.set_attribute(key, value)
    span.end()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, GeneratorExit):
        return "abandoned: a statement failed"
    return f"{type(exc).__name__}: {exc}"


def _result_attributes(result: Any) -> dict[str, Any]:
    if isinstance(result, Job):
        attributes = {"messaging.message.id": str(result.id), "pgqueue.duplicate": result.duplicate}
        if result.debounced:  # on_conflict changed the waiting job: replaced, extended
            attributes["pgqueue.debounced"] = result.debounced
        return attributes
    from .core.dependencies import WorkflowJobs  # (as in EnqueueFlows: not at import)

    if isinstance(result, WorkflowJobs):
        return {
            "pgqueue.workflow.id": str(result.id),
            "messaging.batch.message_count": len(result.jobs),
        }
    if isinstance(result, list):
        return {"messaging.batch.message_count": len(result)}
    return {}


# -- the worker's side -----------------------------------------------------------------


def claims(settings: Settings, make: Callable[P, Flow[list[Job]]]) -> Callable[P, Flow[list[Job]]]:
    """``make`` (the claim flow), each claim recorded as a CLIENT span when
    it claimed jobs (an idle worker's empty claims, one per poll, would be
    noise), with the batch size and the slots it asked for (its ``limit``).
    Off: ``make`` itself."""
    if not enabled(settings):
        return make

    def traced(*args: P.args, **kwargs: P.kwargs) -> Flow[list[Job]]:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "receive",
            "pgqueue.claim.limit": kwargs.get("limit"),
        }
        return _recorded(make(*args, **kwargs), "claim", "CLIENT", attributes, keep=bool)

    return traced


def _attributes(queue: str, **more: Any) -> dict[str, Any]:
    named = {f"pgqueue.{key}": value for key, value in more.items()}
    return {"messaging.system": SYSTEM, "messaging.destination.name": queue, **named}


class SdkWatch:
    """Whether the application installed a TracerProvider, for a worker that
    asks at every attempt: OpenTelemetry's own check reads the environment
    each time, and this keeps that off the path of every job. A provider,
    once set, stays (it cannot be replaced); while there is none, it is
    looked for again at most once a second."""

    def __init__(self) -> None:
        self._installed = False
        self._looked_at = -math.inf  # monotonic

    def __call__(self) -> bool:
        if not self._installed and time.monotonic() - self._looked_at >= 1.0:
            self._installed = _sdk_installed()
            self._looked_at = time.monotonic()
        return self._installed


def running(
    job: Job, sdk_installed: Callable[[], bool] = _sdk_installed
) -> contextlib.AbstractContextManager[Callable[[Outcome], None]] | None:
    """The span of one attempt, current while the handler runs: a child of
    the context its enqueuer left in the job's metadata (a root span
    without one). Gives the function that records how it ended; an
    exception the executor catches is recorded by ``failed``. None when
    the job carries no context and no SDK is installed: nothing would be
    recorded, nor handed on to the handler's own calls, and the no-op span
    is not worth its cost. (A worker passes its ``SdkWatch``.)"""
    headers = _headers(job)
    if not headers and not sdk_installed():
        return None
    return _span_of(job, headers)


@contextlib.contextmanager
def _span_of(job: Job, headers: dict[str, str]) -> Iterator[Callable[[Outcome], None]]:
    _load()  # a job's context is carried even where the application does not trace
    parent = propagate.extract(headers)
    attributes = _attributes(
        job.queue,
        task=job.task,
        attempt=job.attempts,
        **{"job.id": job.id},
    )
    attributes["messaging.message.id"] = str(job.id)
    attributes["messaging.operation.type"] = "process"
    with _tracer().start_as_current_span(
        f"run {job.task}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield lambda outcome: _ended(span, outcome)


def _headers(job: Job) -> dict[str, str]:
    """The W3C headers in the job's metadata. Only text is kept: a caller
    may have written anything under the key, and the propagator expects
    strings (it ignores a malformed one)."""
    carrier = (job.metadata or {}).get(CONTEXT_KEY)
    if not isinstance(carrier, dict):
        return {}
    return {k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}


def _ended(span: trace.Span, outcome: Outcome) -> None:
    name = outcome_name(outcome)
    span.set_attribute("pgqueue.outcome", name)
    if name == "failed":
        span.set_status(Status(StatusCode.ERROR, (outcome.error or "").split("\n", 1)[0]))


def outcome_name(outcome: Outcome) -> str:
    """succeeded, failed, snoozed or cancelled."""
    if outcome.succeeded:
        return "succeeded"
    if outcome.cancelled:
        return "cancelled"
    return "failed" if outcome.snooze_seconds is None else "snoozed"


def failed(exc: BaseException) -> None:
    """Record a handler's exception on the current span (the attempt's)."""
    if _in_use():
        trace.get_current_span().record_exception(exc)


def carried(fn: Callable[[Job], Any]) -> Callable[[Job], Any]:
    """``fn`` to run in another thread in the current context, so that the
    spans a sync handler makes are children of its attempt's."""
    current = contextvars.copy_context()
    return lambda job: current.run(fn, job)


# -- HTTP --------------------------------------------------------------------------------


@contextlib.contextmanager
def remote_context(headers: Mapping[str, str]) -> Iterator[None]:
    """The trace context of a request's headers (``traceparent``...) made
    current, unless a span is current already (the application's own
    server instrumentation made one, a child of those headers)."""
    _load()
    if trace.get_current_span().get_span_context().is_valid:
        yield
        return
    token = context.attach(propagate.extract(headers))
    try:
        yield
    finally:
        context.detach(token)
