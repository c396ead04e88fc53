"""The ``pgqueue`` command line (Typer + Rich); ``main`` is the console script.

app.py          the root group, global options, errors as one line
project.py      which project (walking up from the current folder), which database
options.py      --json, durations, times, lists
running.py      migrate, api, worker, up
producing.py    enqueue, enqueue-file
jobs.py         jobs list, show, cancel, retry
bulk.py         jobs bulk cancel, retry, delete (by filter, after a count)
watching.py     queues (the table), top
queues.py       queues, queues pause, resume, limit
history.py      queues history (a queue's last minutes)
workers.py      workers (the registry)
doctor.py       doctor (the live capacity and health check)
server.py       db start, stop, status, url (the embedded server)
maintenance.py  prune
schedules.py    schedules (list), schedules enable, disable, delete
workflows.py    workflows show, cancel, retry
keys.py         keys generate, rotate (payload encryption)
output.py       consoles, tables, JSON

Settings come from ``Settings.load`` (pgqueue.settings), per-queue numbers
from ``pgqueue.stats``, and ``up`` runs its processes under
``pgqueue.processes.ProcessSupervisor``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from .. import console
from .app import app, main

__all__ = ["COMMAND_TOPICS", "TOPICS", "app", "main", "topics_for"]

# Each topic module adds its commands to the root group when imported; the
# help lists them in this order.
TOPICS = (
    "running",
    "producing",
    "jobs",
    "bulk",
    "queues",
    "watching",
    "workers",
    "server",
    "maintenance",
    "schedules",
    "workflows",
    "batches",
    "history",
    "keys",
    "doctor",
)
# The topic modules that add each top-level command and what lies under it.
COMMAND_TOPICS = {
    "migrate": ("running",),
    "api": ("running",),
    "worker": ("running",),
    "up": ("running",),
    "enqueue": ("producing",),
    "enqueue-file": ("producing",),
    "jobs": ("jobs", "bulk"),
    "queues": ("queues", "history"),
    "top": ("watching",),
    "workers": ("workers",),
    "db": ("server",),
    "prune": ("maintenance",),
    "schedules": ("schedules",),
    "workflows": ("workflows",),
    "batches": ("batches",),
    "keys": ("keys",),
    "doctor": ("doctor",),
}


def topics_for(argv: Sequence[str] | None) -> tuple[str, ...]:
    """The topic modules a command line needs: those of each top-level
    command named in it (an option's value that looks like one only loads
    more), or all of them (the root help, a mistyped command, no command
    line: an import by tests or a program). A worker started from the
    console script so skips importing the other commands and building their
    parsers (about 0.05 s of each start)."""
    if argv is None:
        return TOPICS
    wanted = {topic for arg in argv for topic in COMMAND_TOPICS.get(arg, ())}
    return tuple(topic for topic in TOPICS if topic in wanted) or TOPICS


for _topic in topics_for(console.command_line):
    importlib.import_module(f".{_topic}", __name__)
