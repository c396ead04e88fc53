"""Handlers for the fault runs (tests/acceptance and bench/faults), and the worker
processes that run them. Each handler run leaves evidence.

Before doing any work, a handler inserts a *delivery* row (job id, attempt,
fencing token, worker pid) on its own connection, committed at once, so the
row survives even if the worker dies the next instant. It then works for
10-50 ms (or what the payload asks) and returns a result naming the attempt
that produced it. ``harness.invariants`` compares the two afterwards.

    pgqueue worker --handlers harness.fault_tasks:HANDLERS

The deliveries go to FAULT_DB_URL, else PGQUEUE_DATABASE_URL, else
DATABASE_URL: the partition test points the worker at a proxy but its
evidence straight at the server, so that a frozen proxy cannot hide it.

Payload keys (all optional):
    ms      work time in milliseconds (default: random 10-50)
    exit    true: after recording the delivery, kill this whole process
            with os._exit(3) (a poison job)

``effect`` does its work inside ``job.transaction()``: it inserts a row
into ``fault_effects`` (no unique constraint: a second commit would show
as a second row), records the delivery, and works, all inside the block;
the row commits with the job's completion or not at all.

``steps`` runs ten durable steps (``job.step()``), each marking its start
and its end in ``fault_step_marks`` (STEP_MARKS_DDL).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, LiteralString

import psycopg

from pgqueue import Job

__all__ = [
    "DELIVERIES_DDL",
    "EFFECTS_DDL",
    "HANDLERS",
    "STEPS",
    "STEP_MARKS_DDL",
    "create_deliveries",
    "delivery_url",
    "effect",
    "release",
    "scalar",
    "spawn_worker",
    "steps",
    "stop_worker",
    "wait_for",
    "work",
    "worker_env",
]

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS fault_effects (
    job_id  bigint  NOT NULL,
    token   bigint  NOT NULL,
    pid     integer NOT NULL
);
"""

# The evidence of ``steps``: a row as each step starts and as it ends
# (mark 'start' or 'end'), committed at once.
STEP_MARKS_DDL = """
CREATE TABLE IF NOT EXISTS fault_step_marks (
    job_id  bigint  NOT NULL,
    step    integer NOT NULL,
    mark    text    NOT NULL,
    token   bigint  NOT NULL,
    pid     integer NOT NULL
);
"""
STEPS = 10

DELIVERIES_DDL = """
CREATE TABLE IF NOT EXISTS fault_deliveries (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    token       bigint      NOT NULL,
    worker_pid  integer     NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS fault_deliveries_job ON fault_deliveries (job_id);
"""

# The delivery sessions of this process: at most SESSIONS, shared by the
# handler threads. A session per thread (as before) let eight workers of a
# hundred threads each open more sessions than the server allows, and the
# deliveries, not the queue, failed.
SESSIONS = 8
_idle: list[psycopg.Connection[Any]] = []
_idle_lock = threading.Lock()
_sessions = threading.BoundedSemaphore(SESSIONS)


def delivery_url() -> str:
    for name in ("FAULT_DB_URL", "PGQUEUE_DATABASE_URL", "DATABASE_URL"):
        if os.environ.get(name):
            return os.environ[name]
    raise RuntimeError("fault_tasks: set FAULT_DB_URL (or PGQUEUE_DATABASE_URL) first")


def create_deliveries(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DELIVERIES_DDL)


def _session() -> psycopg.Connection[Any]:
    with _idle_lock:
        if _idle:
            return _idle.pop()
    return _connect()


def _connect() -> psycopg.Connection[Any]:
    return psycopg.connect(delivery_url(), autocommit=True, connect_timeout=5)


def _close(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.close()


def _record(job: Job) -> None:
    """Insert the delivery row."""
    _insert(
        "INSERT INTO fault_deliveries (job_id, attempt, token, worker_pid) VALUES (%s, %s, %s, %s)",
        (job.id, job.attempts, job.lease_token, os.getpid()),
    )


def _insert(sql: LiteralString, row: tuple[Any, ...]) -> None:
    """Insert an evidence row, committed at once. A session that fails is
    closed (it may be broken by a restart, or read-only because it began
    while the database refused writes) and the insert is tried once more on
    a new one; a second failure fails the attempt."""
    with _sessions:
        conn = None
        try:
            conn = _session()
            conn.execute(sql, row)
        except psycopg.Error:
            if conn is not None:
                _close(conn)
            conn = _connect()
            try:
                conn.execute(sql, row)
            except psycopg.Error:
                _close(conn)
                raise
        with _idle_lock:
            _idle.append(conn)


def work(job: Job) -> dict[str, Any]:
    """Record the delivery, work a little, return which attempt did it (and,
    for a job of a workflow, the job ids its parents' results name)."""
    _record(job)
    payload = job.payload or {}
    if payload.get("exit"):
        os._exit(3)
    ms = payload.get("ms")
    time.sleep((ms if ms is not None else random.uniform(10, 50)) / 1000)
    result: dict[str, Any] = {
        "job_id": job.id,
        "attempt": job.attempts,
        "token": job.lease_token,
        "pid": os.getpid(),
    }
    if job.parents:
        result["parents"] = [p.get("job_id") if isinstance(p, dict) else None for p in job.parents]
    return result


def effect(job: Job) -> dict[str, Any]:
    """``work``'s effect inside the job's transaction (see the module's docstring)."""
    # work's result, known before the block: the job's completion writes it.
    result = {"job_id": job.id, "attempt": job.attempts, "token": job.lease_token}
    result["pid"] = os.getpid()
    with job.transaction(result) as conn:
        conn.execute(
            "INSERT INTO fault_effects (job_id, token, pid) VALUES (%s, %s, %s)",
            (job.id, job.lease_token, os.getpid()),
        )
        work(job)
    return result


def steps(job: Job) -> list[int]:
    """Ten durable steps (job.step()), ``step0`` to ``step9``, each marking
    its start and its end in fault_step_marks around ``ms`` of work
    (default 100); returns what the steps returned, 0 to 9."""
    ms = (job.payload or {}).get("ms", 100)
    return [job.step(f"step{i}", _step, job, i, ms) for i in range(STEPS)]


def _step(job: Job, step: int, ms: float) -> int:
    _mark(job, step, "start")
    time.sleep(ms / 1000)
    _mark(job, step, "end")
    return step


def _mark(job: Job, step: int, mark: str) -> None:
    _insert(
        "INSERT INTO fault_step_marks (job_id, step, mark, token, pid) VALUES (%s, %s, %s, %s, %s)",
        (job.id, step, mark, job.lease_token, os.getpid()),
    )


HANDLERS = {"work": work, "effect": effect, "steps": steps}


# -- worker processes for the fault tests --------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def worker_env(url: str, **settings: Any) -> dict[str, str]:
    """Environment for a ``pgqueue worker`` child: the database, PGQUEUE_*
    settings, and this repository on the path (for harness.fault_tasks)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.pop("DATABASE_URL", None)
    env["PGQUEUE_DATABASE_URL"] = url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for name, value in settings.items():
        env[f"PGQUEUE_{name.upper()}"] = str(value)
    return env


def spawn_worker(
    url: str,
    *,
    concurrency: int = 1,
    processes: int = 1,
    log: Any = subprocess.DEVNULL,
    delivery_url: str | None = None,
    warm: bool = False,
    **settings: Any,
) -> subprocess.Popen[bytes]:
    """Start ``python -m pgqueue worker`` on the fault handlers. With
    ``processes`` == 1 the child *is* the worker (its pid names it).

    ``warm``: start ``python -m harness.fault_tasks`` instead, which imports
    the command line and the worker and then waits for a line on stdin
    (``release``) before it runs ``pgqueue worker`` in the same process. The
    crash test keeps such spares ready, so that a replacement starts working
    at once instead of after a second of imports on a small machine."""
    env = worker_env(url, **settings)
    if delivery_url:
        env["FAULT_DB_URL"] = delivery_url
    if warm:
        command = ["-m", "harness.fault_tasks", *_worker_args(concurrency, processes)]
    else:
        command = ["-m", "pgqueue", "worker", *_worker_args(concurrency, processes)]
    return subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE if warm else subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT if log is not subprocess.DEVNULL else subprocess.DEVNULL,
    )


def release(proc: subprocess.Popen[bytes]) -> None:
    """Let a warm spare (``spawn_worker(warm=True)``) start working."""
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.close()


def _worker_args(concurrency: int, processes: int) -> list[str]:
    """The options of ``pgqueue worker`` that run the fault handlers."""
    return [
        "--handlers",
        "harness.fault_tasks:HANDLERS",
        "--concurrency",
        str(concurrency),
        "--processes",
        str(processes),
    ]


def _warm_main(argv: list[str]) -> int:
    """A worker process that is ready before it is needed (see spawn_worker):
    ``pgqueue worker ARGV`` once a ``go`` line arrives on stdin."""
    # The imports are the slow part of a start: done before the wait. The
    # command line imports the worker only when it runs it.
    from pgqueue.cli import main

    importlib.import_module("pgqueue.worker")
    if sys.stdin.readline().strip() != "go":
        return 0
    sys.argv = ["pgqueue", "worker", *argv]
    main()  # exits with the worker's code
    return 0


def stop_worker(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM (graceful) and wait; SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def wait_for(predicate: Any, timeout: float, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; TimeoutError after."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)


def scalar(url: str, sql: str, params: Any = None) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()
        return row[0] if row else None


if __name__ == "__main__":
    sys.exit(_warm_main(sys.argv[1:]))
