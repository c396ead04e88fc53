"""What a handler's job reaches of its worker: ``job.transaction()``,
``job.progress()``, ``job.step()``, ``job.checkpoint()``, ``job.sleep()``
and ``job.wait_for_signal()``.

The worker sets each running job's ``attempt`` to its ``Held`` (held.py),
whose methods come here. A transaction's block runs on a connection of the
worker's HandlerConnections (db/handler_transactions.py) and ends with the
job's completion in the same transaction (transitions.complete, fenced by
the token): the handler's writes commit if and only if the job does.

Stages: the completion moves the job to COMPLETING just before it goes
out (so that a heartbeat's reply, which no longer finds the row running,
does not read as a lost lease), back to RUNNING if the block fails, and
to COMPLETED once committed; the runner then releases the job without
writing an outcome (running.py).

Progress: a report only replaces the job's entry in ``reported`` (a dict
store, safe from the handlers' threads); ProgressWriter writes the latest
entry of every job once a second in one ``job_progress`` statement on the
upkeep connection, fenced by each attempt's token. A worker whose handlers
report nothing sends nothing.

Steps (core/steps.py): an attempt reads the steps its job's attempts
stored at its first step (``Held.steps``), then stores each step it
completes, and each checkpoint, in a statement of its own on a handler
connection, fenced by the token. A job that takes no step reads nothing.

Sleeps and waits (core/sleeps.py): each call is numbered within the attempt
(``Held.sleeps``) and sends one statement (a wait: a transaction of two),
which stores its step and may put the job to sleep. The stage is SLEEPING
while it is out (the heartbeat leaves the job alone: the statement's reply
decides its lease), then ASLEEP if the job went to sleep, and the handler
unwinds by ``Asleep``; RUNNING again otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from ..core import sleeps
from ..core.errors import InvalidJob, StaleAttempt
from ..core.flows import Flow
from ..core.settings import Settings
from ..core.steps import NOTHING_STORED, recall_steps, record_step, write_checkpoint
from ..core.transitions import Report, complete, report_progress
from ..db.handler_transactions import HandlerConnections
from ..db.worker_connection import FlowDriver
from .held import Held, Stage
from .supervision import WAIT_OUT, Backoff, EventLog

__all__ = ["PROGRESS_SECONDS", "Handles", "ProgressWriter"]

T = TypeVar("T")

# The worker writes each running job's latest progress at most this often.
PROGRESS_SECONDS = 1.0


class Handles:
    """The worker's side of its jobs' handles."""

    def __init__(self, settings: Settings, connections: HandlerConnections) -> None:
        self.settings = settings
        self.connections = connections
        # The latest progress report of each job not yet written, by job id.
        self.reported: dict[int, tuple[Held, float, str | None]] = {}

    def take_reports(self) -> list[Report]:
        """The reports waiting, out of ``reported``, those of attempts still
        running (a completed or lost one's would match nothing). Each is
        popped by its key: a report made meanwhile waits for the next round."""
        reports = []
        for job_id in list(self.reported):
            held, fraction, info_json = self.reported.pop(job_id)
            token = held.job.lease_token
            if held.stage is Stage.RUNNING and not held.lost and token is not None:
                reports.append(Report(job_id, token, fraction, info_json))
        return reports

    def transaction(self, held: Held, result_json: str) -> _Transaction:
        return _Transaction(self, held, result_json)

    def step_found(self, held: Held, name: str) -> tuple[bool, Any]:
        _refuse_on_a_loop("step")
        _fence(held)
        if held.steps is None:
            held.steps = self.connections.run(recall_steps(held.job.id))
        return _found(held, name)

    async def step_found_async(self, held: Held, name: str) -> tuple[bool, Any]:
        _fence(held)
        if held.steps is None:
            held.steps = await self.connections.run_async(recall_steps(held.job.id))
        return _found(held, name)

    def store_step(self, held: Held, name: str, result_json: str) -> None:
        self.connections.run(record_step(*_fence(held), name, result_json))
        _completed(held).add(name)

    async def store_step_async(self, held: Held, name: str, result_json: str) -> None:
        await self.connections.run_async(record_step(*_fence(held), name, result_json))
        _completed(held).add(name)

    def store_checkpoint(self, held: Held, value_json: str) -> None:
        _refuse_on_a_loop("checkpoint")
        self.connections.run(write_checkpoint(*_fence(held), value_json))

    async def store_checkpoint_async(self, held: Held, value_json: str) -> None:
        await self.connections.run_async(write_checkpoint(*_fence(held), value_json))

    def sleep(self, held: Held, seconds: float | None, until: datetime | None) -> None:
        _refuse_on_a_loop("sleep")
        flow = _sleep_flow(held, seconds, until)
        _awake_or_asleep(held, *_sleeping(held, self.connections.run, flow))

    async def sleep_async(self, held: Held, seconds: float | None, until: datetime | None) -> None:
        flow = _sleep_flow(held, seconds, until)
        with _staged_sleep(held):
            wake_at, asleep = await self.connections.run_async(flow)
        _awake_or_asleep(held, wake_at, asleep)

    def wait_for_signal(self, held: Held, name: str, timeout: float) -> Any:
        _refuse_on_a_loop("wait_for_signal")
        flow = _wait_flow(held, name, timeout)
        result, asleep = _sleeping(held, self.connections.run_in_transaction, flow)
        return _waited(held, name, result, asleep)

    async def wait_for_signal_async(
        self,
        held: Held,
        name: str,
        timeout: float,  # noqa: ASYNC109
    ) -> Any:
        flow = _wait_flow(held, name, timeout)
        with _staged_sleep(held):
            result, asleep = await self.connections.run_in_transaction_async(flow)
        return _waited(held, name, result, asleep)


@dataclass
class ProgressWriter:
    """Writes the handlers' progress reports (see the module's docstring)."""

    conn: FlowDriver
    handles: Handles
    events: EventLog

    async def write_loop(self) -> None:
        """Every PROGRESS_SECONDS, the reports waiting, for ever. Reports
        that cannot be written are dropped: the next ones say more."""
        backoff = Backoff(self.events, "writing progress")
        while True:
            await asyncio.sleep(PROGRESS_SECONDS)
            reports = self.handles.take_reports()
            if not reports:
                continue
            try:
                await self.conn.drive(report_progress(reports))
            except WAIT_OUT as exc:
                backoff.note(exc)
            else:
                backoff.succeeded()


class _Transaction:
    """``with`` (sync handlers, on a thread) or ``async with`` (async
    handlers, on the loop): one object, so that one name serves both."""

    __slots__ = ("_block", "_handles", "_held", "_result_json")

    def __init__(self, handles: Handles, held: Held, result_json: str) -> None:
        self._handles = handles
        self._held = held
        self._result_json = result_json
        self._block: Any = None

    def __enter__(self) -> Any:
        if _on_a_loop():
            raise TypeError(
                "job.transaction() in an async handler: use `async with job.transaction()` "
                "(a plain `with` would block the worker's event loop)"
            )
        self._block = self._sync()
        return self._block.__enter__()

    def __exit__(self, *exc_info: Any) -> bool | None:
        block, self._block = self._block, None
        return bool(block.__exit__(*exc_info))

    async def __aenter__(self) -> Any:
        self._block = self._async()
        return await self._block.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        block, self._block = self._block, None
        return bool(await block.__aexit__(*exc_info))

    @contextlib.contextmanager
    def _sync(self) -> Iterator[Any]:
        with self._staged(), self._handles.connections.transaction(self._end) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def _async(self) -> AsyncIterator[Any]:
        with self._staged():
            async with self._handles.connections.transaction_async(self._end) as conn:
                yield conn

    @contextlib.contextmanager
    def _staged(self) -> Iterator[None]:
        """COMPLETED once the block committed; RUNNING again if it failed.
        (Only from COMPLETING: a sync handler's thread may end its block
        after the runner gave its attempt up, timed out, and moved on.)"""
        held = self._held
        _check_running(held)
        try:
            yield
        except BaseException:
            if held.stage is Stage.COMPLETING:
                held.stage = Stage.RUNNING
            raise
        if held.stage is Stage.COMPLETING:
            held.stage = Stage.COMPLETED

    def _end(self) -> Flow[None]:
        """The completion, run last in the block's transaction; StaleAttempt
        at once for an attempt the worker already gave up (its lease found
        lost, or its handler timed out or was interrupted): its failure is
        being written, and the block must not commit against it."""
        held = self._held
        job_id, token = _fence(held, "the transaction was rolled back")
        held.stage = Stage.COMPLETING
        return complete(self._handles.settings, job_id, token, self._result_json)


def _fence(held: Held, what: str = NOTHING_STORED) -> tuple[int, int]:
    """(id, token) of an attempt the worker still runs; StaleAttempt (saying
    ``what`` came of the call) for one it gave up: its lease found lost,
    its handler timed out or was interrupted, or its job completed by
    job.transaction(). Nothing of it may be written: not a block's commit,
    not a step (whose function is then not run either)."""
    token = held.job.lease_token
    assert token is not None
    if held.stage is not Stage.RUNNING or held.lost or held.interrupted:
        raise StaleAttempt(held.job.id, token, what)
    return held.job.id, token


def _numbered(held: Held, kind: str) -> int:
    """The number of this attempt's call of ``kind`` (1, 2, ...)."""
    if held.sleeps is None:
        held.sleeps = {}
    n = held.sleeps[kind] = held.sleeps.get(kind, 0) + 1
    return n


def _sleep_flow(
    held: Held, seconds: float | None, until: datetime | None
) -> Flow[tuple[datetime, bool]]:
    name = sleeps.sleep_step_name(_numbered(held, "sleep"))
    return sleeps.sleep(*_fence(held), name, seconds, until)


def _wait_flow(held: Held, signal: str, timeout: float) -> Flow[tuple[Any, bool]]:
    name = sleeps.wait_step_name(signal, _numbered(held, f"wait:{signal}"))
    return sleeps.wait_for_signal(*_fence(held), name, signal, timeout)


@contextlib.contextmanager
def _staged_sleep(held: Held) -> Iterator[None]:
    """SLEEPING while a sleep's or wait's statement is out; RUNNING again
    if it failed (nothing was decided: the job still runs)."""
    held.stage = Stage.SLEEPING
    try:
        yield
    except BaseException:
        if held.stage is Stage.SLEEPING:
            held.stage = Stage.RUNNING
        raise


def _sleeping(held: Held, run: Callable[[Flow[T]], T], flow: Flow[T]) -> T:
    with _staged_sleep(held):
        return run(flow)


def _awake_or_asleep(held: Held, wake_at: datetime, asleep: bool) -> None:
    """The job went to sleep: ASLEEP, and the handler unwinds (Asleep);
    else it runs on."""
    if asleep:
        held.stage = Stage.ASLEEP
        raise sleeps.Asleep(held.job.id, wake_at)
    held.stage = Stage.RUNNING


def _waited(held: Held, signal: str, result: dict[str, Any], asleep: bool) -> Any:
    _awake_or_asleep(held, datetime.fromisoformat(result["deadline"]), asleep)
    return sleeps.waited(held.job.id, signal, result)


def _found(held: Held, name: str) -> tuple[bool, Any]:
    """Whether an attempt stored the step ``name``, and its result. A name
    this attempt completed already is refused: two steps of one name
    would share one stored result."""
    if name in _completed(held):
        raise InvalidJob(
            "step",
            f"{name!r}: this attempt already completed a step of that name "
            "(each step of a job needs a name of its own)",
        )
    assert held.steps is not None
    if name not in held.steps:
        return False, None
    _completed(held).add(name)
    return True, held.steps[name]


def _completed(held: Held) -> set[str]:
    if held.steps_done is None:
        held.steps_done = set()
    return held.steps_done


def _refuse_on_a_loop(method: str) -> None:
    if _on_a_loop():
        raise TypeError(
            f"job.{method}() in an async handler: use `await job.{method}_async(...)` "
            "(the sync call would block the worker's event loop)"
        )


def _check_running(held: Held) -> None:
    """A block may start while no other block has completed the job."""
    if held.stage is not Stage.RUNNING:
        raise RuntimeError(
            f"job {held.job.id}: job.transaction() can complete a job once; "
            f"this attempt is {held.stage.value}"
        )


def _on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
