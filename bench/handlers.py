"""The benchmarks' handlers: no-op and I/O-like jobs. A module of its own,
light to import, so that a spawned worker process imports what an
application's worker would (pgqueue and its tasks), not the benchmarks'
machinery."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgqueue import Job

__all__ = ["HANDLERS", "io_10ms", "noop", "noop_sync"]


async def noop(job: Job) -> None:
    """Do nothing: the benchmarks measure the queue, not a workload."""


def noop_sync(job: Job) -> None:
    """Do nothing, on the worker's thread pool."""


async def io_10ms(job: Job) -> None:
    """Wait 10 ms without holding the event loop: a job that is mostly I/O
    (a call to another service), where concurrency decides throughput."""
    await asyncio.sleep(0.01)


HANDLERS: dict[str, Callable[[Job], Any]] = {
    "noop": noop,
    "noop_sync": noop_sync,
    "io_10ms": io_10ms,
}
