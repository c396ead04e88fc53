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

from .app import app, main

# Each topic module adds its commands to the root group when imported; the
# help lists them in this order.
from . import running, producing, jobs, bulk, queues, watching, workers, server, maintenance  # noqa: F401  # isort: skip
from . import schedules  # noqa: F401  # isort: skip
from . import workflows  # noqa: F401  # isort: skip
from . import batches  # noqa: F401  # isort: skip
from . import history  # noqa: F401  # isort: skip
from . import keys  # noqa: F401  # isort: skip
from . import doctor  # noqa: F401  # isort: skip

__all__ = ["app", "main"]
