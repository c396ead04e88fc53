"""The jobs a worker holds, and its slots: the only state its parts share.

A job is *held* from its claim until its outcome is written, or until its
lease is found lost. A *slot* is busy while a handler runs, and also while a
sync handler's thread runs on past its timeout or its lost lease (Python
cannot stop a thread).

Prefetch: a claim may take up to ``ahead`` jobs more than the free slots;
they wait (held, leased and heartbeated like any held job) in a buffer and
start, in claim order, as slots free up, so that slots do not stay empty
while the next claim is in flight. A large claim's jobs that have slots
may wait there too, for a runner (running.py, ``JobRunners.start``). The
producer sets ``ahead`` (at most ``prefetch``) to the jobs that start
during two claims' round trips: it grows when commits are slow or jobs
short, and stays near 0 for long jobs, whose claimed jobs would otherwise
wait here while another worker could run them.

    producer ─hold()─> RUNNING (a slot is free) or WAITING ─next_ready()─> RUNNING
        ─executor─> DONE ─completer─> WRITING ─release()
    job.transaction() (handles.py): RUNNING ─its COMMIT─> COMPLETING ─> COMPLETED
        ─the handler returns─> release() (nothing left to write)
    job.sleep(), job.wait_for_signal() (handles.py): RUNNING ─its statement─>
        SLEEPING ─> ASLEEP (the job queued until its wake time) ─the handler
        unwinds─> release() (nothing left to write); or back to RUNNING (the
        sleep had ended, the signal had come)
    call_off() (lease keeper: a lost lease, a cancel's notice): a prefetched
    job is never started; a running one is cancelled, or told (job.cancelled)
    and its result dropped; take_prefetched() (shutdown): given back.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..core.jobs import Job, Transaction, call_off

if TYPE_CHECKING:
    from .handles import Handles

__all__ = ["Held", "HeldJobs", "Stage"]


class Stage(enum.Enum):
    PREFETCHED = "prefetched"  # claimed ahead of a free slot: waits for one
    RUNNING = "running"  # its handler runs
    DONE = "done"  # its outcome waits to be written
    WRITING = "writing"  # its outcome is being written
    # Its handler's transaction (job.transaction()) is completing the job,
    # then has completed it: no lease to keep, nothing left to write.
    COMPLETING = "completing"
    COMPLETED = "completed"
    # Its handler's sleep or wait (job.sleep(), job.wait_for_signal()) may
    # be putting the job to sleep, then has: no lease to keep, nothing to write.
    SLEEPING = "sleeping"
    ASLEEP = "asleep"


@dataclass(slots=True, eq=False)
class Held:
    """A job this worker holds a lease on; also, while its handler runs,
    the job's ``attempt`` (core.jobs.AttemptHandle), through which the
    handler's job.transaction(), job.progress(), job.step(),
    job.checkpoint(), job.sleep() and job.wait_for_signal() reach the worker."""

    job: Job
    task: asyncio.Task[None] | None = None
    stage: Stage = Stage.RUNNING
    lost: bool = False  # the lease is gone: drop whatever the handler returns
    interrupted: bool = False  # cancelled by shutdown: record a retryable failure
    cancelled: bool = False  # the job was cancelled (a cancel's notice): nothing to record
    handles: Handles | None = None  # the worker's side of the handle
    # Durable steps (handles.py): the results the job's attempts stored, by
    # name, read at this attempt's first step (None before); the names of
    # the steps this attempt completed.
    steps: dict[str, Any] | None = None
    steps_done: set[str] | None = None
    # The sleeps and waits this attempt made, by kind ("sleep", or the
    # signal's name), which number them (core/sleeps.py).
    sleeps: dict[str, int] | None = None

    def transaction(self, result_json: str) -> Transaction:
        assert self.handles is not None
        return self.handles.transaction(self, result_json)

    def progress(self, fraction: float, info_json: str | None) -> None:
        assert self.handles is not None
        self.handles.reported[self.job.id] = (self, fraction, info_json)

    def step_found(self, name: str) -> tuple[bool, Any]:
        assert self.handles is not None
        return self.handles.step_found(self, name)

    async def step_found_async(self, name: str) -> tuple[bool, Any]:
        assert self.handles is not None
        return await self.handles.step_found_async(self, name)

    def store_step(self, name: str, result_json: str) -> None:
        assert self.handles is not None
        self.handles.store_step(self, name, result_json)

    async def store_step_async(self, name: str, result_json: str) -> None:
        assert self.handles is not None
        await self.handles.store_step_async(self, name, result_json)

    def store_checkpoint(self, value_json: str) -> None:
        assert self.handles is not None
        self.handles.store_checkpoint(self, value_json)

    async def store_checkpoint_async(self, value_json: str) -> None:
        assert self.handles is not None
        await self.handles.store_checkpoint_async(self, value_json)

    def sleep(self, seconds: float | None, until: datetime | None) -> None:
        assert self.handles is not None
        self.handles.sleep(self, seconds, until)

    async def sleep_async(self, seconds: float | None, until: datetime | None) -> None:
        assert self.handles is not None
        await self.handles.sleep_async(self, seconds, until)

    def wait_for_signal(self, name: str, timeout: float) -> Any:
        assert self.handles is not None
        return self.handles.wait_for_signal(self, name, timeout)

    async def wait_for_signal_async(
        self,
        name: str,
        timeout: float,  # noqa: ASYNC109
    ) -> Any:
        assert self.handles is not None
        return await self.handles.wait_for_signal_async(self, name, timeout)


# The stages whose lease a write decides: the heartbeat leaves them alone.
_WRITTEN = (Stage.WRITING, Stage.COMPLETING, Stage.COMPLETED, Stage.SLEEPING, Stage.ASLEEP)


class HeldJobs:
    """Held jobs by id, slot accounting, and the events the parts wait on."""

    def __init__(
        self,
        concurrency: int,
        hung_threads: Callable[[], int] = lambda: 0,
        *,
        prefetch: int = 0,
        handles: Handles | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.handles = handles  # given to each Held
        self.prefetch = prefetch  # the most jobs claimed ahead of the free slots
        self.ahead = 0  # how many to claim ahead now (the producer sets it)
        self.running = 0  # handlers running
        self.finished = 0  # handlers finished since the start (the producer's pace)
        self._hung_threads = hung_threads
        self._held: dict[int, Held] = {}
        self._prefetched: deque[Held] = deque()  # prefetched, in claim order
        self._first = 0  # how many at its front were held first (hold)
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

    @property
    def prefetched(self) -> int:
        """Prefetched jobs not started yet."""
        return len(self._prefetched)

    @property
    def beyond_slots(self) -> int:
        """Prefetched jobs that no free slot awaits: those claimed ahead."""
        free = self.concurrency - self.running - self.hung
        return max(0, len(self._prefetched) - max(0, free))

    def free_slots(self) -> int:
        """How many jobs the next claim may take: the free slots not already
        promised to prefetched jobs, plus ``ahead``."""
        busy = self.running + self.hung + len(self._prefetched)
        return max(0, min(self.concurrency + self.claim_ahead() - busy, self.allowance()))

    def claim_ahead(self) -> int:
        """How many jobs to claim ahead of the free slots now: ``ahead``,
        or none while hung threads hold slots (a worker with hung threads
        claims only what it can start now: nothing that would wait behind
        them while other workers are free)."""
        return 0 if self.hung else self.ahead

    def allowance(self) -> int:
        """How many more jobs this worker may hold at all: outcomes not yet
        written count against a second allowance as large as the slots and
        the buffer, so that a database outage cannot make it claim without
        bound."""
        return 2 * (self.concurrency + self.prefetch) - len(self._held)

    def next_ready(self) -> Held | None:
        """The next prefetched job, now RUNNING and counted, if a slot is free
        (a job whose lease was lost meanwhile comes out too, ``lost`` set:
        the caller drops it)."""
        if not self._prefetched or not self._slot_free():
            return None
        held = self._prefetched.popleft()
        if self._first:
            self._first -= 1
        if not held.lost:
            held.stage = Stage.RUNNING
            self.running += 1
        return held

    def take_prefetched(self) -> list[Held]:
        """Every prefetched job, out of the buffer: none of them will start."""
        prefetched = list(self._prefetched)
        self._prefetched.clear()
        self._first = 0
        return prefetched

    def hold(self, job: Job, *, first: bool = False, start: bool = True) -> Held:
        """Hold a claimed job: RUNNING (counted) at once if a slot is free,
        no job waits before it and ``start`` (the caller has a runner for
        it), else WAITING until ``next_ready`` starts it. With ``first`` (a
        quiet queue's job, claimed out of turn: the producer's quick claims)
        no job waits before it: it waits only for a slot, at the front of
        the buffer after the other jobs held first. An older attempt of the
        same job may still be here (its snooze just committed, or its lease
        was lost and the job came back to this worker): the new attempt
        takes the id, and the parts still busy with the old one keep their
        own ``Held``."""
        if (self._prefetched and not first) or not start or not self._slot_free():
            held = self._held[job.id] = Held(job, stage=Stage.PREFETCHED, handles=self.handles)
            if first:
                self._prefetched.insert(self._first, held)
                self._first += 1
            else:
                self._prefetched.append(held)
        else:
            held = self._held[job.id] = Held(job, handles=self.handles)
            self.running += 1
        return held

    def _slot_free(self) -> bool:
        return self.running + self.hung < self.concurrency

    def handler_finished(self, held: Held) -> None:
        self.running -= 1
        self.finished += 1
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
        written (the write's own reply decides those, or the handler's
        transaction's)."""
        return [
            (job_id, h.job.lease_token)
            for job_id, h in self._held.items()
            if not h.lost and h.stage not in _WRITTEN and h.job.lease_token is not None
        ]

    def lose(self, job_id: int, token: int) -> Held | None:
        """Mark the lease of the attempt with ``token`` as lost; return the
        job if this is news. A job whose outcome is being written is left to
        the write's reply. A newer attempt of the job holding the id (its
        snooze committed, and it was claimed again, while the heartbeat that
        found the old token gone was out) keeps its lease."""
        held = self._held.get(job_id)
        if held is None or held.lost or held.stage in _WRITTEN:
            return None
        if held.job.lease_token != token:
            return None
        held.lost = True
        return held

    def call_off(self, job_id: int, token: int) -> Held | None:
        """``lose`` the attempt with ``token`` and stop its handler: a
        running one's task is cancelled (which cancels an async handler,
        kills an isolated one's process and gives up on a sync one's
        thread), and ``job.cancelled`` becomes True for a sync handler to
        see. Returns the job if this is news."""
        held = self.lose(job_id, token)
        if held is None:
            return None
        call_off(held.job)
        if held.stage is Stage.RUNNING and held.task is not None:
            held.task.cancel()
        return held

    def slot_hung_return(self) -> None:
        """A hung thread returned: its slot is free again."""
        self.slot_freed.set()
