"""The worker: its parts, wired together and supervised.

One job's path, by calls::

    Producer.claim_loop     claims jobs (producer.py) and hands them to
    JobRunners.start        which holds each (held.py) and starts it on
    JobRunners._runner      a task that runs it, then the jobs waiting for its slot
                            (running.py):
    JobRunners._run_job     -> Executor.execute (executor.py): the handler, an Outcome
                            -> Completer.submit (completer.py): written in a batch by
                               Completer.write_loop, fenced by the attempt's token
    Producer.lookout_loop           lists the queues, learns when a job is next due
                                    and which queues are limited (producer.py)
    LeaseKeeper.heartbeat_loop      extends the leases of held jobs (leases.py)
    ProgressWriter.write_loop       writes the handlers' progress reports (handles.py)
    Maintenance.maintenance_loop    finds dead workers, reaps expired leases, prunes old jobs
                                    (maintenance.py)
    Scheduler.schedule_loop         enqueues the ticks of schedules (scheduler.py)

Supervision: each part runs as a task of its own. A part waits out database
faults itself (logs, backs off, goes on). Anything else it raises is logged
here with its traceback and stops the worker gracefully; ``run()`` then
raises ``WorkerFailed`` and ``Worker.run()`` returns exit code 1, so that a
supervisor or an orchestrator restarts the process. A worker started before
the schema exists says so once and starts as soon as it is migrated.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any

from .. import __version__, tracing
from ..core import workers
from ..core.errors import WorkerFailed
from ..core.reads import schema_pending
from ..core.settings import Settings
from ..core.transitions import CancelNotice
from ..core.workers import WorkerInfo, WorkerLoad
from ..db.connections import listen_url, resolve_url
from ..db.driver import RETRYABLE_ERRORS
from ..db.handler_transactions import HandlerConnections
from ..db.worker_connection import Connection, FlowDriver, listen_for_hints
from .completer import Completer
from .executor import Executor
from .handlers import Task, TaskRegistry, resolve_schedules, resolve_tasks
from .handles import Handles, ProgressWriter
from .held import HeldJobs, Stage
from .isolation import HandlerProcesses
from .leases import LeaseKeeper
from .maintenance import Maintenance
from .producer import Producer
from .running import JobRunners
from .scheduler import Scheduler
from .supervision import Backoff, EventLog, backoff_delay
from .threads import ThreadPool

__all__ = ["AsyncWorker"]

log = logging.getLogger("pgqueue.worker")

Hints = Callable[[str], AsyncIterator[str | CancelNotice | None]]

# The worker's connections besides LISTEN (see run()); docs/worker.md counts them.
CONNECTIONS = 4


# The stages in which a held job's handler may still run.
_HANDLER_RUNS = (Stage.RUNNING, Stage.COMPLETING, Stage.COMPLETED, Stage.SLEEPING, Stage.ASLEEP)


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class AsyncWorker:
    """Run handlers for claimed jobs until ``stop()``; see the module docstring.

    ``handlers``: a mapping of task name to callable, or a TaskRegistry
    (whose schedules the worker writes to the database when it starts).
    ``queues``: claim only from these queues (default: every queue).
    ``listen``: False skips LISTEN; the poll interval then sets latency.
    Behind a transaction-mode pooler (``Settings.transaction_pooler``) the
    worker prepares no statement and listens over ``Settings.direct_url``,
    or not at all without one.
    ``connect`` and ``hints`` replace the database connections and the
    LISTEN stream (the unit tests give scripted ones).
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
        connect: Callable[[str], FlowDriver] | None = None,
        hints: Hints = listen_for_hints,
    ) -> None:
        self.settings = settings or Settings.load()
        self.url = url or self.settings.database_url
        self.tasks: dict[str, Task] = resolve_tasks(handlers)
        self.schedules = resolve_schedules(handlers)
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency or self.settings.concurrency
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        self.name = name or default_worker_name()
        self.listen = listen
        # A statement is cut off after half a lease (a COMMIT waiting for a
        # missing synchronous standby, a lock, a silent server); the upkeep
        # connection's commits do not wait for a standby at all, so that
        # heartbeats keep leases alive while claims and acks wait.
        prepare, bound = not self.settings.transaction_pooler, self.settings.lease_seconds / 2
        self._connect = connect or functools.partial(
            Connection, prepare=prepare, bound_seconds=bound
        )
        self._connect_upkeep = connect or functools.partial(
            Connection, prepare=prepare, bound_seconds=bound, commit_locally=True
        )
        self._hints = hints
        self.events = EventLog(self.name)
        self.threads = ThreadPool(
            self.concurrency, on_hung_return=lambda: self.runners.hung_returned()
        )
        # Handlers' own transactions (job.transaction()): made when first
        # used, at most `concurrency` kept idle of each kind (sync, async).
        self.handler_connections = HandlerConnections(
            self.url or "", keep=self.concurrency, prepare=prepare
        )
        self.handles = Handles(self.settings, self.handler_connections)
        self.held = HeldJobs(
            self.concurrency,
            hung_threads=lambda: self.threads.hung,
            prefetch=self.settings.prefetch,
            handles=self.handles,
        )
        s = self.settings
        self.processes = HandlerProcesses(self.tasks.values(), s.handler_processes)
        self.executor = Executor(
            self.tasks,
            self.threads,
            self.processes,
            self.events,
            max_snoozes=s.max_snoozes,
            retry_delay=functools.partial(
                backoff_delay, base=s.backoff_base_seconds, cap=s.backoff_cap_seconds
            ),
            traced=tracing.enabled(s),
            sealing=s.sealing,
        )
        self.runners = JobRunners(
            self.held,
            self.threads,
            self.executor,
            self.events,
            submit=lambda held, outcome: self.completer.submit(held, outcome),
            completed=lambda held, outcome: self.completer.completed(held, outcome),
            crashed=self._crashed,
            name=self.name,
            concurrency=self.concurrency,
        )
        self._parts: dict[str, asyncio.Task[None]] = {}
        self._failure: tuple[str, BaseException] | None = None
        self._stopping = False
        self._started = False
        self._finished: asyncio.Event | None = None

    # -- public -----------------------------------------------------------------

    async def run(self) -> None:
        """Work until ``stop()``/``request_stop()``; then drain and return.
        Raises WorkerFailed after a part failed (the worker drained first)."""
        if self._started:
            raise RuntimeError("a worker runs once; make a new one")
        self._started = True
        self._finished = asyncio.Event()
        self._stop_requested = asyncio.Event()
        # Each job runs in a copy of this: what the caller of run() set, and
        # nothing an earlier job set.
        self.runners.context = contextvars.copy_context()
        if self._stopping:
            self._stop_requested.set()
        if not self.url:
            self.url = await asyncio.to_thread(resolve_url, self.settings)
        self.handler_connections.url = self.url
        # Claims (two, so that a claim goes out while the other is in
        # flight: a fair queue's claims overlap), outcomes (one: batches grow
        # while it commits), and upkeep (heartbeats, maintenance, schedules,
        # the lookout).
        connections = [self._connect(self.url) for _ in range(CONNECTIONS - 1)]
        connections.append(self._connect_upkeep(self.url))
        self._build(*connections)
        self.processes.start()
        self.events(
            logging.INFO,
            "start",
            "worker %s started (concurrency %d, queues %s)",
            self.name,
            self.concurrency,
            ",".join(self.queues or ["*"]),
        )
        try:
            if await self._supervised("schema check", self._ready(connections)):
                self._start_parts()
                await self._stop_requested.wait()
                self.events(
                    logging.INFO,
                    "shutdown",
                    "worker %s stopping: %d jobs running",
                    self.name,
                    self.held.running,
                )
                await self._drain()
        finally:
            await self._teardown(connections)
        if self._failure is not None:
            part, cause = self._failure
            raise WorkerFailed(self.name, part, cause) from cause

    def request_stop(self) -> None:
        """Stop claiming and shut down gracefully (safe from a signal handler
        on the loop's thread)."""
        self._stopping = True
        if self._started:
            self._stop_requested.set()

    async def stop(self) -> None:
        """Request a graceful stop and wait until ``run()`` has returned."""
        self.request_stop()
        if self._finished is not None:
            await self._finished.wait()

    @property
    def held_count(self) -> int:
        """Jobs claimed and not yet written back."""
        return len(self.held)

    @property
    def running_count(self) -> int:
        return self.held.running

    @property
    def degraded(self) -> bool:
        """Some slots are held by sync handlers that run on past their job."""
        return self.threads.hung > 0

    @property
    def stats(self) -> dict[str, int]:
        """Counts since start: claimed, claims, succeeded, failed, snoozed,
        cancelled (by handlers), lost, finishes (statements), hung_handlers (now)."""
        counts = dict.fromkeys(("claimed", "claims", *Completer.COUNTS), 0)
        if self._started:
            counts.update(self.producer.stats)
            counts.update(self.completer.stats)
        counts["lost"] += self.runners.dropped
        counts["hung_handlers"] = self.threads.hung
        return counts

    # -- wiring and supervision ----------------------------------------------------

    def _build(self, *conns: FlowDriver) -> None:
        s, events = self.settings, self.events
        claims, claims2, outcomes, upkeep = conns
        info = WorkerInfo(
            self.name, socket.gethostname(), os.getpid(), __version__, self.queues, self.concurrency
        )
        self.lease_keeper = LeaseKeeper(upkeep, self.held, s, events, info, self._load)
        self.producer = Producer(
            claims,
            self.held,
            s,
            events,
            queues=self.queues,
            start=self.runners.start,
            start_first=functools.partial(self.runners.start, first=True),
            more=[claims2],
            lookout=upkeep,
            cancelled=self.lease_keeper.cancelled,
        )
        self.completer = Completer(outcomes, self.held, s, events, self.producer.jobs_ended)
        self.progress_writer = ProgressWriter(upkeep, self.handles, events)
        self.maintenance = Maintenance(upkeep, s, events, self.name)
        self.scheduler = Scheduler(upkeep, s, events, declared=self.schedules, tasks=self.tasks)

    def _load(self) -> WorkerLoad:
        """What this worker holds now, for the workers registry."""
        return WorkerLoad(
            held=len(self.held),
            running=self.held.running,
            hung=self.threads.hung,
            claimed=self.producer.stats["claimed"],
            claim_seconds_ago=self.producer.seconds_since_claim(),
        )

    def _start_parts(self) -> None:
        hints_url = listen_url(self.settings, self.url)
        parts: dict[str, Coroutine[Any, Any, None]] = {
            "outcomes": self.completer.write_loop(),
            "heartbeats": self.lease_keeper.heartbeat_loop(),
            "progress": self.progress_writer.write_loop(),
            "claims": self.producer.claim_loop(),
            "lookout": self.producer.lookout_loop(),
            "maintenance": self.maintenance.maintenance_loop(),
            "schedules": self.scheduler.schedule_loop(),
        }
        if self.listen and hints_url is not None:
            parts["wake-ups"] = self.producer.listen_loop(lambda: self._hints(hints_url))
        for name, coro in parts.items():
            task = asyncio.create_task(coro, name=f"pgqueue-{name}")
            task.add_done_callback(functools.partial(self._part_ended, name))
            self._parts[name] = task

    def _part_ended(self, name: str, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            if self._stopping:  # the claim loop returns when told to stop
                return
            exc = RuntimeError(f"the {name} loop returned")
        self._crashed(name, exc)

    def _crashed(self, part: str, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = (part, exc)
        self.events.crashed(part, exc)
        self.request_stop()

    async def _supervised(self, part: str, step: Coroutine[Any, Any, bool]) -> bool:
        """Run a step of the start; an unexpected error in it is a failure of
        the worker like any part's (False: do not go on)."""
        try:
            return await step
        except Exception as exc:
            self._failure = (part, exc)
            self.events.crashed(part, exc)
            return False

    async def _ready(self, connections: list[FlowDriver]) -> bool:
        """The schema checked on the upkeep connection (the last) while the
        others connect: a worker started under a backlog claims one
        connection's set-up sooner than if it checked first. False if told
        to stop while the schema was not migrated."""
        ready, _ = await asyncio.gather(
            self._schema_ready(connections[-1]), self._open(connections[:-1])
        )
        return ready

    async def _open(self, connections: list[FlowDriver]) -> None:
        """Connect them all now, together: otherwise a worker started under a
        backlog makes its second claim and its first acks wait for a new
        connection each. One that cannot connect now will at its first use,
        as after any fault (its part logs it and backs off)."""

        async def open_one(conn: FlowDriver) -> None:
            with contextlib.suppress(*RETRYABLE_ERRORS):
                await conn.open()

        await asyncio.gather(*(open_one(conn) for conn in connections))

    async def _schema_ready(self, conn: FlowDriver) -> bool:
        """Wait until the schema is migrated (saying so once); False if told
        to stop meanwhile."""
        backoff = Backoff(self.events, "schema check")
        waiting = False
        while not self._stopping:
            try:
                pending = await conn.drive(schema_pending())
            except RETRYABLE_ERRORS as exc:
                await self._sleep(backoff.note(exc))
                continue
            if not pending:
                if waiting:
                    self.events(logging.INFO, "schema_ready", "schema migrated: starting work")
                return True
            if not waiting:
                waiting = True
                self.events(
                    logging.WARNING,
                    "schema_missing",
                    "schema not migrated (missing: %s): waiting; run `pgqueue migrate`",
                    ", ".join(pending),
                )
            await self._sleep(self.settings.poll_interval_seconds)
        return False

    async def _sleep(self, seconds: float) -> None:
        """Sleep, unless told to stop first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_requested.wait(), seconds)

    # -- shutdown ----------------------------------------------------------------------

    async def _drain(self) -> None:
        """Stop claiming, let running handlers finish within the shutdown
        timeout, then write every outcome we can."""
        deadline = time.monotonic() + self.settings.shutdown_timeout_seconds
        self.producer.stop()
        claims = self._parts.get("claims")
        if claims is not None:  # a claim in flight completes; its jobs run below
            await asyncio.wait([claims], timeout=max(0.0, deadline - time.monotonic()))
        for name in ("claims", "wake-ups"):
            if name in self._parts:
                self._parts[name].cancel()
        waiting = self.held.take_prefetched()
        await self.producer.give_back(waiting)
        for held in waiting:
            self.held.release(held.job.id, held)
        await self._finish_handlers(deadline)
        self.completer.flush()
        end = max(deadline, time.monotonic()) + 5.0
        outcomes = self._parts.get("outcomes")
        while len(self.held) and time.monotonic() < end:
            if outcomes is None or outcomes.done():
                break  # nobody is writing: the leases will expire
            self.held.released.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.held.released.wait(), end - time.monotonic())
        if len(self.held):
            ids = sorted(h.job.id for h in self.held)
            self.events(
                logging.ERROR,
                "shutdown",
                "could not write %d outcomes before exiting; their jobs return to the "
                "queue when their leases expire: %s",
                len(ids),
                ids[:50],
            )

    async def _finish_handlers(self, deadline: float) -> None:
        """Wait for running handlers until the deadline; fail the attempts of
        those still running then (they are retried)."""
        running = [h.task for h in self.held if h.stage in _HANDLER_RUNS and h.task]
        if running:
            await asyncio.wait(running, timeout=max(0.0, deadline - time.monotonic()))
        late = [h for h in self.held if h.stage is Stage.RUNNING]
        for held in late:
            held.interrupted = True
            if held.task is not None:
                held.task.cancel()
        if late:
            self.events(
                logging.WARNING,
                "shutdown",
                "%d handlers still running at the shutdown timeout: failing their "
                "attempts (they will be retried)",
                len(late),
            )
            await asyncio.wait([h.task for h in late if h.task], timeout=1.0)

    async def _teardown(self, connections: list[FlowDriver]) -> None:
        parts = list(self._parts.values())
        for task in parts:
            task.cancel()
        await asyncio.gather(*parts, return_exceptions=True)
        for held in self.held:
            if held.task is not None and not held.task.done():
                held.task.cancel()
        with contextlib.suppress(Exception):  # else its row expires, as a killed worker's
            await asyncio.wait_for(connections[-1].drive(workers.leave(self.name)), 2.0)
        for conn in connections:
            await conn.close()
        with contextlib.suppress(Exception):  # closing what is idle; nothing to save
            await self.handler_connections.close()
        self.threads.shutdown()
        self.processes.shutdown()
        assert self._finished is not None
        self._finished.set()
        self.events(logging.INFO, "stopped", "worker %s stopped", self.name)
