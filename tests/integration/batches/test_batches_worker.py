"""Batches run by the real worker: a handler adds jobs to its own batch
while it is open, the close comes before they end, and the success callback
runs once with the counts; a job that dies (max_attempts=1) makes the death
callback run instead."""

from __future__ import annotations

import asyncio
from typing import Any

from pgqueue import AsyncQueue, BatchState, Job, JobState, Settings
from pgqueue.worker import AsyncWorker
from tests.support import running


async def test_jobs_added_by_a_handler_count_and_the_success_callback_runs_once(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    added = asyncio.Event()
    release = asyncio.Event()
    called: list[Job] = []
    done = asyncio.Event()

    async def fan_out(job: Job) -> None:
        for n in range(3):
            await aqueue.enqueue("part", {"n": n}, batch=job.batch_id)
        added.set()

    async def part(job: Job) -> int:
        await release.wait()  # the batch is closed while its parts run
        return int(job.payload["n"])

    async def on_success(job: Job) -> None:
        called.append(job)
        done.set()

    batch = await aqueue.open_batch(on_success={"task": "on_success"}, metadata={"k": "v"})
    await aqueue.enqueue("fan_out", batch=batch.id)
    handlers: dict[str, Any] = {"fan_out": fan_out, "part": part, "on_success": on_success}
    async with running(AsyncWorker(handlers, settings=settings)):
        await asyncio.wait_for(added.wait(), 10)
        closed = await aqueue.close_batch(batch.id)
        assert (closed.state, closed.total) == (BatchState.CLOSED, 4)
        release.set()
        await asyncio.wait_for(done.wait(), 10)
    [callback] = called
    assert callback.metadata is not None
    assert callback.metadata["batch"] == {
        "id": str(batch.id),
        "callback": "on_success",
        "total": 4,
        "succeeded": 4,
        "dead": 0,
        "cancelled": 0,
        "metadata": {"k": "v"},
    }
    shown = await aqueue.get_batch(batch.id)
    assert shown.callback_jobs == {"on_success": callback.id}
    assert (await aqueue.get(callback.id)).state is JobState.SUCCEEDED


async def test_a_job_that_dies_runs_the_death_callback_not_the_success_one(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    ran: list[str] = []
    finished = asyncio.Event()

    async def work(job: Job) -> None:
        if job.payload["fail"]:
            raise RuntimeError("boom")

    async def callback(job: Job) -> None:
        assert job.metadata is not None
        ran.append(job.metadata["batch"]["callback"])
        if job.task == "on_finish":
            finished.set()

    batch = await aqueue.open_batch(
        on_success={"task": "on_success"},
        on_death={"task": "on_death"},
        on_finish={"task": "on_finish"},
    )
    for fail in (False, True, False):
        await aqueue.enqueue("work", {"fail": fail}, batch=batch.id, max_attempts=1)
    await aqueue.close_batch(batch.id)
    handlers = {"work": work, "on_success": callback, "on_death": callback, "on_finish": callback}
    async with running(AsyncWorker(handlers, settings=settings)):
        await asyncio.wait_for(finished.wait(), 10)
        shown = await aqueue.get_batch(batch.id)
        await aqueue.wait(shown.callback_jobs["on_death"], 10)
    assert sorted(ran) == ["on_death", "on_finish"]
    assert (shown.succeeded, shown.dead) == (2, 1)
    assert set(shown.callback_jobs) == {"on_death", "on_finish"}
