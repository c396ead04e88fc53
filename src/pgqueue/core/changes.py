"""What changed in the queue, as the API's event stream (``GET /events``)
tells its clients: I/O-free.

One listening connection per API process (db/changes.py) hears pgqueue's
notifications and, once a second, reads a fingerprint of the small tables
that every transition counts in (``events_fingerprint``). Each becomes a
``Change``: the queues and jobs it names, or ``everything`` when it cannot
say which. Every client has a ``Mailbox`` that merges the changes it has not
sent yet into one: however many arrive while a client is slow, its mailbox
holds at most ``MAX_QUEUES`` names and ``MAX_JOBS`` ids, then collapses into
"refetch everything" (a resync). The client never blocks the listener, and
its memory never grows with the traffic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_JOBS",
    "MAX_QUEUES",
    "Change",
    "Fingerprint",
    "Mailbox",
    "Pending",
    "between",
    "from_notification",
]

# What a mailbox keeps before it collapses into a resync.
MAX_QUEUES = 100
MAX_JOBS = 200


@dataclasses.dataclass(frozen=True)
class Change:
    """Queues whose jobs changed, jobs that changed, the workers registry;
    ``everything``: something changed that names no queue (a refetch of
    whatever is shown)."""

    queues: frozenset[str] = frozenset()
    jobs: frozenset[int] = frozenset()
    workers: bool = False
    everything: bool = False

    def __bool__(self) -> bool:
        return bool(self.queues or self.jobs or self.workers or self.everything)


def _ids(payload: str, separator: str = ",") -> frozenset[int]:
    ids = set()
    for part in payload.split(separator):
        head = part.partition(":")[0].strip()  # "id:token" on pgqueue_cancelled
        if head.isdigit():
            ids.add(int(head))
    return frozenset(ids)


def from_notification(channel: str, payload: str) -> Change:
    """A notification of pgqueue's channels as a change: ``pgqueue_jobs``
    names a queue with jobs ready; ``pgqueue_finished``,
    ``pgqueue_progress`` and ``pgqueue_cancelled`` name jobs."""
    if channel == "pgqueue_jobs":
        return Change(queues=frozenset({payload})) if payload else Change(everything=True)
    if channel in ("pgqueue_finished", "pgqueue_progress", "pgqueue_cancelled"):
        ids = _ids(payload)
        return Change(jobs=ids) if ids else Change(everything=True)
    return Change(everything=True)


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """The ``events_fingerprint`` row: per queue, its outcomes and claims
    summed; the newest job id; the workers registered; the queue controls."""

    queues: Mapping[str, int]
    last_job: int | None
    workers: int
    controls: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Fingerprint:
        queues = {str(k): int(v) for k, v in dict(row["queues"] or {}).items()}
        last = row["last_job"]
        return cls(
            queues, None if last is None else int(last), int(row["workers"]), row["controls"]
        )


def between(before: Fingerprint, after: Fingerprint) -> Change:
    """What changed from one fingerprint to the next (an empty change: nothing)."""
    names = before.queues.keys() | after.queues.keys()
    queues = frozenset(q for q in names if before.queues.get(q) != after.queues.get(q))
    return Change(
        queues=queues,
        workers=before.workers != after.workers,
        # A new job names no queue here (the newest id only); new controls
        # may change any queue's row.
        everything=before.last_job != after.last_job or before.controls != after.controls,
    )


@dataclasses.dataclass(frozen=True)
class Pending:
    """What a client is told next: its changes merged, a resync (refetch
    everything: it fell behind, or notifications may have been missed), and
    the database's state when that changed."""

    change: Change
    resync: str | None  # why, when the client must refetch everything
    database: tuple[bool, str] | None  # (up, what went wrong)


class Mailbox:
    """One client's changes not sent yet, merged and bounded."""

    def __init__(self) -> None:
        self._queues: set[str] = set()
        self._jobs: set[int] = set()
        self._workers = False
        self._everything = False
        self._resync: str | None = None
        self._database: tuple[bool, str] | None = None
        self.collapsed = 0  # how many times it fell behind into a resync

    def __bool__(self) -> bool:
        return bool(
            self._queues
            or self._jobs
            or self._workers
            or self._everything
            or self._resync is not None
            or self._database is not None
        )

    @property
    def size(self) -> int:
        """Names and ids held: at most MAX_QUEUES + MAX_JOBS."""
        return len(self._queues) + len(self._jobs)

    def add(self, change: Change) -> None:
        if self._resync is not None:
            return  # a refetch of everything covers it
        self._queues |= change.queues
        self._jobs |= change.jobs
        self._workers |= change.workers
        self._everything |= change.everything
        if len(self._queues) > MAX_QUEUES or len(self._jobs) > MAX_JOBS:
            self.resync("behind")
            self.collapsed += 1

    def resync(self, reason: str) -> None:
        self._resync = reason
        self._queues.clear()
        self._jobs.clear()
        self._workers = self._everything = False

    def database(self, up: bool, problem: str = "") -> None:
        self._database = (up, problem)

    def take(self) -> Pending:
        """Everything held, emptying the mailbox."""
        pending = Pending(
            Change(frozenset(self._queues), frozenset(self._jobs), self._workers, self._everything),
            self._resync,
            self._database,
        )
        self._queues, self._jobs = set(), set()
        self._workers = self._everything = False
        self._resync, self._database = None, None
        return pending
