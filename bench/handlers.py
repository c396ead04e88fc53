"""The benchmarks' handlers: no-op and I/O-like jobs. A module of its own,
light to import, so that a spawned worker process imports what an
application's worker would (pgqueue and its tasks), not the benchmarks'
machinery."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgqueue import Job

__all__ = [
    "HANDLERS",
    "STEPS",
    "io_10ms",
    "noop",
    "noop_sync",
    "progress_work_sync",
    "steps_async",
    "steps_sync",
    "steps_work_sync",
    "work_sync",
]

# The durable steps (job.step()) of a step job.
STEPS = 10


async def noop(job: Job) -> None:
    """Do nothing: the benchmarks measure the queue, not a workload."""


def noop_sync(job: Job) -> None:
    """Do nothing, on the worker's thread pool."""


async def io_10ms(job: Job) -> None:
    """Wait 10 ms without holding the event loop: a job that is mostly I/O
    (a call to another service), where concurrency decides throughput."""
    await asyncio.sleep(0.01)


def _nothing() -> None:
    return None


def steps_sync(job: Job) -> None:
    """STEPS no-op durable steps, on the worker's thread pool: what the
    steps themselves cost (a read of the stored steps, a fenced insert each)."""
    for i in range(STEPS):
        job.step(f"step{i}", _nothing)


async def steps_async(job: Job) -> None:
    """``steps_sync`` for an async handler."""
    for i in range(STEPS):
        await job.step_async(f"step{i}", _nothing)


def _work() -> None:
    time.sleep(0.01)


def work_sync(job: Job) -> None:
    """STEPS pieces of 10 ms of blocking work (a call to another service)."""
    for _ in range(STEPS):
        _work()


def steps_work_sync(job: Job) -> None:
    """``work_sync``, each piece a durable step."""
    for i in range(STEPS):
        job.step(f"step{i}", _work)


def progress_work_sync(job: Job) -> None:
    """``work_sync``, reporting its progress after each piece (ten reports
    in its 100 ms: more often than once a second)."""
    for i in range(STEPS):
        _work()
        job.progress((i + 1) / STEPS, {"piece": i})


HANDLERS: dict[str, Callable[[Job], Any]] = {
    "noop": noop,
    "noop_sync": noop_sync,
    "io_10ms": io_10ms,
    "steps_sync": steps_sync,
    "steps_async": steps_async,
    "work_sync": work_sync,
    "steps_work_sync": steps_work_sync,
    "progress_work_sync": progress_work_sync,
}
