"""Running one job's handler: one job in, one ``Outcome`` out.

The executor writes nothing and knows no other job. ``async def`` handlers
run on the worker's loop; plain functions on its thread pool, or in a child
process if the task is isolated (isolation.py). A sealed payload (an
encrypted task's, core/sealing.py) is opened first; one that no key opens
fails the attempt without running the handler. A handler that
raises, times out, or returns what PostgreSQL cannot store is a failed
attempt; a task name without a handler too. A handler that raises ``Snooze``
or ``CancelJob`` (pgqueue.control) gets what it asked for: a snooze (bounded
by the task's max_snoozes, else the setting's) or a cancel. An exception the
task declared ``retry_without_attempt`` is a snooze after a backoff (the
setting's, by the job's snoozes so far) within the same bound, and past it a
failed attempt like any other. A handler that ``job.sleep()`` or
``job.wait_for_signal()`` put to sleep unwinds by ``Asleep``: its job is
already queued again, and its outcome is not written (running.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from .. import tracing
from ..core.errors import PayloadNotOpened
from ..core.jobs import Job
from ..core.outcomes import CancelJob, Outcome, Snooze
from ..core.sealing import Sealing, is_sealed
from ..core.sleeps import Asleep
from .handlers import Task
from .isolation import HandlerProcesses, HandlerTimedOut
from .supervision import EventLog, backoff_delay, describe
from .threads import ThreadPool

__all__ = ["Executor"]

# Job is frozen: the executor puts an opened payload in place through the
# slot itself (the job is the worker's own copy of the row).
_set_payload = Job.__dict__["payload"].__set__


class Executor:
    def __init__(
        self,
        tasks: dict[str, Task],
        threads: ThreadPool,
        processes: HandlerProcesses,
        events: EventLog,
        *,
        max_snoozes: int,
        retry_delay: Callable[[int], float] = backoff_delay,
        traced: bool = False,
        sealing: Sealing | None = None,
    ) -> None:
        self.tasks = tasks
        self.threads = threads
        self.processes = processes
        self.events = events
        self.max_snoozes = max_snoozes  # for tasks that do not set their own
        # Seconds before a retry without an attempt, by the job's snoozes so far.
        self.retry_delay = retry_delay
        self.traced = traced  # a span per attempt (tracing.py)
        self.sealing = sealing or Sealing()
        self._sdk_installed = tracing.SdkWatch()

    def execute(self, job: Job) -> Coroutine[Any, Any, Outcome]:
        """Run the job's handler and say how the attempt ended. Cancelling
        the call cancels an async handler and kills an isolated one; a sync
        handler's thread runs on and its result is dropped. (A plain
        function: no coroutine of its own per job.)"""
        span = tracing.running(job, self._sdk_installed) if self.traced else None
        return self._execute(job) if span is None else self._traced(job, span)

    async def _traced(
        self, job: Job, span: contextlib.AbstractContextManager[Callable[[Outcome], None]]
    ) -> Outcome:
        with span as ended:
            outcome = await self._execute(job)
            ended(outcome)
        return outcome

    async def _execute(self, job: Job) -> Outcome:
        spec = self.tasks.get(job.task)
        if spec is None:
            known = ", ".join(sorted(self.tasks)) or "none"
            return Outcome.failure(
                job,
                f"unknown task {job.task!r}: worker {self.events.worker} has no handler for it "
                f"(it handles: {known})",
            )
        if is_sealed(job.payload):
            try:
                _set_payload(job, self.sealing.open(job.id, job.payload))
            except PayloadNotOpened as exc:
                return Outcome.failure(job, str(exc))
        timeout = job.timeout_seconds or spec.timeout_seconds
        try:
            if spec.isolated:
                result = await self.processes.run(spec, job, timeout)
            elif timeout is None:  # most jobs: no timer to set up and cancel
                result = await (spec.fn(job) if spec.is_async else self._invoke(spec, job))
            else:
                async with asyncio.timeout(timeout) as deadline:
                    result = await self._invoke(spec, job)
        except HandlerTimedOut:
            assert timeout is not None
            return self._timed_out(job, spec, timeout)
        except TimeoutError as exc:
            if timeout is not None and deadline.expired():
                return self._timed_out(job, spec, timeout)
            return self._failed(job, spec, exc)
        except Snooze as request:
            return Outcome.snooze(job, request.seconds, max_snoozes=self._snoozes(spec))
        except CancelJob as request:
            return Outcome.cancel(job, request.reason)
        except Asleep:
            # job.sleep() or job.wait_for_signal() put the job to sleep in
            # its own statement (its stage ASLEEP): the runner writes no
            # outcome for it. A snooze says what happened.
            return Outcome.snooze(job, 0.0)
        except Exception as exc:
            return self._failed(job, spec, exc)
        return Outcome.success(job, result)

    def _snoozes(self, spec: Task) -> int:
        return self.max_snoozes if spec.max_snoozes is None else spec.max_snoozes

    def _failed(self, job: Job, spec: Task, exc: Exception) -> Outcome:
        """A failed attempt; or, for an exception the task retries without
        an attempt, a snooze after a backoff while the job has snoozes left."""
        error = describe(exc)
        if self.traced:
            tracing.failed(exc)
        if not isinstance(exc, spec.retry_without_attempt):
            return Outcome.failure(job, error)
        bound = self._snoozes(spec)
        if job.snoozes >= bound:
            return Outcome.failure(
                job,
                f"counted as a failed attempt: {job.snoozes} snoozes already, the most "
                f"allowed (max_snoozes {bound}): {error}",
            )
        delay = self.retry_delay(job.snoozes)
        self.events(
            logging.INFO,
            "retry_without_attempt",
            "job %d: %s; again in %.2f s, the attempt not counted",
            job.id,
            type(exc).__name__,
            delay,
            job=job,
        )
        note = f"retried without counting an attempt (snooze {job.snoozes + 1} of {bound})"
        return Outcome.snooze(job, delay, error=f"{note}: {error}")

    async def _invoke(self, spec: Task, job: Job) -> Any:
        if spec.is_async:
            return await spec.fn(job)
        future = self.threads.submit(tracing.carried(spec.fn) if self.traced else spec.fn, job)
        try:
            # Shielded: given up on, the future still learns when the thread
            # returns, which is when its slot is free again.
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.threads.abandon(future)
            raise

    def _timed_out(self, job: Job, spec: Task, timeout: float) -> Outcome:
        self.events(
            logging.WARNING, "timeout", "job %d timed out after %g s", job.id, timeout, job=job
        )
        if spec.is_async:
            return Outcome.failure(job, f"timed out after {timeout:g} s; handler cancelled")
        if spec.isolated:
            return Outcome.failure(job, f"timed out after {timeout:g} s; handler process killed")
        return Outcome.failure(
            job,
            f"timed out after {timeout:g} s; handler abandoned (its thread runs on, "
            "and its slot stays busy until it returns)",
        )
