"""wait() for a result, and bad input: a clear error and nothing written."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgqueue import AsyncQueue, InvalidJob, JobState, Queue, WaitTimeout


def test_wait_returns_when_the_job_finishes(queue: Queue) -> None:
    job = queue.enqueue("t")

    def work() -> None:
        time.sleep(0.3)
        [claimed] = queue.claim(1, worker="w")
        queue.ack(claimed, {"answer": 42})

    threading.Thread(target=work).start()
    started = time.monotonic()
    done = queue.wait(job.id, timeout=10)
    assert done.state is JobState.SUCCEEDED and done.result == {"answer": 42}
    # woken by the notification, not by the 1 s backstop poll
    assert time.monotonic() - started < 0.95


def test_wait_times_out(queue: Queue) -> None:
    job = queue.enqueue("t")
    with pytest.raises(WaitTimeout, match=f"job {job.id} did not finish within 0.2 s"):
        queue.wait(job.id, timeout=0.2)


async def test_async_wait_sees_a_retry_through_to_dead(aqueue: AsyncQueue) -> None:
    job = await aqueue.enqueue("t", max_attempts=1)
    waiter = asyncio.create_task(aqueue.wait(job.id, timeout=10))
    await asyncio.sleep(0.1)
    [claimed] = await aqueue.claim(1, worker="w")
    await aqueue.fail(claimed, "broken")
    done = await waiter
    assert done.state is JobState.DEAD and done.last_error == "broken"


BAD_INPUTS: list[tuple[dict[str, Any], str]] = [
    ({"task": ""}, "task"),
    ({"task": "has space"}, "task"),
    ({"task": 5}, "task"),
    ({"task": "t", "queue": "bad/queue"}, "queue"),
    ({"task": "t", "queue": "x" * 64}, "queue"),
    ({"task": "t", "payload": [1, 2]}, "payload"),
    ({"task": "t", "payload": {"x": float("nan")}}, "payload"),
    ({"task": "t", "payload": {"x": float("inf")}}, "payload"),
    ({"task": "t", "payload": {"x": "a\x00b"}}, "payload"),
    ({"task": "t", "payload": {"x": {1, 2}}}, "payload"),
    ({"task": "t", "priority": 10**6}, "priority"),
    ({"task": "t", "priority": 1.5}, "priority"),
    ({"task": "t", "priority": True}, "priority"),
    ({"task": "t", "max_attempts": 0}, "max_attempts"),
    ({"task": "t", "max_attempts": -3}, "max_attempts"),
    ({"task": "t", "delay": -1}, "delay"),
    ({"task": "t", "delay": float("nan")}, "delay"),
    ({"task": "t", "delay": 10**12}, "delay"),
    ({"task": "t", "run_at": datetime(2030, 1, 1)}, "run_at"),
    ({"task": "t", "run_at": "2030-01-01"}, "run_at"),
    ({"task": "t", "run_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))}, "run_at"),
    ({"task": "t", "run_at": datetime(1969, 12, 31, tzinfo=UTC)}, "run_at"),
    ({"task": "t", "timeout": 0}, "timeout"),
    ({"task": "t", "idempotency_key": ""}, "idempotency_key"),
    ({"task": "t", "idempotency_key": "k\x00"}, "idempotency_key"),
]


@pytest.mark.parametrize(("fields", "field"), BAD_INPUTS)
def test_bad_input_names_the_field_and_writes_nothing(
    queue: Queue, sql: psycopg.Connection, fields: dict[str, Any], field: str
) -> None:
    args = dict(fields)
    task, payload = args.pop("task"), args.pop("payload", None)
    with pytest.raises(InvalidJob) as raised:
        queue.enqueue(task, payload, **args)
    assert raised.value.field == field and str(raised.value).startswith(field)
    with pytest.raises(InvalidJob) as in_batch:
        queue.enqueue_many([{"task": "ok"}, fields])
    assert in_batch.value.field == f"jobs[1].{field}"
    assert sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0] == 0


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payload=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    task=st.text(max_size=12),
    queue_name=st.text(max_size=8),
    priority=st.integers(-(2**20), 2**20),
)
def test_accepted_input_round_trips_and_rejected_input_writes_nothing(
    queue: Queue,
    sql: psycopg.Connection,
    payload: dict[str, Any],
    task: str,
    queue_name: str,
    priority: int,
) -> None:
    before = sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0]
    try:
        job = queue.enqueue(task, payload, queue=queue_name, priority=priority)
    except InvalidJob:
        assert sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0] == before
        return
    stored = queue.get(job.id)
    assert (stored.task, stored.queue, stored.priority) == (task, queue_name, priority)
    assert same_json(stored.payload, payload)


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values. jsonb keeps numbers as decimals, so a float
    written in exponent form (7.1e16) comes back as the integer it denotes;
    it must denote the same double."""
    if isinstance(a, float | int) and isinstance(b, float | int) and float in (type(a), type(b)):
        return not isinstance(a, bool) and not isinstance(b, bool) and float(a) == float(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
