"""OpenTelemetry is imported once a process uses it, not with pgqueue
(pgqueue/tracing.py): a worker of an application that does not trace
starts without it, and still runs a job that carries a trace context under
that context. Each case in a fresh interpreter: this one has imported it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"

START = """
import sys
from datetime import datetime, timezone

import pgqueue.worker
from pgqueue import Queue, tracing
from pgqueue.core.jobs import Job, JobState

NOW = datetime.now(timezone.utc)


def job(metadata):
    return Job(
        id=1, queue="q", task="t", payload={}, priority=0, state=JobState.RUNNING,
        run_at=NOW, attempts=1, max_attempts=5, snoozes=0, timeout_seconds=None,
        lease_token=1, lease_expires_at=NOW, worker="w", last_error=None, result=None,
        idempotency_key=None, unique_scope=None, enqueued_at=NOW, started_at=NOW,
        finished_at=None, metadata=metadata,
    )
"""


def run(body: str) -> list[str]:
    script = START + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_process_that_does_not_trace_never_imports_opentelemetry() -> None:
    assert run(
        """
        assert tracing.available()
        with tracing.running(job(None), tracing.SdkWatch()) or open("/dev/null"):
            pass
        tracing.failed(ValueError("x"))
        print(tracing._current_headers(), "opentelemetry.trace" in sys.modules)
        """
    ) == ["None", "False"]


def test_a_job_carrying_a_context_runs_under_it_in_a_process_that_does_not_trace() -> None:
    assert run(
        f"""
        headers = {{"traceparent": "00-{TRACE_ID}-00f067aa0ba902b7-01"}}
        with tracing.running(job({{"otel": headers}}), tracing.SdkWatch()):
            from opentelemetry import trace

            print(format(trace.get_current_span().get_span_context().trace_id, "032x"))
        """
    ) == [TRACE_ID]


def test_an_application_that_imports_opentelemetry_later_is_traced() -> None:
    assert run(
        """
        assert tracing._current_headers() is None
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
        with trace.get_tracer("app").start_as_current_span("request"):
            print(sorted(tracing._current_headers()))
        """
    ) == ["['traceparent']"]
