"""Checking that a handler is idempotent: ``assert_idempotent`` (for your
own tests, against a throwaway database; docs/howto/idempotent-handlers.md).

pgqueue runs a job at least once. ``assert_idempotent`` runs a handler once
on a fresh job (the single run), then, each time from the same starting
state (``reset()``), through each way a job runs more than once, and
compares the effects (``effects()``: a snapshot the caller reads, such as
the rows of its tables) with the single run's:

    duplicate delivery   the first attempt's lease is lost as it starts and
                         the job is claimed again: both attempts run at once;
                         each outcome is written, the first's refused
    crash after effects  the first attempt runs to the end and its worker
                         dies before the ack: the lease runs out, the reaper
                         puts the job back, a second attempt runs
    lost lease           the first attempt's worker stalls before its handler
                         runs; its lease is lost, a second attempt runs and is
                         acked; then the first runs to the end, and its late
                         result is refused

Each attempt is a claim of the job (with its own fencing token), run by the
worker's own runner and executor (worker/running.py: so job.transaction()
and job.progress() work as on a worker), its outcome written by the worker's
fenced ``job_finish``. A lease is lost as on a worker: cut short (a
heartbeat that sets it to a moment past), then reaped (``job_reap``), with no
backoff before the next claim.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from ..core.jobs import Job
from ..core.outcomes import Outcome
from ..core.settings import Settings
from ..db.handler_transactions import HandlerConnections
from ..queue import AsyncQueue, Queue
from ..worker.executor import Executor
from ..worker.handlers import Task, resolve_tasks
from ..worker.handles import Handles
from ..worker.held import Held, HeldJobs
from ..worker.isolation import HandlerProcesses
from ..worker.running import JobRunners
from ..worker.supervision import EventLog
from ..worker.threads import ThreadPool

__all__ = [
    "Attempt",
    "NotIdempotent",
    "Report",
    "Scenario",
    "assert_idempotent",
    "assert_idempotent_async",
]

# The queue the checked jobs run on (so that no other job is claimed), and
# the worker name their attempts carry.
QUEUE = "pgqueue-idempotency"
WORKER = "pgqueue-idempotency"

# The job a lost lease puts back is runnable again a microsecond later (the
# settings refuse a backoff of 0), so the next claim takes it.
NO_BACKOFF = 1e-6

# effects() and reset(): plain functions, or async ones.
Probe = Callable[[], Any | Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a scenario: its number, the handler's error (None: it
    returned) and what became of its outcome."""

    number: int
    error: str | None
    fate: str

    def describe(self) -> str:
        ended = "returned" if self.error is None else f"failed: {self.error.splitlines()[0]}"
        return f"attempt {self.number}: the handler {ended}; {self.fate}"


@dataclass(frozen=True, slots=True)
class Scenario:
    """One faulted run: its name, what it does, its attempts, the effects
    it left, and those of them that the single run did not leave (``added``)
    and the single run's that it did not (``missing``)."""

    name: str
    story: str
    attempts: tuple[Attempt, ...]
    effects: Any
    added: tuple[Any, ...]
    missing: tuple[Any, ...]

    @property
    def differs(self) -> bool:
        return bool(self.added or self.missing)

    def describe(self) -> str:
        verdict = "DIFFERS" if self.differs else "same effects"
        lines = [f"{self.name} ({self.story}): {verdict}"]
        lines += [f"    {attempt.describe()}" for attempt in self.attempts]
        if self.added:
            lines.append(f"    added:   {_listed(self.added)}")
        if self.missing:
            lines.append(f"    missing: {_listed(self.missing)}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Report:
    """What ``assert_idempotent`` found: the single run's effects and each
    scenario's."""

    task: str
    single_run: Any
    scenarios: tuple[Scenario, ...]

    @property
    def idempotent(self) -> bool:
        return not any(s.differs for s in self.scenarios)

    def describe(self) -> str:
        differ = [s for s in self.scenarios if s.differs]
        head = (
            f"task {self.task!r} is idempotent: the effects of every scenario are the single run's"
            if not differ
            else f"task {self.task!r} is not idempotent: the effects of {len(differ)} of "
            f"{len(self.scenarios)} scenarios differ from a single run's"
        )
        body = [f"  single run: {_listed(_rows(self.single_run))}"]
        body += ["  " + s.describe() for s in self.scenarios]
        return "\n".join([head, *body])


class NotIdempotent(AssertionError):
    """A scenario's effects differ from the single run's: ``report`` says how."""

    def __init__(self, report: Report) -> None:
        super().__init__(report.describe())
        self.report = report


def assert_idempotent(
    queue: Queue,
    handler: Callable[..., Any] | Task,
    payload: Any = None,
    /,
    *,
    effects: Probe,
    reset: Probe,
    task: str | None = None,
    **fields: Any,
) -> Report:
    """Run ``handler`` on a job of ``payload`` (and ``fields``, as for
    ``enqueue``) once, then through each scenario (module docstring), each
    run after ``reset()``; ``effects()`` is read after each. Returns the
    report if every scenario left the single run's effects, else raises
    ``NotIdempotent``. Not from inside a running event loop: use
    ``assert_idempotent_async`` there."""
    return asyncio.run(
        _check(queue.url, queue.settings, handler, payload, effects, reset, task, fields)
    )


async def assert_idempotent_async(
    queue: AsyncQueue,
    handler: Callable[..., Any] | Task,
    payload: Any = None,
    /,
    *,
    effects: Probe,
    reset: Probe,
    task: str | None = None,
    **fields: Any,
) -> Report:
    """As ``assert_idempotent``, for an ``AsyncQueue``."""
    return await _check(queue.url, queue.settings, handler, payload, effects, reset, task, fields)


async def _check(
    url: str,
    settings: Settings,
    handler: Callable[..., Any] | Task,
    payload: Any,
    effects: Probe,
    reset: Probe,
    task: str | None,
    fields: dict[str, Any],
) -> Report:
    if "queue" in fields:
        raise ValueError(f"assert_idempotent runs its jobs on its own queue, {QUEUE!r}")
    name = task or str(getattr(handler, "name", None) or getattr(handler, "__name__", "task"))
    quick = replace(settings, backoff_base_seconds=NO_BACKOFF, backoff_cap_seconds=NO_BACKOFF)
    async with AsyncQueue(url, settings=quick) as queue:
        rig = _Rig(queue, resolve_tasks({name: handler}), name, payload, fields)
        try:
            single_run = await _single_run(rig, effects, reset)
            scenarios = [
                await _scenario(rig, single_run, *played, effects, reset) for played in SCENARIOS
            ]
        finally:
            await rig.close()
    report = Report(name, single_run, tuple(scenarios))
    if not report.idempotent:
        raise NotIdempotent(report)
    return report


async def _single_run(rig: _Rig, effects: Probe, reset: Probe) -> Any:
    """The effects of one attempt that succeeded at once."""
    await _called(reset)
    single = await rig.run(1, await rig.enqueued())
    if single.error is not None:
        raise AssertionError(
            f"task {rig.task!r} failed in a single run, so there is nothing to compare its "
            f"faulted runs with: {single.error}"
        )
    return await _called(effects)


async def _scenario(
    rig: _Rig, single_run: Any, name: str, story: str, play: Play, effects: Probe, reset: Probe
) -> Scenario:
    await _called(reset)
    attempts = await play(rig, await rig.enqueued())
    faulted = await _called(effects)
    added, missing = _difference(single_run, faulted)
    return Scenario(name, story, attempts, faulted, added, missing)


class _Rig:
    """The parts of a worker that run a job, with two slots (two attempts
    of one job may run at once), and the writes of the attempts' ends; the
    job to check (``task``, ``payload``, ``fields``)."""

    def __init__(
        self,
        queue: AsyncQueue,
        tasks: dict[str, Task],
        task: str,
        payload: Any,
        fields: dict[str, Any],
    ) -> None:
        self.queue = queue
        self.task = task
        self.payload = payload
        self.fields = fields
        self.threads = ThreadPool(2, name=WORKER)
        self.processes = HandlerProcesses(tasks.values())
        self.connections = HandlerConnections(queue.url, keep=2)
        self.held = HeldJobs(2, handles=Handles(queue.settings, self.connections))
        events = EventLog(WORKER)
        executor = Executor(
            tasks,
            self.threads,
            self.processes,
            events,
            max_snoozes=queue.settings.max_snoozes,
            sealing=queue.settings.sealing,
        )
        self.runners = JobRunners(
            self.held,
            self.threads,
            executor,
            events,
            submit=self._submitted,
            completed=self._completed,
            # A runner's own error comes out of the awaited task (ended).
            crashed=lambda part, exc: None,
            name=WORKER,
            concurrency=2,
        )
        # How each attempt ended: its outcome, and whether its handler's
        # job.transaction() completed the job (nothing left to write).
        self._ends: dict[Held, tuple[Outcome | None, bool]] = {}

    async def enqueued(self) -> Job:
        """A new job to check, claimed: its first attempt."""
        await self.queue.enqueue(self.task, self.payload, queue=QUEUE, **self.fields)
        job = await self.claim()
        if job is None:
            raise ValueError("the job to check is not runnable now (a delay or run_at?)")
        return job

    async def claim(self) -> Job | None:
        claimed = await self.queue.claim(1, worker=WORKER, queues=[QUEUE])
        return claimed[0] if claimed else None

    async def lose_lease(self, job: Job) -> None:
        """The attempt's lease ends, and the reaper puts the job back."""
        await self.queue.heartbeat([job], lease_seconds=-1.0)
        await self.queue.reap()

    def start(self, job: Job) -> Held:
        self.runners.start([job])
        held = self.held.get(job.id)
        assert held is not None
        return held

    async def ended(self, held: Held) -> tuple[Outcome | None, bool]:
        assert held.task is not None
        await held.task
        return self._ends.pop(held)

    async def write(self, number: int, held: Held, end: tuple[Outcome | None, bool]) -> Attempt:
        """Write the attempt's outcome as the completer would; say what
        became of it."""
        outcome, completed = end
        if completed:
            fate = "its job.transaction() completed the job"
        else:
            assert outcome is not None
            states = await self.queue.finish([outcome])
            state = states.get(held.job.id)
            fate = (
                "its outcome refused (its lease was lost)"
                if state is None
                else f"its outcome written: the job {state.value}"
            )
        self.held.release(held.job.id, held)
        return Attempt(number, _error(outcome), fate)

    def crashed(self, number: int, held: Held, end: tuple[Outcome | None, bool]) -> Attempt:
        """The worker died after the handler returned: nothing written."""
        outcome, completed = end
        self.held.release(held.job.id, held)
        fate = (
            "its job.transaction() completed the job"
            if completed
            else "its outcome never written (the worker crashed)"
        )
        return Attempt(number, _error(outcome), fate)

    async def run(self, number: int, job: Job) -> Attempt:
        held = self.start(job)
        return await self.write(number, held, await self.ended(held))

    def _submitted(self, held: Held, outcome: Outcome) -> None:
        self._ends[held] = (outcome, False)

    def _completed(self, held: Held, outcome: Outcome | None) -> None:
        self._ends[held] = (outcome, True)

    async def close(self) -> None:
        self.threads.shutdown()
        self.processes.shutdown()
        await self.connections.close()


async def _duplicate(rig: _Rig, first: Job) -> tuple[Attempt, ...]:
    await rig.lose_lease(first)
    second = await rig.claim()
    running = [rig.start(job) for job in (first, second) if job is not None]
    ends = [await rig.ended(held) for held in running]
    pairs = enumerate(zip(running, ends, strict=True), 1)
    return tuple([await rig.write(number, held, end) for number, (held, end) in pairs])


async def _crash_after_effects(rig: _Rig, first: Job) -> tuple[Attempt, ...]:
    held = rig.start(first)
    attempts = [rig.crashed(1, held, await rig.ended(held))]
    await rig.lose_lease(first)
    if (second := await rig.claim()) is not None:
        attempts.append(await rig.run(2, second))
    return tuple(attempts)


async def _lost_lease(rig: _Rig, first: Job) -> tuple[Attempt, ...]:
    await rig.lose_lease(first)
    second = await rig.claim()
    earlier = () if second is None else (await rig.run(2, second),)
    return (*earlier, await rig.run(1, first))  # in the order they ran


Play = Callable[[_Rig, Job], Awaitable[tuple[Attempt, ...]]]

SCENARIOS: tuple[tuple[str, str, Play], ...] = (
    (
        "duplicate delivery",
        "the first attempt's lease lost as it starts: two attempts at once",
        _duplicate,
    ),
    (
        "crash after effects",
        "the worker dies after the handler, before the ack: the job runs again",
        _crash_after_effects,
    ),
    (
        "lost lease",
        "the first attempt stalls, a second runs and is acked, then the first finishes",
        _lost_lease,
    ),
)


async def _called(probe: Probe) -> Any:
    value = probe()
    return await value if inspect.isawaitable(value) else value


def _error(outcome: Outcome | None) -> str | None:
    return None if outcome is None or outcome.succeeded else outcome.error or "not a success"


def _rows(snapshot: Any) -> list[Any]:
    """A snapshot as the rows it compares by: a list, tuple or set is its
    items (compared as a multiset: order does not count), anything else
    one item."""
    return list(snapshot) if isinstance(snapshot, list | tuple | set | frozenset) else [snapshot]


def _difference(single: Any, faulted: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(rows only the faulted run left, rows only the single run left), as
    multisets, of rows that need not be hashable (dicts)."""
    mine, theirs = _rows(faulted), _rows(single)
    return tuple(_without(mine, theirs)), tuple(_without(theirs, mine))


def _without(rows: list[Any], others: list[Any]) -> list[Any]:
    rest = list(others)
    left = []
    for row in rows:
        if row in rest:
            rest.remove(row)
        else:
            left.append(row)
    return left


def _listed(rows: tuple[Any, ...] | list[Any]) -> str:
    return ", ".join(repr(row) for row in rows) or "(nothing)"
