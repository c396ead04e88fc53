"""The worker: runs handlers for claimed jobs (see docs/worker.md).

    runtime.py     AsyncWorker (the asyncio runtime) and Worker (blocking, signals)
    handlers.py    TaskRegistry, the ``task`` decorator, load_handlers("mod:ATTR")
    _threads.py    the daemon thread pool for sync handlers
    supervisor.py  several worker processes, restarted when they die

``run_from_cli`` is what ``pgqueue worker`` calls.
"""

from __future__ import annotations

import logging

from ..queue import resolve_url
from ..settings import Settings
from .handlers import Task, TaskRegistry, load_handlers, task, tasks
from .runtime import AsyncWorker, Worker

__all__ = [
    "AsyncWorker",
    "Task",
    "TaskRegistry",
    "Worker",
    "load_handlers",
    "run_from_cli",
    "task",
    "tasks",
]

log = logging.getLogger("pgqueue.worker")


def run_worker(
    handlers: str, *, queues: list[str] | None, concurrency: int, settings: Settings
) -> int:
    """One worker in this process, until SIGTERM/SIGINT; the exit code."""
    return Worker(
        load_handlers(handlers), settings=settings, queues=queues, concurrency=concurrency
    ).run()


def run_from_cli(
    handlers: str,
    *,
    queues: list[str] | None,
    concurrency: int,
    processes: int,
    settings: Settings,
) -> int:
    """``pgqueue worker``: ``processes`` == 1 runs one worker in this process,
    more run under a supervisor. Blocks until SIGTERM/SIGINT; returns the
    exit code (0 after a clean shutdown)."""
    from .supervisor import Supervisor

    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    # Fail here, with a clear error, rather than in every child.
    load_handlers(handlers)
    # Resolve (and start, if embedded) the database once, for all children.
    settings = settings.replace(database_url=resolve_url(settings))
    if processes == 1:
        # Sync handlers run on daemon threads: one stuck past its timeout
        # does not keep the process alive after the shutdown.
        return run_worker(handlers, queues=queues, concurrency=concurrency, settings=settings)
    return Supervisor(
        handlers, processes=processes, queues=queues, concurrency=concurrency, settings=settings
    ).run()
