"""What a call that is not retried says when it fails (db/attempts.py):
"nothing was written" only when that is true."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import psycopg
import pytest

from pgqueue.core.enqueue import CallKey
from pgqueue.core.errors import DatabaseUnavailable, JobNotFound, OutcomeUnknown
from pgqueue.core.flows import Statement
from pgqueue.db.attempts import Attempt
from pgqueue.db.deadlines import Cutoff


class Conn:
    """What ``Attempt.failed`` reads of a connection."""

    broken = False


def two_batches() -> Generator[Statement, list[Any], int]:
    """A bulk action's shape: one writing statement per batch, each
    committing by itself."""
    yield Statement("job_bulk_cancel", {})
    yield Statement("job_bulk_cancel", {})
    return 2


def attempt(cancelled: bool = False) -> tuple[Attempt, Generator[Statement, list[Any], Any]]:
    cutoff = Cutoff(Conn())  # type: ignore[arg-type]
    cutoff.cancelled = cancelled
    one = Attempt("bulk", CallKey(), False, cutoff, per_statement=True)
    return one, one.bounded(two_batches())


def fails_at_second_batch(one: Attempt, flow: Any, exc: Exception) -> Exception:
    next(flow)  # the first batch goes out
    flow.send([{"affected": 1000}])  # ...and commits; the second goes out
    one.failed(exc, Conn())  # type: ignore[arg-type]
    return one.verdict(exc, 30.0)


def test_a_call_cut_before_any_write_committed_wrote_nothing() -> None:
    one, flow = attempt()
    next(flow)
    exc = psycopg.errors.QueryCanceled("canceling statement due to user request")
    one.cutoff.cancelled = True
    one.failed(exc, Conn())  # type: ignore[arg-type]
    verdict = one.verdict(exc, 30.0)
    assert type(verdict) is DatabaseUnavailable
    assert "nothing was written" in str(verdict)


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.errors.QueryCanceled("canceling statement due to user request"),
        psycopg.OperationalError("server closed the connection unexpectedly"),
    ],
    ids=["cut_at_the_deadline", "connection_lost"],
)
def test_a_call_that_fails_after_a_batch_committed_was_partly_made(exc: Exception) -> None:
    one, flow = attempt()
    verdict = fails_at_second_batch(one, flow, exc)
    assert isinstance(verdict, OutcomeUnknown)
    assert "nothing was written" not in str(verdict)


def test_a_statement_cut_after_an_earlier_batch_committed_says_it_was_partly_made() -> None:
    one, flow = attempt()
    exc = psycopg.errors.QueryCanceled("canceling statement due to user request")
    assert "partly made" in str(fails_at_second_batch(one, flow, exc))


def cancel_of_a_missing_job() -> Generator[Statement, list[Any], None]:
    """A write that changed nothing, then the flow's own error."""
    yield Statement("job_cancel", {})
    raise JobNotFound(7)


def test_a_flows_own_error_after_a_write_stays_what_it_is() -> None:
    cutoff = Cutoff(Conn())  # type: ignore[arg-type]
    one = Attempt("cancel", CallKey(), False, cutoff, per_statement=True)
    flow = one.bounded(cancel_of_a_missing_job())
    next(flow)
    with pytest.raises(JobNotFound) as raised:
        flow.send([])
    one.failed(raised.value, Conn())  # type: ignore[arg-type]
    assert one.verdict(raised.value, 30.0) is raised.value
