"""Typed tasks (pgqueue/worker/typed.py) against a real PostgreSQL: the
function's parameters are the payload, checked at enqueue (and by mypy),
and the worker calls the function with them."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from mypy import api as mypy_api
from pydantic import BaseModel

from examples.typed_tasks import Receipt, resize, send_receipt
from examples.typed_tasks import tasks as example_tasks
from pgqueue import AsyncQueue, InvalidJob, Job, JobState, Queue, Settings
from pgqueue.worker import AsyncWorker, TaskRegistry, TypedTask, typed
from tests.support import running

ROOT = Path(__file__).resolve().parents[3]


class Order(BaseModel):
    id: int
    items: list[str]


@dataclass
class Point:
    x: float
    y: float


def _count(sql: psycopg.Connection[Any]) -> int:
    row = sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()
    assert row is not None
    return int(row[0])


async def test_the_worker_calls_the_function_with_the_arguments_it_was_enqueued_with(
    settings: Settings, queue: Queue, aqueue: AsyncQueue
) -> None:
    job = send_receipt.using(queue).enqueue(Receipt("ada@example.com", 1200), copy_to="me@x.org")
    assert job.task == "send_receipt" and job.queue == "email" and job.max_attempts == 3
    assert job.payload == {
        "receipt": {"email": "ada@example.com", "amount_cents": 1200},
        "copy_to": "me@x.org",
    }
    sized = await resize.using(aqueue).enqueue_async("a.png", 300)
    assert sized.priority == 5 and sized.payload == {"path": "a.png", "width": 300}
    async with running(AsyncWorker(example_tasks, settings=settings, queues=["email", "default"])):
        sent = await aqueue.wait(job.id, timeout=30)
        done = await aqueue.wait(sized.id, timeout=30)
    assert sent.result == {"sent_to": "ada@example.com", "copy_to": "me@x.org"}
    assert done.result == {"width": 300, "height": 300}


async def test_dataclass_and_pydantic_arguments_arrive_as_instances(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    registry = TaskRegistry()
    seen: list[Any] = []

    @registry.task
    async def ship(order: Order, to: Point) -> None:
        seen.extend([order, to])

    job = await ship.using(aqueue).enqueue_async(Order(id=7, items=["a"]), Point(1.5, 2))
    assert job.payload == {"order": {"id": 7, "items": ["a"]}, "to": {"x": 1.5, "y": 2}}
    async with running(AsyncWorker(registry, settings=settings)):
        assert (await aqueue.wait(job.id, timeout=30)).state is JobState.SUCCEEDED
    assert seen == [Order(id=7, items=["a"]), Point(1.5, 2)]


def test_arguments_that_do_not_fit_are_refused_and_nothing_is_written(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    bad_calls: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
        ((), {}, "missing a required argument: 'path'"),
        (("a.png", 300), {"depth": 3}, "unexpected keyword argument 'depth'"),
        (("a.png", "300"), {}, "argument 'width' must be int, got str"),
        (("a.png", True), {}, "argument 'width' must be int, got bool"),
        ((b"a.png", 300), {}, "argument 'path' must be str, got bytes"),
    ]
    for args, kwargs, problem in bad_calls:
        with pytest.raises(InvalidJob, match=problem) as refused:
            resize.using(queue).enqueue(*args, **kwargs)
        assert refused.value.field == "payload"
    assert _count(sql) == 0


@dataclass
class Customer:
    name: str
    age: int


async def test_a_value_that_does_not_make_its_dataclass_or_model_is_refused_at_enqueue(
    queue: Queue, aqueue: AsyncQueue, sql: psycopg.Connection[Any]
) -> None:
    """The docs promise InvalidJob for bad arguments: a value the worker
    could not rebuild into the annotated class was written, then failed at
    run time on every attempt."""
    registry = TaskRegistry()

    @registry.task
    def ship(order: Order, to: Point, customer: Customer | None = None) -> None: ...

    fine = (Order(id=1, items=[]), Point(0, 0))
    bad_calls: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
        ((Order(id=1, items=[]), Order(id=2, items=[])), {}, "'to' is not a valid Point"),
        (({"id": "seven", "items": []}, Point(0, 0)), {}, "'order' is not a valid Order"),
        (({"id": 1}, Point(0, 0)), {}, "'order' is not a valid Order.*items"),
        (("order 1", Point(0, 0)), {}, "'order' is not a valid Order: got str"),
        ((Order(id=1, items=[]), {"x": 1}), {}, "'to' is not a valid Point"),
        ((Order(id=1, items=[]), Point("a", 0)), {}, "Point: field 'x' must be float, got str"),
    ]
    for args, kwargs, problem in bad_calls:
        with pytest.raises(InvalidJob, match=problem) as refused:
            ship.using(queue).enqueue(*args, **kwargs)
        assert refused.value.field == "payload"
        with pytest.raises(InvalidJob, match=problem):
            await ship.using(aqueue).enqueue_async(*args, **kwargs)
    assert _count(sql) == 0
    # A dict with the right fields makes one, as at run time; so does an instance.
    job = ship.using(queue).enqueue({"id": 3, "items": ["a"]}, *fine[1:])
    assert job.payload["order"] == {"id": 3, "items": ["a"]}
    assert ship.using(queue).enqueue(*fine).payload["to"] == {"x": 0, "y": 0}
    assert _count(sql) == 2


def test_using_sets_fields_and_a_rolled_back_transaction_keeps_nothing(
    queue: Queue, db_url: str, sql: psycopg.Connection[Any]
) -> None:
    job = resize.using(queue, priority=9, delay_seconds=60).enqueue("b.png", 10)
    assert job.priority == 9 and (job.run_at - job.enqueued_at).total_seconds() == 60
    with psycopg.connect(db_url) as conn:
        resize.using(queue, connection=conn).enqueue("c.png", 10)
        conn.rollback()
    assert _count(sql) == 1


def test_a_typed_task_enqueued_by_its_name_runs_too(queue: Queue, settings: Settings) -> None:
    job = queue.enqueue("resize", {"path": "d.png", "width": 4}, queue="default")

    async def work() -> Job:
        async with (
            AsyncQueue(settings=settings) as aq,
            running(AsyncWorker(example_tasks, settings=settings)),
        ):
            return await aq.wait(job.id, timeout=30)

    assert asyncio.run(work()).result == {"width": 4, "height": 4}


def test_enqueue_without_a_queue_uses_one_made_from_the_settings(
    db_url: str, sql: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", db_url)
    defaults = typed._Defaults()
    monkeypatch.setattr(typed, "_DEFAULTS", defaults)
    try:
        job = resize.enqueue("e.png", width=8)
        assert sql.execute("SELECT task FROM pgqueue_jobs WHERE id = %s", (job.id,)).fetchone() == (
            "resize",
        )
    finally:
        defaults.queue().close()


def test_a_function_of_the_job_stays_a_plain_handler() -> None:
    registry = TaskRegistry()

    def annotated(job: Job) -> None: ...

    def bare(job):  # type: ignore[no-untyped-def]
        return None

    def two(path: str) -> None: ...

    assert registry.task(annotated) is annotated
    assert registry.task(bare) is bare
    assert isinstance(registry.task(two), TypedTask)
    with pytest.raises(ValueError, match="cannot be isolated"):
        registry.task(name="three", isolated=True)(two)


def test_mypy_flags_a_wrong_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MYPYPATH", str(ROOT))
    caller = tmp_path / "caller.py"
    caller.write_text(
        textwrap.dedent(
            """
            from examples.typed_tasks import resize

            resize.enqueue("a.png", 300)          # fine
            resize.enqueue("a.png", width="300")  # a str for an int
            resize.enqueue(path="a.png")          # width missing
            """
        )
    )
    # mypy raises the interpreter's recursion limit for good; later tests
    # (a JSON nested past the limit) must find it where it was.
    limit = sys.getrecursionlimit()
    try:
        out, _, code = mypy_api.run(["--strict", "--no-incremental", str(caller)])
    finally:
        sys.setrecursionlimit(limit)
    assert code == 1
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["5", "6"], out
    assert 'incompatible type "str"; expected "int"' in errors[0]
    assert 'Missing positional argument "width"' in errors[1]
