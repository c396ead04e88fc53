"""The worker: runs handlers for claimed jobs (see docs/worker.md).

runtime.py     AsyncWorker: the parts below, wired together and supervised
producer.py    claims; executor.py runs handlers; completer.py acks
leases.py      heartbeats (the worker's own, in the workers registry, and its jobs')
maintenance.py reaps and prunes; held.py the jobs it holds
supervision.py the parts' event log and back-off
blocking.py    Worker: the blocking face, with signal handling
handlers.py    TaskRegistry, the ``task`` decorator, load_handlers("mod:ATTR")
scheduler.py   the part that fires schedules (periodic jobs)
threads.py     the daemon thread pool for sync handlers
processes.py   ``pgqueue worker``: one worker, or several processes supervised
"""

from __future__ import annotations

from .blocking import Worker
from .handlers import Task, TaskRegistry, load_handlers, task, tasks
from .runtime import AsyncWorker
from .typed import TypedTask

__all__ = [
    "AsyncWorker",
    "Task",
    "TaskRegistry",
    "TypedTask",
    "Worker",
    "load_handlers",
    "task",
    "tasks",
]
