"""Prompt cancel's parts without a database server: ``job.cancelled`` (False
unless the worker calls the attempt off), the cancel notice's payload, and
a worker that hears a notice over a scripted LISTEN stream (the real one:
tests/integration/worker/test_prompt_cancel.py)."""

from __future__ import annotations

import asyncio
import copy
import pickle
from collections.abc import AsyncIterator
from typing import Any

from pgqueue import Job
from pgqueue.core.jobs import call_off
from pgqueue.core.transitions import CancelNotice
from pgqueue.worker import AsyncWorker
from pgqueue.worker.held import HeldJobs
from tests.support import running, until
from tests.unit.memory import MemoryConnection, MemoryDatabase
from tests.unit.test_worker_parts import SETTINGS, claimed


def test_a_job_is_not_cancelled_unless_its_attempt_is_called_off() -> None:
    [job] = claimed(MemoryDatabase())
    assert job.cancelled is False
    call_off(job)
    assert job.cancelled is True
    assert pickle.loads(pickle.dumps(job)).cancelled is True  # an isolated handler's copy
    assert "called_off" not in job.to_dict() and "called_off" not in repr(job)


def test_a_called_off_job_still_equals_its_row() -> None:
    [job] = claimed(MemoryDatabase())
    twin = copy.copy(job)
    call_off(job)
    assert job == twin and not twin.cancelled


def test_a_notice_reads_its_pairs_and_leaves_out_what_is_not_a_pair() -> None:
    notice = CancelNotice.from_payload("12:7,9223372036854775807:1,x:2,3,4:,5:6")
    assert notice.leases == ((12, 7), (9223372036854775807, 1), (5, 6))


def test_only_the_attempt_with_the_token_is_called_off() -> None:
    held = HeldJobs(2)
    [job] = claimed(MemoryDatabase())
    assert job.lease_token is not None
    entry = held.hold(job)
    assert held.call_off(job.id, job.lease_token + 1) is None  # an older attempt's
    assert not entry.lost and not job.cancelled
    assert held.call_off(job.id, job.lease_token) is entry
    assert entry.lost and job.cancelled
    assert held.call_off(job.id, job.lease_token) is None  # no news


async def test_a_notice_heard_cancels_the_handler_and_nothing_is_written() -> None:
    db = MemoryDatabase()
    stopped = asyncio.Event()

    async def wait(job: Job) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise

    async def hints() -> AsyncIterator[str | CancelNotice | None]:
        yield None
        await until(lambda: any(row["state"] == "running" for row in db.jobs.values()))
        [row] = db.jobs.values()
        yield CancelNotice(((row["id"], row["lease_token"] + 1),))  # not this attempt's
        yield CancelNotice(((row["id"], row["lease_token"]),))
        await asyncio.Event().wait()

    job_id = db.add("wait")
    worker = AsyncWorker(
        {"wait": wait},
        settings=SETTINGS.replace(heartbeat_seconds=60, lease_seconds=300),
        connect=lambda url: MemoryConnection(db),
        hints=lambda url: hints(),
    )
    async with running(worker):
        await asyncio.wait_for(stopped.wait(), 5)
        await until(lambda: worker.held_count == 0)
        stats: dict[str, Any] = worker.stats
    # Nothing written: the cancel's own statement (not run here) ends the job.
    assert db.state(job_id) == "running"
    assert db.sent("job_finish") == []
    assert (stats["lost"], stats["failed"]) == (1, 0)
