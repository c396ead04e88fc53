"""The workers registry: which worker processes are alive, where, holding what.

Each worker registers when it starts (``register``), reports at every
heartbeat (``seen``) and leaves when it stops (``leave``). A killed worker
stops reporting: its row expires after ``EXPIRY_HEARTBEATS`` heartbeats (it
is then listed as not alive) and is pruned by maintenance
``Settings.worker_retention_seconds`` later. A worker that registers its
session (``session=True``: the heartbeat connection's PostgreSQL session)
is found dead sooner, as soon as that session ends (``reap_dead``, run by
every worker's maintenance). ``list_workers`` also flags a *stalled* worker:
alive, with free slots, and yet it has not claimed since a job of its queues
became runnable ``STALL_SECONDS`` ago.

I/O-free flows, like transitions.py: the worker runs them on its own
connection, the API and the CLI through a queue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .flows import Flow, Statement

__all__ = [
    "EXPIRY_HEARTBEATS",
    "STALL_SECONDS",
    "WorkerInfo",
    "WorkerLoad",
    "WorkerRow",
    "leave",
    "list_workers",
    "prune",
    "reap_dead",
    "register",
    "seen",
]

# A worker that missed this many heartbeats is not alive any more.
EXPIRY_HEARTBEATS = 3
# Runnable work older than this that a worker with free slots has not
# claimed since marks it as stalled.
STALL_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker says of itself when it starts."""

    name: str
    host: str
    pid: int
    version: str
    queues: Sequence[str] | None
    concurrency: int


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """What a worker holds at a heartbeat."""

    held: int
    running: int
    hung: int
    claimed: int
    claim_seconds_ago: float | None  # None: it has not claimed yet


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """A row of the registry, as listed."""

    name: str
    host: str
    pid: int
    version: str
    queues: list[str] | None
    concurrency: int
    started_at: datetime
    last_seen_at: datetime
    expires_at: datetime
    held: int
    running: int
    hung: int
    claimed: int
    last_claim_at: datetime | None
    alive: bool
    last_seen_seconds: float
    stalled: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO 8601 strings."""
        return {
            key: value.isoformat() if isinstance(value, datetime) else value
            for key, value in dataclasses.asdict(self).items()
        }


def register(info: WorkerInfo, heartbeat_seconds: float, *, session: bool) -> Flow[None]:
    """Write the worker's row; with ``session``, record the session this
    flow runs on as the one whose end means the worker died."""
    yield Statement(
        "worker_register",
        {
            "name": info.name,
            "host": info.host,
            "pid": info.pid,
            "version": info.version,
            "queues": list(info.queues) if info.queues else None,
            "concurrency": info.concurrency,
            "expires_in": heartbeat_seconds * EXPIRY_HEARTBEATS,
            "session": session,
        },
    )


def seen(name: str, load: WorkerLoad, heartbeat_seconds: float, *, session: bool) -> Flow[bool]:
    """Report a heartbeat (and the session, as ``register``); False when
    the row is gone (register again)."""
    rows = yield Statement(
        "worker_seen",
        {
            "name": name,
            "expires_in": heartbeat_seconds * EXPIRY_HEARTBEATS,
            "session": session,
            **dataclasses.asdict(load),
        },
    )
    return bool(rows)


def reap_dead(worker: str) -> Flow[dict[str, int]]:
    """Mark dead the workers (other than ``worker``) whose recorded session
    has ended and end the leases of their running jobs, for ``job_reap`` to
    take back; return how many jobs each held."""
    rows = yield Statement("worker_reap_dead", {"worker": worker})
    return {row["name"]: int(row["jobs"]) for row in rows}


def leave(name: str) -> Flow[None]:
    yield Statement("worker_leave", {"name": name})


def prune(retention_seconds: float) -> Flow[int]:
    """Delete the rows of workers gone longer than ``retention_seconds``."""
    rows = yield Statement("worker_prune", {"retention_seconds": retention_seconds})
    return int(rows[0]["pruned"])


def list_workers(stall_seconds: float = STALL_SECONDS) -> Flow[list[WorkerRow]]:
    rows = yield Statement("worker_list", {"stall_seconds": stall_seconds})
    return [WorkerRow(**row) for row in rows]
