"""One job's path through the worker, from claimed to its outcome: each job
held (held.py) starts on a runner task, which runs its handler (executor.py)
and hands the outcome to the completer, then runs the prefetched jobs (those
claimed ahead of a free slot) one after another.

    JobRunners.start     the producer's claimed jobs: each held, and started
                         if a slot is free (else it waits: prefetch)
    JobRunners._runner   one task, for a job and then the prefetched ones
    JobRunners._run_job  -> Executor.execute: the handler, an Outcome
                         -> submit (Completer.submit): written in a batch
                         (or, when the handler's job.transaction() completed
                         the job, or its job.sleep() or job.wait_for_signal()
                         put it to sleep, -> completed: nothing left to write)
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
from collections.abc import Callable

from ..core.jobs import Job
from ..core.outcomes import Outcome
from ._context import in_context
from .executor import Executor
from .held import Held, HeldJobs, Stage
from .supervision import EventLog
from .threads import ThreadPool

__all__ = ["JobRunners"]

# Job is frozen: the runner sets its attempt through the slot itself, as the
# dataclass's __init__ does (98 ns for the two stores of a job, against 170
# through object.__setattr__); and compares stages with a name bound once
# (an enum member's lookup costs 80 ns).
_set_attempt = Job.__dict__["attempt"].__set__
_COMPLETED = Stage.COMPLETED
_ASLEEP = Stage.ASLEEP

# A claim starts at most this many runners at once; its other jobs wait in
# the buffer for them (each runs them one after another), or for the first
# of its jobs that waits on something, which starts runners for them
# (JobRunners.start).
RUNNERS_AT_ONCE = 100
# A runner lets the other parts have the loop after this many jobs (a job
# that never waits on anything would otherwise keep it to the last one).
RUNNER_TURN = 8


class JobRunners:
    """The runner tasks of one worker (see the module's docstring).
    ``dropped``: results discarded because the job's lease was lost;
    ``context``: what each job's context is copied from (the caller of the
    worker's run())."""

    def __init__(
        self,
        held: HeldJobs,
        threads: ThreadPool,
        executor: Executor,
        events: EventLog,
        *,
        submit: Callable[[Held, Outcome], None],
        completed: Callable[[Held, Outcome | None], None],
        crashed: Callable[[str, BaseException], None],
        name: str,
        concurrency: int,
    ) -> None:
        self.held = held
        self.threads = threads
        self.executor = executor
        self.events = events
        self.name = name
        self.concurrency = concurrency
        self.dropped = 0
        self.context = contextvars.copy_context()
        self._submit = submit
        self._completed = completed
        self._crashed = crashed
        self._hung_reported = 0

    def start(self, jobs: list[Job], *, first: bool = False) -> None:
        """Hold the claimed jobs and run those that have a slot, each on a
        runner of its own, up to RUNNERS_AT_ONCE; the others wait in the
        buffer (HeldJobs.hold) for a slot or a runner. A task made and
        scheduled for each job of a large claim (concurrency 1,000) is a
        cost that short jobs feel, while those runners would run them as
        soon; and jobs that wait on something start runners for the others
        (``_run_job``). ``first``: before the prefetched ones."""
        spawned = 0
        for job in jobs:
            held = self.held.hold(job, first=first, start=spawned < RUNNERS_AT_ONCE)
            if held.stage is Stage.RUNNING:  # else it waits: _next_ready
                self._spawn(held)
                spawned += 1

    def start_ready(self) -> None:
        """Start prefetched jobs while slots are free, each on a new runner."""
        while (held := self._next_ready()) is not None:
            self._spawn(held)

    def _next_ready(self) -> Held | None:
        """The next prefetched job, now running, if a slot is free (held.py:
        prefetch). A job whose lease was lost while it waited never starts."""
        while (held := self.held.next_ready()) is not None:
            if not held.lost:
                return held
            self.held.release(held.job.id, held)
            self.dropped += 1
        return None

    def _spawn(self, held: Held) -> None:
        held.task = asyncio.create_task(self._runner(held))
        held.task.add_done_callback(self._runner_ended)

    async def _runner(self, held: Held) -> None:
        """Run ``held``, then the prefetched jobs one after another while there
        are any: one task for many short jobs (a task per job is made and
        scheduled for every job, a cost that short jobs feel), each job still
        in a context of its own (``in_context``)."""
        # Not held.task: under an eager task factory (Python 3.12) the runner
        # starts before _spawn has set it.
        task = asyncio.current_task()
        assert task is not None
        for ran in itertools.count(1):
            held.task = task
            await self._run_job(held)
            if held.lost or held.interrupted:
                # The cancellation was this job's (lease keeper, shutdown),
                # not the runner's: the next job must not inherit it.
                while task.cancelling():
                    task.uncancel()
            if ran % RUNNER_TURN == 0:
                await asyncio.sleep(0)  # the other parts' turn
            next_held = self._next_ready()
            if next_held is None:
                return
            held = next_held

    async def _run_job(self, held: Held) -> None:
        """Run the job's handler, the job's ``attempt`` set to ``held``
        while it runs (job.transaction(), job.progress()); hand its outcome
        to the completer."""
        job = held.job
        outcome: Outcome | None = None
        _set_attempt(job, held)
        try:
            # A job that waits on something gives up the loop: the jobs that
            # have slots but no runner start meanwhile, on runners of their own.
            outcome = await in_context(
                self.executor.execute(job), self.context.copy(), self.start_ready
            )
        except asyncio.CancelledError:
            if held.interrupted:
                outcome = Outcome.failure(
                    job, "interrupted: the worker shut down before the handler finished"
                )
            elif not held.lost:
                raise  # the worker is being torn down
        finally:
            _set_attempt(job, None)  # and no cycle job -> held -> job is left
            self.held.handler_finished(held)
            if self.threads.hung != self._hung_reported:
                self._report_hung()
        if held.stage is _COMPLETED or held.stage is _ASLEEP:
            self._completed(held, outcome)
            return
        if outcome is None or held.lost:
            self.held.release(job.id, held)
            self.dropped += 1
            if held.cancelled:  # logged as the cancel came (LeaseKeeper.cancelled)
                return
            self.events(
                logging.WARNING,
                "discard",
                "job %d: lease lost; the handler's result is discarded",
                job.id,
                job=job,
            )
            return
        self._submit(held, outcome)

    def hung_returned(self) -> None:
        self.held.slot_hung_return()
        self.start_ready()
        self._report_hung()

    def _report_hung(self) -> None:
        hung, self._hung_reported = self.threads.hung, self.threads.hung
        if hung:
            self.events(
                logging.WARNING,
                "degraded",
                "worker %s degraded: %d of %d slots held by sync handlers that run on past "
                "their job (timeout or lost lease); their slots free up when they return",
                self.name,
                hung,
                self.concurrency,
                hung_handlers=hung,
            )
        else:
            self.events(logging.INFO, "recovered", "worker %s: no hung handlers left", self.name)

    def _runner_ended(self, task: asyncio.Task[None]) -> None:
        """A runner's unexpected error (a handler's is its job's outcome) is
        a failure of the worker like any part's."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._crashed("jobs", exc)
