"""OpenTelemetry tracing against a real PostgreSQL and a real worker, the
spans caught by the SDK's in-memory exporter: the handler's span is a child
of the span current at enqueue (the library, sync and async, one job, a
batch, a workflow; an HTTP request's traceparent), failures are ERROR spans
with their exception, a claim is a span, and with tracing off nothing is
recorded or written."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, StatusCode

from pgqueue import AsyncQueue, CancelJob, Job, JobState, Queue, Settings, Snooze, chain
from pgqueue.tracing import CONTEXT_KEY
from pgqueue.worker import AsyncWorker
from tests.support import api_client, running, until

JSON = {"Content-Type": "application/json"}
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"


class WhileRecording(Sampler):
    """Samples only during this module's tests: the provider is global for
    the whole pytest process, and other tests should not fill the exporter."""

    on = False

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> SamplingResult:
        # The sampler hands the span its attributes.
        decision = Decision.RECORD_AND_SAMPLE if self.on else Decision.DROP
        return SamplingResult(decision, attributes)

    def get_description(self) -> str:
        return "WhileRecording"


SAMPLER = WhileRecording()
EXPORTER = InMemorySpanExporter()
_installed: list[bool] = []


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The SDK installed (once per process), recording for this test."""
    if not _installed:
        provider = TracerProvider(sampler=SAMPLER)
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
        _installed.append(True)
    EXPORTER.clear()
    SAMPLER.on = True
    try:
        yield EXPORTER
    finally:
        SAMPLER.on = False
        EXPORTER.clear()


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as client:
        yield client


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def runs(exporter: InMemorySpanExporter, job_id: int) -> list[ReadableSpan]:
    """The attempt spans of one job, in the order they ended."""
    return [
        s
        for s in named(exporter, "run ")
        if s.attributes and s.attributes["pgqueue.job.id"] == job_id
    ]


async def ok(job: Job) -> str:
    return "ok"


async def run_all(
    settings: Settings, handlers: dict[str, Any], aqueue: AsyncQueue, ids: Sequence[int]
) -> None:
    """A real worker on the test's loop until every job of ``ids`` ended."""
    async with running(AsyncWorker(handlers, settings=settings)):
        for job_id in ids:
            await aqueue.wait(job_id, 10)


def parent_of(span: ReadableSpan) -> tuple[int, int] | None:
    return None if span.parent is None else (span.parent.trace_id, span.parent.span_id)


def ancestors(span: ReadableSpan, exporter: InMemorySpanExporter) -> list[int]:
    """The ids of the span's parent, its parent's, ... up to the first one
    not recorded here (a remote caller's)."""
    by_id = {s.context.span_id: s for s in exporter.get_finished_spans()}
    found = []
    parent = span.parent
    while parent is not None:
        found.append(parent.span_id)
        above = by_id.get(parent.span_id)
        parent = None if above is None else above.parent
    return found


def ids_of(span: trace.Span) -> tuple[int, int]:
    context = span.get_span_context()
    return context.trace_id, context.span_id


async def test_the_handler_span_is_a_child_of_the_span_that_enqueued_the_job(
    spans: InMemorySpanExporter, queue: Queue, aqueue: AsyncQueue, settings: Settings
) -> None:
    with trace.get_tracer("app").start_as_current_span("request") as request:
        job = queue.enqueue("ok", {"n": 1}, queue="mail")
    await run_all(settings, {"ok": ok}, aqueue, [job.id])
    [run] = runs(spans, job.id)
    assert parent_of(run) == ids_of(request)
    assert run.name == "run ok" and run.kind is SpanKind.CONSUMER
    assert dict(run.attributes or {}) == {
        "messaging.system": "pgqueue",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(job.id),
        "messaging.operation.type": "process",
        "pgqueue.task": "ok",
        "pgqueue.attempt": 1,
        "pgqueue.job.id": job.id,
        "pgqueue.outcome": "succeeded",
    }
    [enqueue] = named(spans, "enqueue ok")
    assert parent_of(enqueue) == ids_of(request) and enqueue.kind is SpanKind.PRODUCER
    assert (enqueue.attributes or {})["messaging.message.id"] == str(job.id)
    claims = named(spans, "claim")
    assert claims and all(s.kind is SpanKind.CLIENT and s.parent is None for s in claims)
    assert sum(int((s.attributes or {})["messaging.batch.message_count"]) for s in claims) == 1


async def test_async_enqueue_a_batch_and_a_workflow_carry_the_context_and_keep_metadata(
    spans: InMemorySpanExporter, aqueue: AsyncQueue, settings: Settings
) -> None:
    with trace.get_tracer("app").start_as_current_span("request") as request:
        one = await aqueue.enqueue("ok", metadata={"tenant": "acme"})
        many = await aqueue.enqueue_many([{"task": "ok"}] * 3)
        flow = await aqueue.enqueue_workflow(chain({"task": "ok"}, {"task": "ok"}))
    ids = [one.id, *(e.id for e in many), *(j.id for j in flow.jobs)]
    await run_all(settings, {"ok": ok}, aqueue, ids)
    for job_id in ids:
        [run] = runs(spans, job_id)
        assert parent_of(run) == ids_of(request), job_id
    stored = (await aqueue.get(one.id)).metadata or {}
    assert stored["tenant"] == "acme"
    assert stored[CONTEXT_KEY]["traceparent"].split("-")[1] == f"{ids_of(request)[0]:032x}"
    [batch] = named(spans, "enqueue_many")
    assert (batch.attributes or {})["messaging.batch.message_count"] == 3
    [workflow] = named(spans, "workflow")
    assert (workflow.attributes or {})["pgqueue.workflow.id"] == str(flow.id)


async def test_over_http_the_handler_joins_the_trace_of_the_requests_traceparent(
    spans: InMemorySpanExporter, api: httpx.AsyncClient, aqueue: AsyncQueue, settings: Settings
) -> None:
    headers = {**JSON, "traceparent": TRACEPARENT}
    one = await api.post("/jobs", json={"task": "ok"}, headers=headers)
    batch = await api.post("/jobs/batch", json={"jobs": [{"task": "ok"}]}, headers=headers)
    flow = {"jobs": [{"name": "a", "task": "ok"}]}
    made = await api.post("/workflows", json=flow, headers=headers)
    untraced = await api.post("/jobs", json={"task": "ok"}, headers=JSON)
    assert {r.status_code for r in (one, batch, made, untraced)} == {201}
    joined = [one.json()["id"], batch.json()["jobs"][0]["id"], made.json()["jobs"][0]["id"]]
    await run_all(settings, {"ok": ok}, aqueue, [*joined, untraced.json()["id"]])
    for job_id in joined:
        [run] = runs(spans, job_id)
        assert SPAN_ID in ancestors(run, spans), job_id
        assert run.context.trace_id == TRACE_ID
    [alone] = runs(spans, untraced.json()["id"])
    assert alone.context.trace_id != TRACE_ID
    stamped = one.json()["metadata"][CONTEXT_KEY]["traceparent"]
    assert stamped.startswith(f"00-{TRACE_ID:032x}-")
    # POST /jobs goes through group commit: its enqueue span is made all the same.
    [enqueued] = [
        span
        for span in spans.get_finished_spans()
        if span.name == "enqueue ok"
        and span.attributes is not None
        and span.attributes.get("messaging.message.id") == str(one.json()["id"])
    ]
    assert enqueued.context.trace_id == TRACE_ID


async def test_a_failed_attempt_is_an_error_span_with_the_exception_and_its_attempt(
    spans: InMemorySpanExporter, queue: Queue, aqueue: AsyncQueue, settings: Settings
) -> None:
    def boom(job: Job) -> None:  # sync: runs on the worker's thread pool
        raise ValueError(f"boom {job.attempts}")

    job = queue.enqueue("boom", max_attempts=2)
    await run_all(settings, {"boom": boom}, aqueue, [job.id])
    assert queue.get(job.id).state is JobState.DEAD
    attempts = runs(spans, job.id)
    assert [(s.attributes or {})["pgqueue.attempt"] for s in attempts] == [1, 2]
    for number, span in enumerate(attempts, 1):
        assert span.status.status_code is StatusCode.ERROR
        assert (span.status.description or "").startswith(f"ValueError: boom {number}")
        assert (span.attributes or {})["pgqueue.outcome"] == "failed"
        [event] = span.events
        assert event.name == "exception"
        assert (event.attributes or {})["exception.type"] == "ValueError"
        assert (event.attributes or {})["exception.message"] == f"boom {number}"


async def test_each_ending_is_named_on_the_span_and_only_a_failure_is_an_error(
    spans: InMemorySpanExporter, queue: Queue, aqueue: AsyncQueue, settings: Settings
) -> None:
    async def snooze_once(job: Job) -> None:
        if job.snoozes == 0:
            raise Snooze(0)

    async def cancel(job: Job) -> None:
        raise CancelJob("not wanted")

    snoozed, cancelled = queue.enqueue("snooze_once"), queue.enqueue("cancel")
    handlers = {"snooze_once": snooze_once, "cancel": cancel}
    await run_all(settings, handlers, aqueue, [snoozed.id, cancelled.id])
    endings = {
        job_id: [
            ((s.attributes or {})["pgqueue.outcome"], s.status.status_code)
            for s in runs(spans, job_id)
        ]
        for job_id in (snoozed.id, cancelled.id)
    }
    assert endings == {
        snoozed.id: [("snoozed", StatusCode.UNSET), ("succeeded", StatusCode.UNSET)],
        cancelled.id: [("cancelled", StatusCode.UNSET)],
    }


@pytest.mark.parametrize(
    "carried",
    ["junk", {"traceparent": 5}, {"traceparent": "00-zz-yy-01"}, {"traceparent": ["a", "b"]}],
)
async def test_a_job_whose_otel_metadata_is_junk_runs_under_a_root_span(
    spans: InMemorySpanExporter, queue: Queue, aqueue: AsyncQueue, settings: Settings, carried: Any
) -> None:
    job = queue.enqueue("ok", metadata={CONTEXT_KEY: carried})  # no span current: kept
    assert job.metadata == {CONTEXT_KEY: carried}
    await run_all(settings, {"ok": ok}, aqueue, [job.id])
    [run] = runs(spans, job.id)
    assert run.parent is None and (run.attributes or {})["pgqueue.outcome"] == "succeeded"


async def test_spans_a_sync_handler_makes_are_children_of_its_attempt(
    spans: InMemorySpanExporter, queue: Queue, aqueue: AsyncQueue, settings: Settings
) -> None:
    def fetch(job: Job) -> None:
        with trace.get_tracer("app").start_as_current_span("fetch"):
            pass

    job = queue.enqueue("fetch")
    await run_all(settings, {"fetch": fetch}, aqueue, [job.id])
    [run] = runs(spans, job.id)
    [inner] = named(spans, "fetch")
    assert parent_of(inner) == (run.context.trace_id, run.context.span_id)


async def test_an_idle_worker_records_no_claim_spans(
    spans: InMemorySpanExporter, settings: Settings
) -> None:
    worker = AsyncWorker({"ok": ok}, settings=settings.replace(poll_interval_seconds=0.02))
    async with running(worker):
        await until(lambda: worker.stats["claims"] >= 5)
    assert named(spans, "claim") == []


async def test_with_tracing_off_nothing_is_recorded_or_written(
    spans: InMemorySpanExporter, settings: Settings
) -> None:
    off = settings.replace(tracing=False)
    async with AsyncQueue(off.database_url, settings=off) as quiet:
        with trace.get_tracer("app").start_as_current_span("request"):
            job = await quiet.enqueue("ok", metadata={"tenant": "acme"})
            many = await quiet.enqueue_many([{"task": "ok"}])
        await run_all(off, {"ok": ok}, quiet, [job.id, many[0].id])
        assert (await quiet.get(job.id)).metadata == {"tenant": "acme"}
        assert (await quiet.get(many[0].id)).metadata is None
    async with api_client(off) as http:
        made = await http.post(
            "/jobs", json={"task": "ok"}, headers={**JSON, "traceparent": TRACEPARENT}
        )
    assert made.json()["metadata"] is None
    scopes = {s.instrumentation_scope.name for s in spans.get_finished_spans()}
    assert "app" in scopes and "pgqueue" not in scopes


def test_the_example_runs_and_its_handler_span_is_a_child_of_checkout(db_url: str) -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "tracing.py"
    done = subprocess.run(
        [sys.executable, str(example)],
        env={"DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first, *edges = done.stdout.splitlines()
    assert first == "metadata keys: ['otel', 'tenant']"
    assert sorted(edges) == [
        "enqueue send_receipt <- checkout",
        "render receipt <- run send_receipt",
        "run send_receipt <- checkout",
    ]
