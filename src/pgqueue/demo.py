"""Demo handlers: what ``pgqueue up`` runs unless told otherwise.

They are part of the package, so that ``pgqueue up`` works from any folder.
Run them with ``pgqueue worker --handlers pgqueue.demo:HANDLERS``. Each
handler takes the claimed job and returns a JSON-able result.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .core.jobs import Job


async def echo(job: Job) -> dict[str, Any]:
    """Return the payload as the result."""
    return job.payload


async def sleep(job: Job) -> dict[str, float]:
    """Sleep ``payload["seconds"]`` (default 1) without blocking the loop."""
    seconds = float(job.payload.get("seconds", 1.0))
    await asyncio.sleep(seconds)
    return {"slept": seconds}


def sleep_sync(job: Job) -> dict[str, float]:
    """The same in a thread: a sync handler."""
    seconds = float(job.payload.get("seconds", 1.0))
    time.sleep(seconds)
    return {"slept": seconds}


def add(job: Job) -> float:
    """Sum ``payload["numbers"]`` (a sync handler)."""
    return float(sum(job.payload.get("numbers", [])))


def fail(job: Job) -> None:
    """Always raise: the attempt fails and is retried until max_attempts."""
    raise RuntimeError(job.payload.get("message", "this task always fails"))


async def noop(job: Job) -> None:
    """Do nothing (for benchmarks)."""


def noop_sync(job: Job) -> None:
    """Do nothing, in a thread (for benchmarks)."""


HANDLERS = {
    "echo": echo,
    "sleep": sleep,
    "sleep_sync": sleep_sync,
    "add": add,
    "fail": fail,
    "noop": noop,
    "noop_sync": noop_sync,
}
