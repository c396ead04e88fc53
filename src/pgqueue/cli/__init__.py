"""The ``pgqueue`` command line (Typer + Rich); ``main`` is the console script.

app.py         the commands, and the root group that turns errors into one line
config.py      flags > PGQUEUE_* environment > [tool.pgqueue] > defaults
output.py      consoles, tables, JSON
stats.py       the per-queue numbers of ``queues`` and ``top``
supervisor.py  ``up``: child processes in their own groups, one Ctrl-C stops all
"""

from __future__ import annotations

from .app import app, main

__all__ = ["app", "main"]
