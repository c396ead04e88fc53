"""Child processes for isolated sync handlers (``@task(isolated=True)``).

A thread cannot be killed: a sync handler past its timeout runs on and keeps
its slot (see threads.py). An isolated handler runs in a child process
instead, so that its timeout, a lost lease or the worker's stop can kill it,
and so that a handler that crashes its process (a segfault in an extension,
``os._exit``, the OOM killer) fails its attempt and nothing else. The price
is a pickled job and result per run (docs/results.md has the figure).

The pool is pebble's (an optional dependency, ``pgqueue[isolation]``): it
kills the one child whose task timed out or was cancelled, and starts a new
one. Children are spawned, not forked: the worker has threads and an event
loop that a fork would copy in whatever state they are in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
from collections.abc import Iterable
from typing import Any

from ..core.jobs import Job
from .handlers import Task

__all__ = ["HandlerProcesses", "HandlerTimedOut", "ProcessDied"]


class ProcessDied(Exception):
    """An isolated handler's process ended without a result."""


class HandlerTimedOut(Exception):
    """An isolated handler ran past its timeout; its process was killed."""


class HandlerProcesses:
    """Up to ``size`` child processes running the isolated tasks' handlers,
    started on first use."""

    def __init__(self, tasks: Iterable[Task], size: int | None = None) -> None:
        self.isolated = [task for task in tasks if task.isolated]
        for task in self.isolated:
            _check_importable(task)
        if self.isolated and importlib.util.find_spec("pebble") is None:
            raise RuntimeError("isolated tasks run on pebble: pip install 'pgqueue[isolation]'")
        self.size = size or os.cpu_count() or 1
        self._pool: Any = None

    def start(self) -> None:
        """Start the children now, if any task is isolated: a child's start
        is not part of its first job's time."""
        if self.isolated and self._pool is None:
            import multiprocessing

            from pebble import ProcessPool

            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPool(max_workers=self.size, context=context)

    async def run(self, task: Task, job: Job, time_limit: float | None) -> Any:
        """``task.fn(job)`` in a child. Raises HandlerTimedOut after
        ``time_limit`` seconds of running (not of waiting for a child) and
        ProcessDied if the child ended; either way the child is gone, and
        so it is if the call is cancelled."""
        from pebble import ProcessExpired

        self.start()
        # Without its attempt: the child cannot reach the worker (the
        # handle's methods raise NotInHandler there).
        child_job = dataclasses.replace(job, attempt=None)
        future = self._pool.schedule(task.fn, args=(child_job,), timeout=time_limit)
        try:
            return await asyncio.wrap_future(future)
        except TimeoutError as exc:
            # The pool's own timeout; what the handler raised carries its
            # remote traceback.
            if getattr(exc, "traceback", None) is None:
                raise HandlerTimedOut from None
            raise
        except ProcessExpired as exc:
            raise ProcessDied(f"handler process died (exit code {exc.exitcode})") from None

    def shutdown(self) -> None:
        """Kill the children: the worker has drained, or gave up on them."""
        if self._pool is not None:
            self._pool.stop()
            self._pool.join(timeout=5)


def _check_importable(task: Task) -> None:
    """A child gets the handler by name: refuse, when the worker is made,
    what could only fail at run time."""
    import pickle  # here: a worker without isolated tasks does without it

    try:
        pickle.dumps(task.fn)
    except Exception as exc:
        raise ValueError(
            f"task {task.name!r}: an isolated handler must be importable by name "
            f"(a module-level function), and {task.fn!r} is not: {exc}"
        ) from None
