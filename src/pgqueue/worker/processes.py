"""``pgqueue worker``: one worker in this process, or several worker
processes under ``pgqueue.processes.ProcessSupervisor``, each child running
``child_main``."""

from __future__ import annotations

import functools
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.settings import Settings
from ..db.connections import resolve_url
from ..logs import ENV_LOG_FORMAT, stderr_handler
from ..processes import Child, ProcessSupervisor
from .blocking import Worker
from .handlers import load_handlers, load_target

__all__ = ["child_main", "run_processes", "run_worker"]

log = logging.getLogger("pgqueue.worker")

# Past the workers' own shutdown timeout, how long before children are killed.
KILL_GRACE_SECONDS = 10.0
_CHILD_COMMAND = "from pgqueue.worker.processes import child_main; child_main()"


def run_worker(
    handlers: str, *, queues: list[str] | None, concurrency: int, settings: Settings
) -> int:
    """One worker in this process, until SIGTERM/SIGINT; the exit code."""
    return Worker(
        load_target(handlers), settings=settings, queues=queues, concurrency=concurrency
    ).run()


def run_processes(
    handlers: str,
    *,
    queues: list[str] | None,
    concurrency: int,
    processes: int,
    settings: Settings,
    check_handlers: Callable[[str], object] = load_handlers,
) -> int:
    """``pgqueue worker``: ``processes`` == 1 runs one worker in this process,
    more run under a supervisor that restarts a child that dies. Blocks until
    SIGTERM/SIGINT; returns the exit code (0 after a clean shutdown).
    ``check_handlers(handlers)`` raises a clear error for handlers that
    cannot be loaded, here rather than in every child: before anything
    starts for one process, once the children are forked for several (a
    module that connects or starts a thread when imported must not be
    imported before the fork, which would share it with every child)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    if settings.clusters:
        # Imported here: clusters.py routes producers' calls too, through
        # the Queue faces, which a worker without clusters never imports.
        from ..clusters import worker_groups

        # One set of workers per cluster (clusters.py), all supervised here.
        groups = worker_groups(settings, queues)
    else:
        if processes == 1:
            check_handlers(handlers)
        # Resolve (and start, if embedded) the database once, for all children.
        settings = settings.replace(database_url=resolve_url(settings))
        if processes == 1:
            # Sync handlers run on daemon threads: one stuck past its timeout
            # does not keep the process alive after the shutdown.
            return run_worker(handlers, queues=queues, concurrency=concurrency, settings=settings)
        groups = [(settings, queues)]
    children = [
        _child(
            f"worker-{n}" if len(groups) == 1 else f"cluster-{c}-worker-{n}",
            {"handlers": handlers, "queues": wanted, "concurrency": concurrency, "settings": each},
        )
        for c, (each, wanted) in enumerate(groups, 1)
        for n in range(1, processes + 1)
    ]
    supervisor = ProcessSupervisor(
        children,
        stop_timeout=settings.shutdown_timeout_seconds + KILL_GRACE_SECONDS,
        on_event=_log_event,
    )
    return supervisor.run(after_start=lambda: check_handlers(handlers))


def _child(name: str, config: dict[str, object]) -> Child:
    """A worker process of the supervisor; its config goes on stdin (no
    password on the command line)."""
    config |= {
        "log_level": logging.getLogger("pgqueue").getEffectiveLevel(),
        "parent": os.getpid(),
    }
    return Child(
        name,
        [sys.executable, "-c", _CHILD_COMMAND],
        stdin=pickle.dumps(config),
        restart=True,
        fork=functools.partial(_run_child, config),
    )


def _log_event(action: str, message: str, level: int) -> None:
    log.log(level, "supervisor: %s", message, extra={"action": action})


def child_main() -> None:
    """A worker process under the supervisor: its config comes on stdin."""
    config = pickle.loads(sys.stdin.buffer.read())
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(stderr_handler(os.environ.get(ENV_LOG_FORMAT, "text")))
        root.setLevel(config["log_level"])
    code = _run_child(config)
    # Handler threads that outlived their timeout must not hold the exit.
    os._exit(code)


def _run_child(config: dict[str, Any]) -> int:
    """A child's worker, started from its config (in a new interpreter, or in
    a fork of the supervisor, which has the logging set up already)."""
    threading.Thread(target=_watch_parent, args=(config["parent"],), daemon=True).start()
    code = run_worker(
        config["handlers"],
        queues=config["queues"],
        concurrency=config["concurrency"],
        settings=config["settings"],
    )
    logging.shutdown()
    return code


def _watch_parent(parent: int) -> None:
    """If the supervisor dies, stop gracefully rather than run orphaned."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
            return
