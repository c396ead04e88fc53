"""The worker runtime: one asyncio loop running up to ``concurrency`` jobs.

Five loops share the worker's state, each with its own job:

    listener    LISTEN pgqueue_jobs on a dedicated connection; sets ``wake``
    claimer     claims up to the free slots in one statement whenever woken,
                again at once while batches come back full, else sleeps until
                woken, the poll interval, or the earliest known run_at
    finisher    writes outcomes in batches (one job_finish for many), when a
                batch fills or a few milliseconds after its first outcome
    heartbeater extends every held lease in one statement per interval;
                a lease found lost cancels the handler and drops its outcome
    maintainer  reaps expired leases and prunes old jobs in bounded batches

Statements go over three long-lived connections (claim, finish, and one for
heartbeats and maintenance) as prepared statements; nothing is checked out of
a pool per statement. A job is *held* from its claim until its outcome is
written (or its lease is found lost); a *slot* is busy only while its handler
runs, so the next claim overlaps the previous batch's ack.

Faults: every loop catches connection errors, backs off (capped, jittered)
and goes on. An outcome that could not be written stays in memory and is
retried; the token fences it, so a retry after a lost reply is harmless, and
if the lease expires meanwhile the job simply goes back to the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import psycopg
from psycopg.adapt import Dumper
from psycopg.rows import dict_row, tuple_row

from .. import transitions as t
from ..jobs import Job, JobState
from ..queue import resolve_url
from ..settings import Settings
from ..sql import QUERIES
from ..transitions import Flow, Outcome
from ._threads import ThreadPool
from .handlers import Task, TaskRegistry, resolve_tasks

__all__ = ["AsyncWorker", "Worker"]

log = logging.getLogger("pgqueue.worker")
T = TypeVar("T")

# Errors after which the same statement can succeed later: the database is
# unreachable or the session is gone, or the server refuses for now (a
# read-only standby after a failover, a serialization failure, a deadlock, a
# lock timeout). Back off, reconnect, and try again. Anything else from the
# driver is a bug or bad data.
RETRYABLE_ERRORS = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    OSError,
    psycopg.errors.ReadOnlySqlTransaction,
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
)
# Back-off after a connection error: base * 2^n, capped, jittered down to half.
BACKOFF_BASE_SECONDS = 0.05
BACKOFF_CAP_SECONDS = 5.0
# An outcome waits at most this long for others to share its statement.
ACK_DELAY_SECONDS = 0.002
# And a statement carries at most this many outcomes.
ACK_BATCH_MAX = 1000
# Keep-alives so that a silently dead peer is noticed in ~10 s, not hours.
CONNECT_KWARGS: dict[str, Any] = {
    "autocommit": True,
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "application_name": "pgqueue-worker",
}
# Longest error text kept in last_error (a traceback's tail).
MAX_ERROR_CHARS = 4000

Stage = Literal["running", "done", "writing"]


def backoff_delay(attempt: int) -> float:
    """Seconds to wait after ``attempt`` consecutive failures (0-based)."""
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2.0 ** min(attempt, 30))
    return ceiling * (0.5 + random.random() / 2)


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(slots=True)
class _Held:
    """A job this worker holds a lease on, from claim until its outcome is written."""

    job: Job
    task: asyncio.Task[None] | None = None
    stage: Stage = "running"
    lost: bool = False  # the lease is gone: drop whatever the handler returns
    interrupted: bool = False  # cancelled by shutdown: record a retryable failure


def _array_element(value: Any) -> str:
    if value is None:
        return "NULL"
    if value is True:
        return "t"
    if value is False:
        return "f"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


class _ArrayLiteralDumper(Dumper):
    """Lists as array literals of unknown type, for the statement's cast
    (every array parameter in queries.sql is cast: ``%(ids)s::bigint[]``).
    The worker's statements carry arrays of hundreds of ids, tokens and
    results; psycopg's generic list dumper adapts them one element at a
    time in Python, and was a tenth of the worker's time in a profile."""

    oid = 0

    def dump(self, obj: Any) -> bytes:
        return ("{" + ",".join(map(_array_element, obj)) + "}").encode()


class _Connection:
    """One long-lived connection; statements run one at a time, prepared."""

    def __init__(self, url: str, role: str) -> None:
        self.url = url
        self.role = role
        self._conn: psycopg.AsyncConnection[dict[str, Any]] | None = None
        self._cursor: psycopg.AsyncCursor[dict[str, Any]] | None = None
        self._lock = asyncio.Lock()

    async def run(self, flow: Flow[T]) -> T:
        async with self._lock:
            if self._cursor is None:
                await self._connect()
            cur = self._cursor
            assert cur is not None
            try:
                statement = next(flow)
                while True:
                    await cur.execute(QUERIES[statement.name], statement.params, prepare=True)
                    rows = await cur.fetchall() if cur.description else []
                    statement = flow.send(rows)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            except RETRYABLE_ERRORS:
                await self._drop()
                raise

    async def claim(self, flow: Flow[list[Job]]) -> list[Job]:
        """Run a claim flow's statement and build the jobs from plain tuples:
        a claim of hundreds of rows is the worker's hottest decoding path,
        and positional construction skips a dict per row."""
        statement = next(flow)
        flow.close()
        async with self._lock:
            if self._cursor is None:
                await self._connect()
            assert self._conn is not None
            try:
                async with self._conn.cursor(row_factory=tuple_row) as cur:
                    await cur.execute(QUERIES[statement.name], statement.params, prepare=True)
                    rows = await cur.fetchall()
                    names = [c.name for c in cur.description or ()]
            except RETRYABLE_ERRORS:
                await self._drop()
                raise
        return Job.from_tuples(names, rows) if rows else []

    async def _connect(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self.url, row_factory=dict_row, **CONNECT_KWARGS
        )
        conn.adapters.register_dumper(list, _ArrayLiteralDumper)
        self._conn, self._cursor = conn, conn.cursor()

    async def _drop(self) -> None:
        conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken; nothing to save
                await conn.close()

    async def close(self) -> None:
        async with self._lock:
            await self._drop()


class AsyncWorker:
    """Run handlers for claimed jobs until ``stop()``; see the module docstring.

    ``handlers``: a mapping of task name to callable, or a TaskRegistry.
    ``queues``: claim only from these queues (default: every queue).
    ``listen``: False skips LISTEN (e.g. behind a transaction-pooling proxy,
    where notifications do not arrive); the poll interval then sets latency.
    """

    def __init__(
        self,
        handlers: Mapping[str, Any] | TaskRegistry,
        *,
        settings: Settings | None = None,
        url: str | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        name: str | None = None,
        listen: bool = True,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.url = url or self.settings.database_url
        self.tasks: dict[str, Task] = resolve_tasks(handlers)
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency or self.settings.concurrency
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        self.name = name or default_worker_name()
        self.listen = listen
        self._queue_set = frozenset(self.queues or ())
        self._held: dict[int, _Held] = {}
        self._busy = 0  # handlers running
        self._outbox: list[Outcome] = []
        self._outbox_since = 0.0
        self._threads = ThreadPool(self.concurrency)
        self._stopping = False
        self._started = False
        self._finished: asyncio.Event | None = None
        self._last_claim_full = True  # start by looking for work
        self._next_check_at = 0.0  # when to ask again for the earliest run_at
        self._next_due: float | None = None  # monotonic time of the earliest run_at
        self.stats = {
            "claimed": 0,
            "succeeded": 0,
            "failed": 0,
            "lost": 0,
            "claims": 0,
            "finishes": 0,
        }

    # -- public ---------------------------------------------------------------

    async def run(self) -> None:
        """Work until ``stop()``/``request_stop()``; then drain and return."""
        if self._started:
            raise RuntimeError("a worker runs once; make a new one")
        self._started = True
        self._finished = asyncio.Event()
        self._wake = asyncio.Event()  # work may be ready (or we are stopping)
        self._slot_free = asyncio.Event()
        self._outbox_ready = asyncio.Event()
        self._outbox_full = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._released = asyncio.Event()  # a held job was let go
        if self._stopping:
            self._stop_requested.set()
        if not self.url:
            self.url = await asyncio.to_thread(resolve_url, self.settings)
        self._claim_conn = _Connection(self.url, "claim")
        self._finish_conn = _Connection(self.url, "finish")
        self._maint_conn = _Connection(self.url, "maintenance")
        self._log(
            logging.INFO,
            "start",
            "worker %s started (concurrency %d, queues %s)",
            self.name,
            self.concurrency,
            ",".join(self.queues or ["*"]),
        )
        loops = [
            asyncio.create_task(self._finisher(), name="pgqueue-finisher"),
            asyncio.create_task(self._heartbeater(), name="pgqueue-heartbeat"),
        ]
        claimers = [
            asyncio.create_task(self._claimer(), name="pgqueue-claimer"),
            asyncio.create_task(self._maintainer(), name="pgqueue-maintenance"),
        ]
        if self.listen:
            claimers.append(asyncio.create_task(self._listener(), name="pgqueue-listener"))
        try:
            await self._stop_requested.wait()
            self._log(
                logging.INFO,
                "shutdown",
                "worker %s stopping: %d jobs running",
                self.name,
                self._busy,
            )
            self._wake.set()
            await self._drain(claimers)
        finally:
            for task in [*claimers, *loops]:
                task.cancel()
            await asyncio.gather(*claimers, *loops, return_exceptions=True)
            for held in list(self._held.values()):
                if held.task is not None and not held.task.done():
                    held.task.cancel()
            for conn in (self._claim_conn, self._finish_conn, self._maint_conn):
                await conn.close()
            self._threads.shutdown()
            self._finished.set()
            self._log(logging.INFO, "stopped", "worker %s stopped", self.name)

    def request_stop(self) -> None:
        """Stop claiming and shut down gracefully (safe from a signal handler
        on the loop's thread)."""
        self._stopping = True
        if self._started:
            self._stop_requested.set()
            self._wake.set()

    async def stop(self) -> None:
        """Request a graceful stop and wait until ``run()`` has returned."""
        self.request_stop()
        if self._finished is not None:
            await self._finished.wait()

    @property
    def held_count(self) -> int:
        """Jobs claimed and not yet written back."""
        return len(self._held)

    @property
    def running_count(self) -> int:
        return self._busy

    # -- shutdown -------------------------------------------------------------

    async def _drain(self, claimers: list[asyncio.Task[None]]) -> None:
        """Stop claiming, let running handlers finish within the shutdown
        timeout, then write every outcome we can."""
        deadline = time.monotonic() + self.settings.shutdown_timeout_seconds
        # The claimer sees the stop flag between statements; a claim in flight
        # completes (its jobs run below) rather than being torn mid-reply.
        claimer = claimers[0]
        await asyncio.wait([claimer], timeout=max(0.0, deadline - time.monotonic()))
        for task in claimers:
            task.cancel()
        running = [h.task for h in self._held.values() if h.stage == "running" and h.task]
        if running:
            await asyncio.wait(running, timeout=max(0.0, deadline - time.monotonic()))
        late = [h for h in self._held.values() if h.stage == "running"]
        for held in late:
            held.interrupted = True
            if held.task is not None:
                held.task.cancel()
        if late:
            self._log(
                logging.WARNING,
                "shutdown",
                "%d handlers still running at the shutdown timeout: failing their "
                "attempts (they will be retried)",
                len(late),
            )
            await asyncio.wait([h.task for h in late if h.task], timeout=1.0)
        # Flush: outcomes are written as soon as possible now.
        self._outbox_full.set()
        self._outbox_ready.set()
        grace = max(deadline - time.monotonic(), 0.0) + 5.0
        end = time.monotonic() + grace
        while self._held and time.monotonic() < end:
            self._released.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), end - time.monotonic())
        if self._held:
            ids = sorted(self._held)
            self._log(
                logging.ERROR,
                "shutdown",
                "could not write %d outcomes before exiting; their jobs return to the "
                "queue when their leases expire: %s",
                len(ids),
                ids[:50],
            )

    # -- claiming ---------------------------------------------------------------

    def _free_slots(self) -> int:
        # Outcomes not yet written count against a second allowance, so that a
        # database outage cannot make us claim without bound.
        return max(0, min(self.concurrency - self._busy, 2 * self.concurrency - len(self._held)))

    async def _claimer(self) -> None:
        failures = 0
        while not self._stopping:
            free = self._free_slots()
            if free == 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            if not self._last_claim_full:
                await self._idle_wait()
                if self._stopping:
                    break
            self._wake.clear()
            try:
                jobs = await self._claim_conn.claim(
                    t.claim(self.settings, limit=free, worker=self.name, queues=self.queues)
                )
            except RETRYABLE_ERRORS as exc:
                failures += 1
                delay = backoff_delay(failures - 1)
                self._log(
                    logging.WARNING,
                    "db_error",
                    "claim failed (%s); retrying in %.2f s",
                    _short(exc),
                    delay,
                )
                self._last_claim_full = True
                await asyncio.sleep(delay)
                continue
            failures = 0
            self.stats["claims"] += 1
            self._last_claim_full = len(jobs) == free
            if jobs:
                self._start(jobs)
            if not self._last_claim_full:
                await self._refresh_next_due()

    async def _idle_wait(self) -> None:
        """Sleep until woken (NOTIFY, stop), the poll interval, or the earliest
        known run_at, whichever comes first."""
        now = time.monotonic()
        timeout = self.settings.poll_interval_seconds
        if self._next_due is not None:
            timeout = min(timeout, max(0.0, self._next_due - now))
        if not self._wake.is_set() and timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        if self._next_due is not None and time.monotonic() >= self._next_due:
            self._next_due = None
            self._next_check_at = 0.0  # ask again after this claim
        self._last_claim_full = True  # look once more

    async def _refresh_next_due(self) -> None:
        """At most once per poll interval, ask when the next delayed job is due."""
        now = time.monotonic()
        if now < self._next_check_at:
            return
        self._next_check_at = now + self.settings.poll_interval_seconds
        try:
            seconds = await self._claim_conn.run(t.next_run_in(self.queues))
        except RETRYABLE_ERRORS:
            return  # the next claim will meet the same error and back off
        if seconds is not None and seconds > 0:
            due = time.monotonic() + seconds
            self._next_due = due
            self._next_check_at = min(self._next_check_at, due)
        else:
            self._next_due = None

    def _start(self, jobs: list[Job]) -> None:
        self.stats["claimed"] += len(jobs)
        if log.isEnabledFor(logging.DEBUG):
            self._log(
                logging.DEBUG, "claim", "claimed %d jobs", len(jobs), job_ids=[j.id for j in jobs]
            )
        for job in jobs:
            held = _Held(job)
            self._held[job.id] = held
            self._busy += 1
            held.task = asyncio.create_task(self._execute(held))

    # -- running handlers ---------------------------------------------------------

    async def _execute(self, held: _Held) -> None:
        job = held.job
        outcome: Outcome | None = None
        try:
            outcome = await self._call(held)
        except asyncio.CancelledError:
            if held.interrupted:
                outcome = Outcome.failure(
                    job, "interrupted: the worker shut down before the handler finished"
                )
            elif not held.lost:
                raise
        finally:
            self._busy -= 1
            self._slot_free.set()
            self._settle(held, outcome)

    async def _call(self, held: _Held) -> Outcome:
        job = held.job
        spec = self.tasks.get(job.task)
        if spec is None:
            known = ", ".join(sorted(self.tasks)) or "none"
            return Outcome.failure(
                job,
                f"unknown task {job.task!r}: worker {self.name} has no handler for it "
                f"(it handles: {known})",
            )
        timeout = job.timeout_seconds or spec.timeout_seconds
        try:
            if timeout is None:
                result = await self._invoke(spec, job)
            else:
                async with asyncio.timeout(timeout) as deadline:
                    result = await self._invoke(spec, job)
        except asyncio.CancelledError:
            raise
        except TimeoutError as exc:
            if timeout is not None and deadline.expired():
                self._log(
                    logging.WARNING,
                    "timeout",
                    "job %d timed out after %g s",
                    job.id,
                    timeout,
                    job=job,
                )
                kind = "cancelled" if spec.is_async else "abandoned (its thread runs on)"
                return Outcome.failure(job, f"timed out after {timeout:g} s; handler {kind}")
            return Outcome.failure(job, _describe(exc))
        except Exception as exc:
            return Outcome.failure(job, _describe(exc))
        return Outcome.success(job, result)

    async def _invoke(self, spec: Task, job: Job) -> Any:
        if spec.is_async:
            return await spec.fn(job)
        return await self._threads.submit(spec.fn, job)

    def _settle(self, held: _Held, outcome: Outcome | None) -> None:
        job = held.job
        if outcome is None:  # lease lost, or the worker is being torn down
            self._release(job.id)
            if held.lost:
                self.stats["lost"] += 1
                self._log(
                    logging.WARNING,
                    "discard",
                    "job %d: lease lost; the handler's result is discarded",
                    job.id,
                    job=job,
                )
            return
        if held.lost:
            self._release(job.id)
            self.stats["lost"] += 1
            self._log(
                logging.WARNING,
                "discard",
                "job %d: lease lost; the handler's late result is discarded",
                job.id,
                job=job,
            )
            return
        held.stage = "done"
        if not self._outbox:
            self._outbox_since = time.monotonic()
            self._outbox_ready.set()
        self._outbox.append(outcome)
        if len(self._outbox) >= self._ack_batch():
            self._outbox_full.set()

    def _release(self, job_id: int) -> _Held | None:
        held = self._held.pop(job_id, None)
        if held is not None:
            self._released.set()
            self._slot_free.set()  # the allowance of unwritten outcomes grew
        return held

    def _ack_batch(self) -> int:
        return min(self.concurrency, ACK_BATCH_MAX)

    # -- writing outcomes -------------------------------------------------------------

    async def _finisher(self) -> None:
        failures = 0
        while True:
            await self._outbox_ready.wait()
            if not self._outbox_full.is_set():
                delay = self._outbox_since + ACK_DELAY_SECONDS - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._outbox_full.wait(), delay)
            batch = self._outbox[:ACK_BATCH_MAX]
            del self._outbox[:ACK_BATCH_MAX]
            if not self._outbox:
                self._outbox_ready.clear()
            if not self._stopping or not self._outbox:
                self._outbox_full.clear()
            self._outbox_since = time.monotonic()
            batch = [o for o in batch if not self._is_lost(o.job_id)]
            if not batch:
                continue
            for o in batch:
                self._held[o.job_id].stage = "writing"
            try:
                states = await self._write(batch)
            except RETRYABLE_ERRORS as exc:
                failures += 1
                delay = backoff_delay(failures - 1)
                self._log(
                    logging.WARNING,
                    "db_error",
                    "writing %d outcomes failed (%s); retrying in %.2f s",
                    len(batch),
                    _short(exc),
                    delay,
                )
                # Back to the front of the queue, still held: the heartbeat
                # keeps their leases, and the token fences the retry.
                for o in batch:
                    held = self._held.get(o.job_id)
                    if held is not None:
                        held.stage = "done"
                self._outbox[:0] = batch
                self._outbox_ready.set()
                await asyncio.sleep(delay)
                continue
            failures = 0
            self._written(batch, states)

    def _is_lost(self, job_id: int) -> bool:
        held = self._held.get(job_id)
        return held is None or held.lost

    async def _write(self, batch: list[Outcome]) -> dict[int, JobState]:
        """One statement for the batch; if the batch holds an outcome the
        database refuses (not a connection problem), write them one by one so
        that one bad result cannot block the others."""
        try:
            self.stats["finishes"] += 1
            return await self._finish_conn.run(t.finish(self.settings, batch))
        except RETRYABLE_ERRORS:
            raise
        except (psycopg.Error, UnicodeError) as exc:
            self._log(
                logging.ERROR,
                "db_error",
                "writing a batch of outcomes was refused (%s); writing them one at a time",
                _short(exc),
            )
        states: dict[int, JobState] = {}
        for outcome in batch:
            try:
                states.update(await self._finish_conn.run(t.finish(self.settings, [outcome])))
                continue
            except RETRYABLE_ERRORS:
                raise
            except (psycopg.Error, UnicodeError) as exc:
                problem = _short(exc)
            if outcome.succeeded:  # the result is what the database refused
                job = self._held[outcome.job_id].job
                fallback = Outcome.failure(
                    job, f"handler returned a result PostgreSQL cannot store: {problem}"
                )
                try:
                    states.update(await self._finish_conn.run(t.finish(self.settings, [fallback])))
                    continue
                except RETRYABLE_ERRORS:
                    raise
                except (psycopg.Error, UnicodeError):
                    pass
            self._log(
                logging.ERROR,
                "db_error",
                "job %d: outcome refused (%s); the job returns to the queue when its lease expires",
                outcome.job_id,
                problem,
            )
        return states

    def _written(self, batch: list[Outcome], states: dict[int, JobState]) -> None:
        debug = log.isEnabledFor(logging.DEBUG)
        for outcome in batch:
            held = self._release(outcome.job_id)
            if held is None:
                continue
            job = held.job
            state = states.get(outcome.job_id)
            if state is None:
                self.stats["lost"] += 1
                self._log(
                    logging.WARNING,
                    "discard",
                    "job %d: lease lost before its outcome was written; the outcome is discarded",
                    job.id,
                    job=job,
                )
            elif outcome.succeeded and state is JobState.SUCCEEDED:
                self.stats["succeeded"] += 1
                if debug:
                    self._log(logging.DEBUG, "ack", "job %d succeeded", job.id, job=job)
            else:
                self.stats["failed"] += 1
                action = "retry" if state is JobState.QUEUED else "dead"
                self._log(
                    logging.WARNING if action == "dead" else logging.INFO,
                    action,
                    "job %d attempt %d failed (%s): %s",
                    job.id,
                    job.attempts,
                    action,
                    (outcome.error or "")[:500],
                    job=job,
                )

    # -- leases -------------------------------------------------------------------------

    async def _heartbeater(self) -> None:
        interval = self.settings.heartbeat_seconds
        failures = 0
        while True:
            await asyncio.sleep(
                interval if failures == 0 else min(interval, backoff_delay(failures - 1))
            )
            held = [
                (i, h.job.lease_token)
                for i, h in self._held.items()
                if not h.lost and h.stage != "writing" and h.job.lease_token is not None
            ]
            if not held:
                continue
            try:
                still = await self._maint_conn.run(t.heartbeat(held, self.settings.lease_seconds))
            except RETRYABLE_ERRORS as exc:
                failures += 1
                self._log(logging.WARNING, "db_error", "heartbeat failed (%s)", _short(exc))
                continue
            failures = 0
            self._log(logging.DEBUG, "heartbeat", "extended %d leases", len(still))
            for job_id, _ in held:
                if job_id not in still:
                    self._lose(job_id)

    def _lose(self, job_id: int) -> None:
        """The database no longer has our lease on this job (reaped, cancelled)."""
        held = self._held.get(job_id)
        # An outcome being written when the heartbeat ran may be why the row
        # stopped matching: the write's own reply decides that one.
        if held is None or held.lost or held.stage == "writing":
            return
        held.lost = True
        self._log(
            logging.WARNING,
            "lost",
            "job %d: lease lost (reaped or cancelled); dropping it",
            job_id,
            job=held.job,
        )
        if held.stage == "running":
            if held.task is not None:
                held.task.cancel()  # a sync handler's thread runs on; its result is dropped
        else:  # done, waiting in the outbox
            self._outbox[:] = [o for o in self._outbox if o.job_id != job_id]
            self._release(job_id)
            self.stats["lost"] += 1

    # -- wake-ups -------------------------------------------------------------------------

    async def _listener(self) -> None:
        failures = 0
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await psycopg.AsyncConnection.connect(self.url, **CONNECT_KWARGS)
                await conn.execute(QUERIES["listen_jobs"])
                if failures:
                    self._log(logging.INFO, "listen", "listening again after %d failures", failures)
                failures = 0
                # Notifications sent while we were not listening are lost: look.
                self._wake.set()
                async for note in conn.notifies():
                    if self.queues is None or note.payload in self._queue_set:
                        self._wake.set()
            except RETRYABLE_ERRORS as exc:
                failures += 1
                delay = backoff_delay(failures - 1)
                self._log(
                    logging.WARNING,
                    "db_error",
                    "listen connection lost (%s); reconnecting in %.2f s",
                    _short(exc),
                    delay,
                )
                await asyncio.sleep(delay)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()

    # -- maintenance ------------------------------------------------------------------------

    async def _maintainer(self) -> None:
        """Every worker reaps and prunes (both are idempotent and skip rows
        another worker has locked); intervals are jittered so that workers
        started together do not run them together."""
        s = self.settings
        now = time.monotonic()
        next_reap = now + random.uniform(0, s.reap_interval_seconds)
        next_prune = now + random.uniform(0, s.prune_interval_seconds)
        while True:
            await asyncio.sleep(max(0.0, min(next_reap, next_prune) - time.monotonic()))
            now = time.monotonic()
            try:
                if now >= next_reap:
                    next_reap = now + s.reap_interval_seconds * random.uniform(0.8, 1.2)
                    await self._reap()
                if now >= next_prune:
                    next_prune = now + s.prune_interval_seconds * random.uniform(0.8, 1.2)
                    await self._prune()
            except RETRYABLE_ERRORS as exc:
                self._log(logging.WARNING, "db_error", "maintenance failed (%s)", _short(exc))

    async def _reap(self) -> None:
        for _ in range(100):  # bounded batches; yield between them
            states = await self._maint_conn.run(t.reap(self.settings))
            for job_id, state in states.items():
                self._log(
                    logging.WARNING,
                    "reap",
                    "job %d: lease expired; now %s",
                    job_id,
                    state,
                    job_id=job_id,
                )
            if len(states) < self.settings.reap_batch:
                return
            await asyncio.sleep(0)

    async def _prune(self) -> None:
        total = 0
        for _ in range(100):
            pruned = await self._maint_conn.run(t.prune(self.settings))
            total += pruned
            if pruned < self.settings.prune_batch:
                break
            await asyncio.sleep(0)
        if total:
            self._log(logging.INFO, "prune", "pruned %d finished jobs", total)

    # -- logging ------------------------------------------------------------------------------

    def _log(
        self, level: int, action: str, msg: str, *args: Any, job: Job | None = None, **extra: Any
    ) -> None:
        if not log.isEnabledFor(level):
            return
        fields: dict[str, Any] = {"action": action, "worker_id": self.name}
        if job is not None:
            fields["job_id"] = job.id
            fields["queue"] = job.queue
            fields["task"] = job.task
            fields["attempt"] = job.attempts
        fields.update(extra)
        log.log(level, msg, *args, extra=fields)


def _describe(exc: BaseException) -> str:
    """The exception and the tail of its traceback, for last_error."""
    text = "".join(traceback.format_exception(exc)).strip()
    head = f"{type(exc).__name__}: {exc}"
    if len(text) > MAX_ERROR_CHARS:
        text = text[-MAX_ERROR_CHARS:]
    return f"{head}\n{text}" if text != head else head


def _short(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


class Worker:
    """The blocking face: ``Worker(handlers).run()`` works until SIGTERM or
    SIGINT, then shuts down gracefully; a second signal exits at once."""

    def __init__(
        self,
        handlers: Mapping[str, Any] | TaskRegistry,
        *,
        settings: Settings | None = None,
        url: str | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        name: str | None = None,
        listen: bool = True,
    ) -> None:
        self._args: dict[str, Any] = dict(
            handlers=handlers,
            settings=settings,
            url=url,
            queues=queues,
            concurrency=concurrency,
            name=name,
            listen=listen,
        )
        self.worker: AsyncWorker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0

    def run(self) -> int:
        """Run until signalled; return the exit code (0 after a clean stop)."""
        return asyncio.run(self._main())

    async def _main(self) -> int:
        worker = self.worker = AsyncWorker(**self._args)
        loop = self._loop = asyncio.get_running_loop()
        installed = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
        try:
            await worker.run()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
        return 0

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        assert self.worker is not None
        if self._signals == 1:
            log.info(
                "received %s: stopping (send it again to exit at once)",
                sig.name,
                extra={"action": "shutdown", "worker_id": self.worker.name},
            )
            self.worker.request_stop()
            return
        log.warning(
            "received %s again: exiting now; unwritten outcomes return to the "
            "queue when their leases expire",
            sig.name,
            extra={"action": "shutdown", "worker_id": self.worker.name},
        )
        logging.shutdown()
        os._exit(128 + sig)

    def request_stop(self) -> None:
        """Stop gracefully, as on SIGTERM; safe to call from any thread."""
        if self.worker is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.worker.request_stop)
