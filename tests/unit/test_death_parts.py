"""Fast death detection in the worker's parts, over the in-memory database:
the lease keeper names its session (or not, behind a pooler), maintenance
checks for dead workers at its own interval and reaps at once when it finds
one, and checks nothing when detection is off."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from pgqueue import Settings
from pgqueue.core import transitions as t
from pgqueue.core.workers import WorkerInfo, WorkerLoad
from pgqueue.db import driver
from pgqueue.worker.held import HeldJobs
from pgqueue.worker.leases import LeaseKeeper
from pgqueue.worker.maintenance import Maintenance
from pgqueue.worker.supervision import EventLog
from tests.support import until
from tests.unit.memory import MemoryConnection, MemoryDatabase

# Reaps and prunes an hour apart: what runs is the death check's doing.
SETTINGS = Settings(
    database_url="memory://",
    reap_interval_seconds=3600,
    prune_interval_seconds=3600,
    death_check_interval_seconds=0.01,
)
EVENTS = EventLog("unit")
LOAD = WorkerLoad(held=0, running=0, hung=0, claimed=0, claim_seconds_ago=None)


@contextlib.asynccontextmanager
async def looping(maintenance: Maintenance) -> AsyncIterator[None]:
    task = asyncio.create_task(maintenance.maintenance_loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _register(db: MemoryDatabase, name: str, settings: Settings) -> None:
    keeper = LeaseKeeper(
        MemoryConnection(db),
        HeldJobs(1),
        settings,
        EVENTS,
        WorkerInfo(name, "h", 1, "0", None, 1),
        lambda: LOAD,
    )
    await keeper.beat()


async def test_the_lease_keeper_names_its_session_unless_detection_is_off() -> None:
    db = MemoryDatabase()
    await _register(db, "direct", SETTINGS)
    await _register(db, "pooled", SETTINGS.replace(session_death_detection=False))
    assert [s.params["session"] for s in db.sent("worker_register")] == [True, False]
    await _register(db, "direct", SETTINGS)  # a heartbeat names it again
    assert [s.params["session"] for s in db.sent("worker_seen")] == [True, False, True]


async def test_a_dead_worker_found_by_the_death_check_is_reaped_at_once() -> None:
    db = MemoryDatabase()
    await _register(db, "gone", SETTINGS)
    db.add()
    [job] = driver.drive(t.claim(SETTINGS, limit=1, worker="gone"), db)
    maintenance = Maintenance(MemoryConnection(db), SETTINGS, EVENTS, "unit")
    async with looping(maintenance):
        await until(lambda: len(db.sent("worker_reap_dead")) >= 3)
        assert db.state(job.id) == "running"  # alive: checked, left alone
        db.workers["gone"]["session_ended"] = True
        await until(lambda: db.state(job.id) == "queued", 5)
    # Not the hourly reap: the one the death check ran.
    assert {s.params["worker"] for s in db.sent("worker_reap_dead")} == {"unit"}
    assert len(db.sent("job_reap")) == 1


async def test_with_detection_off_maintenance_checks_for_no_dead_worker() -> None:
    db = MemoryDatabase()
    off = SETTINGS.replace(session_death_detection=False, reap_interval_seconds=0.01)
    async with looping(Maintenance(MemoryConnection(db), off, EVENTS, "unit")):
        await until(lambda: len(db.sent("job_reap")) >= 5)
    assert db.sent("worker_reap_dead") == []
