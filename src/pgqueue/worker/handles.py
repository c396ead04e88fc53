"""What a handler's job reaches of its worker: ``job.transaction()``.

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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ..core.flows import Flow
from ..core.settings import Settings
from ..core.transitions import complete
from ..db.handler_transactions import HandlerConnections
from .held import Held, Stage

__all__ = ["Handles"]


class Handles:
    """The worker's side of its jobs' handles."""

    def __init__(self, settings: Settings, connections: HandlerConnections) -> None:
        self.settings = settings
        self.connections = connections

    def transaction(self, held: Held, result_json: str) -> _Transaction:
        return _Transaction(self, held, result_json)


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
        """COMPLETED once the block committed; RUNNING again if it failed."""
        held = self._held
        _check_running(held)
        try:
            yield
        except BaseException:
            if held.stage is Stage.COMPLETING:
                held.stage = Stage.RUNNING
            raise
        held.stage = Stage.COMPLETED

    def _end(self) -> Flow[None]:
        """The completion, run last in the block's transaction."""
        held = self._held
        token = held.job.lease_token
        assert token is not None
        held.stage = Stage.COMPLETING
        return complete(self._handles.settings, held.job.id, token, self._result_json)


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
