"""The batch flows without a database: a job joining a batch locks it first
(and nothing more is sent for a plain job), callbacks are checked, and a
retried enqueue whose batch was closed since its earlier attempt committed
the job returns that job."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from pgqueue import BatchClosed, InvalidJob, JobSpec
from pgqueue.core.batches import checked_callbacks
from pgqueue.core.enqueue import CallKey, enqueue
from pgqueue.core.flows import Flow, Statement
from tests.unit.memory import MemoryDatabase


def first(flow: Flow[Any]) -> Statement:
    statement = next(flow)
    assert isinstance(statement, Statement)
    return statement


def test_a_plain_job_sends_no_batch_statement() -> None:
    assert first(enqueue(JobSpec.build("t"), CallKey())).name == "job_reserve_ids"


def test_a_job_of_a_batch_locks_it_first() -> None:
    batch = uuid.uuid4()
    statement = first(enqueue(JobSpec.build("t", batch=str(batch)), CallKey()))
    assert (statement.name, statement.params) == ("batch_lock", {"ids": [batch]})


def test_a_retry_after_the_close_returns_the_job_its_earlier_attempt_committed() -> None:
    db = MemoryDatabase()
    batch = uuid.uuid4()
    call = CallKey(ids=[7], attempts=1)  # an earlier attempt reserved 7, and may have committed
    db.add("t", id=7, call_key=call.key, batch_id=batch)
    flow = enqueue(JobSpec.build("t", batch=batch), call)
    assert first(flow).name == "batch_lock"
    statement = flow.send([{"id": batch, "state": "closed"}])
    assert statement.name == "job_get"
    with pytest.raises(StopIteration) as done:
        flow.send(db.job_get(**statement.params))
    assert done.value.value.id == 7


def test_a_first_attempt_into_a_closed_batch_is_refused() -> None:
    batch = uuid.uuid4()
    flow = enqueue(JobSpec.build("t", batch=batch), CallKey())
    first(flow)
    with pytest.raises(BatchClosed) as closed:
        flow.send([{"id": batch, "state": "finished"}])
    assert (closed.value.field, closed.value.state) == ("batch", "finished")


def test_callbacks_are_checked_and_kept_as_the_columns_they_fill() -> None:
    checked = checked_callbacks({"on_finish": {"task": "t", "delay": 5}, "on_death": None}, 3)
    assert checked == {
        "on_finish": {
            "task": "t",
            "queue": "default",
            "payload": {},
            "priority": 0,
            "delay_seconds": 5.0,
            "max_attempts": 3,
            "timeout_seconds": None,
            "concurrency_key": None,
            "metadata": None,
        }
    }
    with pytest.raises(InvalidJob) as unknown:
        checked_callbacks({"on_done": {"task": "t"}}, 3)
    assert unknown.value.field == "on_done"
    with pytest.raises(InvalidJob) as run_at:
        checked_callbacks({"on_success": {"task": "t", "run_at": "2030-01-01T00:00:00Z"}}, 3)
    assert run_at.value.field == "on_success.run_at"
