"""Group commit: the single enqueues of many concurrent callers in one
statement and one commit.

``POST /jobs`` (and an ``AsyncQueue(group_commit=True)``) hands each job to
the ``GroupCommitter`` of its queue's pool instead of writing it alone. The
jobs that arrive within ``group_commit_window_seconds`` of the oldest one
waiting (or as soon as ``group_commit_max_jobs`` wait) go out together:
enqueue_many's insert and one read of the rows (``enqueue.enqueue_group``)
in one transaction (a group of plain jobs: one statement that returns
them, which needs none), driven by the queue's ``Retrying`` (retrying.py):
retried across lost connections under one call key, as every producer's
call is. ``group_commit_groups`` groups are written at once (2; half the
pool at most); while they are, the next group gathers, so groups grow with
the commit latency. One at a time makes larger groups, but a group whose
insert waits for a key that another transaction holds (ON CONFLICT waits
for it to end) then holds up every other job.

Each caller is answered only after its group committed, with what
``enqueue`` alone would have answered: its job, or the job holding its key
(``duplicate``); two callers of one group with the same key get one job,
created for the first. A group the database refuses (one of its jobs broke
a rule that only the database checks) is written again one job at a time,
with the ids the group reserved (so that what an earlier attempt of it
committed is found, not doubled), and the bad job fails alone. An error
that no job caused (the database out of reach past the deadline) is every
caller's of the group. A group of one goes the way of a single enqueue.

Nobody waits forever: a group's callers hear its end however it ends (an
unexpected error is logged with its traceback and given to them), the task
that gathers groups is restarted after an unexpected error (its waiting
callers get the error), and ``close`` writes what is waiting before it
returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg

from ..core.enqueue import CallKey, enqueue, enqueue_group, one_statement
from ..core.errors import EnqueueOutcomeUnknown, PgQueueError
from ..core.flows import Flow
from ..core.job_spec import JobSpec
from ..core.jobs import Job
from ..core.settings import Settings
from .deadlines import backoff_delay
from .pools import AsyncPool, errors_translated
from .retrying import Retrying

__all__ = ["GroupCommitter", "GroupLost"]

T = TypeVar("T")

log = logging.getLogger("pgqueue.queue")


class GroupLost(PgQueueError, RuntimeError):
    """A group ended without answering a caller (a bug; the log has it)."""


@dataclass(slots=True)
class _Waiting:
    spec: JobSpec
    answer: asyncio.Future[Job]
    since: float  # the event loop's clock: a duration, stored nowhere

    def settle(self, job: Job | None = None, error: BaseException | None = None) -> None:
        if self.answer.done():  # its caller gave up (cancelled)
            return
        if error is not None:
            self.answer.set_exception(error)
        else:
            self.answer.set_result(job)  # type: ignore[arg-type]


@dataclass(slots=True)
class _Group:
    waiting: list[_Waiting]
    call: CallKey = field(default_factory=CallKey)

    def alone(self, index: int) -> CallKey:
        """The call key of one job of the group written alone: the id the
        group reserved for it and the group's key, so that a job an earlier
        attempt of the group committed is found by it, and known as its own.
        An attempt of the group began (it reserved the ids; enqueue_many
        counts none), so the job's first attempt alone looks for it."""
        call = self.call
        if call.ids is None:
            return CallKey()
        return CallKey([call.ids[index]], max(call.attempts, 1), call.unsure, call.key)

    def unknown(self, exc: EnqueueOutcomeUnknown, index: int) -> EnqueueOutcomeUnknown:
        """The group's unknown outcome as the one of its ``index``-th job
        (the id reserved for it), as that job's caller alone would hear it."""
        ids = [self.call.ids[index]] if self.call.ids else []
        return EnqueueOutcomeUnknown("enqueue", ids, exc.reason, self.call.key)


class GroupCommitter:
    """Gathers single enqueues into groups and writes each group on ``pool``
    through ``retrying`` (a queue's); see the module's docstring. It lives
    as long as the pool: close it before the pool."""

    def __init__(self, retrying: Retrying, pool: AsyncPool, url: str, settings: Settings) -> None:
        self._retrying = retrying
        self._pool = pool
        self._url = url
        self.window = settings.group_commit_window_seconds
        self.max_jobs = settings.group_commit_max_jobs
        # Half the pool at most, so that the API's other calls find connections.
        self.flushes = max(1, min(settings.group_commit_groups, settings.pool_max_size // 2))
        self._waiting: list[_Waiting] = []
        self._arrived = asyncio.Event()  # jobs are waiting
        self._slots = asyncio.Semaphore(self.flushes)
        self._gatherer: asyncio.Task[None] | None = None
        self._writing: set[asyncio.Task[None]] = set()

    async def enqueue(self, spec: JobSpec) -> Job:
        """The job, as ``enqueue`` returns it, once its group committed."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(spec, loop.create_future(), loop.time())
        self._waiting.append(waiting)
        self._arrived.set()
        if self._gatherer is None:  # at the first job, as the loop is known then; after close
            self._gatherer = asyncio.create_task(self._gather_loop(), name="pgqueue-group-commit")
        return await waiting.answer

    async def close(self) -> None:
        """Write every job waiting, and wait for the groups being written."""
        if self._gatherer is not None:
            self._gatherer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gatherer
            self._gatherer = None
        while self._waiting:
            await self._write_next()
        while self._writing:
            await asyncio.wait(set(self._writing))

    async def _gather_loop(self) -> None:
        """``_gather`` for good: an unexpected error is logged and given to
        the callers waiting, and gathering starts again after a back-off."""
        failures = 0
        while True:
            try:
                await self._gather()
            except Exception as exc:
                log.error(
                    "group commit: gathering failed; %d waiting caller(s) get the error",
                    len(self._waiting),
                    exc_info=exc,
                    extra={"action": "group_commit_failed"},
                )
                waiting, self._waiting = self._waiting, []
                self._arrived.clear()
                for each in waiting:
                    each.settle(error=exc)
                await asyncio.sleep(backoff_delay(failures))
                failures += 1

    async def _gather(self) -> None:
        """Wait for jobs; send a group when the oldest has waited the window
        or enough wait to fill one, and a slot to write it is free."""
        loop = asyncio.get_running_loop()
        while True:
            await self._arrived.wait()
            if len(self._waiting) < self.max_jobs:
                await asyncio.sleep(max(0.0, self._waiting[0].since + self.window - loop.time()))
            await self._write_next()

    async def _write_next(self) -> None:
        """Take the next group (once a slot is free) and write it in a task
        of its own, so that the next group gathers meanwhile."""
        await self._slots.acquire()
        group = _Group([each for each in self._waiting[: self.max_jobs] if not each.answer.done()])
        del self._waiting[: self.max_jobs]
        if not self._waiting:
            self._arrived.clear()
        task = asyncio.create_task(self._write_group(group), name="pgqueue-group-write")
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def _write_group(self, group: _Group) -> None:
        """Write a group; every caller of it is answered, however it ends."""
        try:
            await self._commit(group)
        except Exception as exc:
            if not isinstance(exc, PgQueueError | psycopg.Error):
                log.error(
                    "group commit: writing a group of %d failed",
                    len(group.waiting),
                    exc_info=exc,
                    extra={"action": "group_commit_failed"},
                )
            for each in group.waiting:
                each.settle(error=exc)
        finally:
            self._slots.release()
            lost = GroupLost("the group commit ended without an answer; see the log")
            for each in group.waiting:
                each.settle(error=lost)

    async def _commit(self, group: _Group) -> None:
        if len(group.waiting) <= 1:  # one job (or none: its caller gave up) goes alone
            return await self._alone(group, 0) if group.waiting else None
        specs = [each.spec for each in group.waiting]
        try:
            jobs = await self._write(
                lambda: enqueue_group(specs, group.call),
                transaction=not one_statement(specs),
                call=group.call,
            )
        except psycopg.Error:  # a job the database refused: each alone, so that it fails alone
            jobs = [None] * len(specs)
        except EnqueueOutcomeUnknown as exc:  # each caller hears of its own job
            for index, each in enumerate(group.waiting):
                each.settle(error=group.unknown(exc, index))
            return
        for each, job in zip(group.waiting, jobs, strict=True):
            if job is not None:
                each.settle(job)
        for index in [i for i, job in enumerate(jobs) if job is None]:
            await self._alone(group, index)

    async def _alone(self, group: _Group, index: int) -> None:
        each, call = group.waiting[index], group.alone(index)
        try:
            job = await self._write(lambda: enqueue(each.spec, call), transaction=False, call=call)
        except Exception as exc:  # this caller's own error, as enqueue alone would raise it
            each.settle(error=exc)
        else:
            each.settle(job)

    async def _write(self, flow: Callable[[], Flow[T]], *, transaction: bool, call: CallKey) -> T:
        """A new ``flow()`` per attempt until one ends, retried across lost
        connections within the call's deadline, under ``call``'s key."""
        with errors_translated():
            return await self._retrying.drive_async(
                self._pool, self._url, flow, "enqueue", transaction, call
            )
