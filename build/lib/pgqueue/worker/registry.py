"""The jobs a worker holds, and its slots: the only state its parts share.

A job is *held* from its claim until its outcome is written, or until its
lease is found lost. A *slot* is busy while a handler runs, and also while a
sync handler's thread runs on past its timeout or its lost lease (Python
cannot stop a thread): the worker claims only what it can start now.

    producer ──hold()──> RUNNING ──executor──> DONE ──completer──> WRITING ──release()
                            └──── lose() (lease keeper): cancelled or dropped ────┘
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..jobs import Job

__all__ = ["Held", "HeldJobs", "Stage"]


class Stage(enum.Enum):
    RUNNING = "running"  # its handler runs
    DONE = "done"  # its outcome waits to be written
    WRITING = "writing"  # its outcome is being written


@dataclass(slots=True, eq=False)
class Held:
    """A job this worker holds a lease on."""

    job: Job
    task: asyncio.Task[None] | None = None
    stage: Stage = Stage.RUNNING
    lost: bool = False  # the lease is gone: drop whatever the handler returns
    interrupted: bool = False  # cancelled by shutdown: record a retryable failure


class HeldJobs:
    """Held jobs by id, slot accounting, and the events the parts wait on."""

    def __init__(self, concurrency: int, hung_threads: Callable[[], int] = lambda: 0) -> None:
        self.concurrency = concurrency
        self.running = 0  # handlers running
        self._hung_threads = hung_threads
        self._held: dict[int, Held] = {}
        self.slot_freed = asyncio.Event()  # for the producer
        self.released = asyncio.Event()  # for the shutdown's drain

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Held]:
        return iter(list(self._held.values()))

    def get(self, job_id: int) -> Held | None:
        return self._held.get(job_id)

    @property
    def hung(self) -> int:
        """Slots held by sync handlers' threads that run on after their job
        was given up (timeout, lost lease)."""
        return self._hung_threads()

    def free_slots(self) -> int:
        # Outcomes not yet written count against a second allowance, so that a
        # database outage cannot make the worker claim without bound.
        busy = self.running + self.hung
        return max(0, min(self.concurrency - busy, 2 * self.concurrency - len(self._held)))

    def hold(self, job: Job) -> Held:
        """Hold a claimed job. An older attempt of the same job may still be
        here (its snooze just committed, or its lease was lost and the job
        came back to this worker): the new attempt takes the id, and the
        parts still busy with the old one keep their own ``Held``."""
        held = self._held[job.id] = Held(job)
        self.running += 1
        return held

    def handler_finished(self, held: Held) -> None:
        self.running -= 1
        self.slot_freed.set()

    def release(self, job_id: int, entry: Held | None = None) -> Held | None:
        """The job is no longer ours: its outcome was written, or dropped.
        With ``entry``: only if that attempt still holds the id (a newer
        attempt of the job may hold it by now, see ``hold``)."""
        held = self._held.get(job_id)
        if held is None or (entry is not None and held is not entry):
            return None
        del self._held[job_id]
        self.released.set()
        self.slot_freed.set()  # the allowance of unwritten outcomes grew
        return held

    def leases(self) -> list[tuple[int, int]]:
        """(id, token) of every lease to extend: not lost, and not being
        written (the write's own reply decides those)."""
        return [
            (job_id, h.job.lease_token)
            for job_id, h in self._held.items()
            if not h.lost and h.stage is not Stage.WRITING and h.job.lease_token is not None
        ]

    def lose(self, job_id: int) -> Held | None:
        """Mark a lease as lost; return the job if this is news. A job whose
        outcome is being written is left to the write's reply."""
        held = self._held.get(job_id)
        if held is None or held.lost or held.stage is Stage.WRITING:
            return None
        held.lost = True
        return held

    def slot_hung_return(self) -> None:
        """A hung thread returned: its slot is free again."""
        self.slot_freed.set()
