"""Awaiting a coroutine in a context of its own, without a task of its own.

A task per job would give each handler its own copy of the context
variables, but would make and schedule a task for every job, a cost that
short jobs feel. The worker's runners (running.py) run many jobs in one
task; ``in_context`` keeps each job's context variables its own: it drives
the job's coroutine step by step, each step inside the job's context,
exactly as the task would, and passes the futures the coroutine waits on
through to the runner's task (which is what ``asyncio.current_task()``
returns inside the handler).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Coroutine, Generator
from contextvars import Context
from typing import Any, TypeVar

__all__ = ["in_context"]

T = TypeVar("T")


@types.coroutine
def in_context(
    coro: Coroutine[Any, Any, T], context: Context, waits: Callable[[], None] | None = None
) -> Generator[Any, Any, T]:
    """Await ``coro`` with ``context`` current in each of its steps;
    ``waits`` is called once, when the coroutine first waits on something
    (before the runner's task gives up the loop for it)."""
    run, send, throw = context.run, coro.send, coro.throw
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            waited_on = run(send, value) if error is None else run(throw, error)
        except StopIteration as end:
            return end.value  # type: ignore[no-any-return]
        if waits is not None:
            waits()
            waits = None
        try:
            value, error = (yield waited_on), None
        except BaseException as exc:  # a cancellation, or the runner closed: the job's to handle
            value, error = None, exc
