"""Database restart under load: every job still succeeds.

    python -m bench.faults.restart [--jobs 500] [--workers 4] [--at 0.3] [--mode fast]
                                   [--restart-cmd "docker restart pg"] [--out PATH]

Without --restart-cmd: a fresh embedded server on disk with default
durability (fsync and synchronous_commit on), restarted with
``pg_ctl restart -m fast`` (every session is disconnected and every open
transaction aborted) once AT of the jobs have succeeded. With --restart-cmd:
DATABASE_URL is used and the command is run instead (it must return once
the server is going down or back).

WORKERS ``pgqueue worker`` processes (concurrency 1) run the fault handlers
(``harness.fault_tasks``: a delivery row on the handler's own connection, then
10-50 ms of work) throughout; nobody restarts them. Reported: handler
invocations (claims: the sum of attempts), delivery rows, failed attempts,
how long the server took to accept connections again, and how long until
every job had succeeded, both from the moment the restart began; and every
job that had succeeded before the restart must be unchanged after it (same
state, same fencing token: neither lost nor run again). With ``--mode
immediate`` the server stops like a crash and recovers from its WAL.

Writes results/restart.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.common import bench_server, reset_database
from bench.record import ResultRecord, command_line, server_info, write_result
from harness.fault_tasks import create_deliveries, scalar, spawn_worker, stop_worker, wait_for
from harness.invariants import check
from pgqueue import Queue, Settings, migrate
from pgqueue.db.embedded import EmbeddedPostgres, StopMode

WORKER_SETTINGS: dict[str, Any] = {
    "lease_seconds": 5,
    "heartbeat_seconds": 1,
    "reap_interval_seconds": 1,
    "backoff_base_seconds": 0.1,
    "backoff_cap_seconds": 1,
    "poll_interval_seconds": 0.2,
    "shutdown_timeout_seconds": 10,
}


def _accepts_connections(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=1) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def run(
    url: str,
    restart: Callable[[], None],
    *,
    jobs: int = 500,
    workers: int = 4,
    at: float = 0.3,
    timeout: float = 180.0,
) -> dict[str, Any]:
    """Run the test on the database at ``url`` (migrated, empty); ``restart``
    is a callable that restarts the server."""
    create_deliveries(url)
    with Queue(url, settings=Settings(database_url=url)) as q:
        q.enqueue_many([{"task": "work", "payload": {"n": i}} for i in range(jobs)])
    procs = [spawn_worker(url, concurrency=1, **WORKER_SETTINGS) for _ in range(workers)]
    started = time.monotonic()
    try:
        threshold = int(jobs * at)
        wait_for(
            lambda: (
                scalar(url, "SELECT count(*) FROM pgqueue_jobs WHERE state = 'succeeded'")
                >= threshold
            ),
            timeout=timeout,
            interval=0.01,
        )
        with psycopg.connect(url, autocommit=True) as conn:
            before: dict[str, int] = dict(
                conn.execute("SELECT state, count(*) FROM pgqueue_jobs GROUP BY state").fetchall()
            )
            # Committed before the restart: these must come through unchanged.
            committed: dict[int, int] = dict(
                conn.execute(
                    "SELECT id, lease_token FROM pgqueue_jobs WHERE state = 'succeeded'"
                ).fetchall()
            )
        restart_began = time.monotonic()
        restart()
        restart_returned = time.monotonic() - restart_began
        wait_for(lambda: _accepts_connections(url), timeout=60, interval=0.02)
        accepting = time.monotonic() - restart_began
        wait_for(
            lambda: (
                _accepts_connections(url)
                and scalar(url, "SELECT count(*) FROM pgqueue_jobs WHERE state <> 'succeeded'") == 0
            ),
            timeout=timeout,
            interval=0.02,
        )
        all_done = time.monotonic() - restart_began
        wall = time.monotonic() - started
        alive = [p.poll() is None for p in procs]
    finally:
        codes = [stop_worker(p) for p in procs]
    report = check(url)
    with psycopg.connect(url, autocommit=True) as conn:
        after: dict[int, int] = dict(
            conn.execute(
                "SELECT id, lease_token FROM pgqueue_jobs WHERE state = 'succeeded'"
            ).fetchall()
        )
    changed = sorted(i for i, token in committed.items() if after.get(i) != token)
    return {
        "parameters": {
            "jobs": jobs,
            "workers": workers,
            "concurrency_per_worker": 1,
            "restart_at_fraction": at,
            "worker_settings": WORKER_SETTINGS,
        },
        "at_restart": {
            "succeeded": before.get("succeeded", 0),
            "running": before.get("running", 0),
            "queued": before.get("queued", 0),
        },
        "jobs_succeeded": report.states.get("succeeded", 0),
        # Succeeded (committed) before the restart, and not exactly so after:
        # lost, or run again. Must be empty.
        "committed_before_restart_changed": changed,
        "handler_invocations": report.attempts,
        "delivery_rows": report.deliveries,
        "duplicate_deliveries": report.duplicate_deliveries,
        "failed_attempts": report.failed_attempts,
        "restart_command_seconds": round(restart_returned, 2),
        "accepting_connections_after_seconds": round(accepting, 2),
        "all_succeeded_after_seconds": round(all_done, 2),
        "wall_seconds": round(wall, 2),
        "workers_alive_throughout": all(alive),
        "worker_exit_codes": codes,
        "invariants": report.as_dict(),
    }


def _command_restart(command: str) -> tuple[Callable[[], None], str]:
    """A restart by the user's command (e.g. "docker restart pg"), and its description."""
    words = shlex.split(command)

    def restart() -> None:
        subprocess.run(words, check=True)

    return restart, f"restart command: {command}"


def _embedded_restart(server: EmbeddedPostgres, mode: StopMode) -> tuple[Callable[[], None], str]:
    """A restart of the embedded server (pg_ctl stop -m MODE, then start)."""
    return (
        lambda: server.restart(mode),
        f"pg_ctl stop -m {mode}, then start (EmbeddedPostgres.restart)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--at", type=float, default=0.3, help="fraction done at the restart")
    parser.add_argument("--mode", default="fast", choices=["fast", "immediate"])
    parser.add_argument("--restart-cmd", default=None, help="restart DATABASE_URL's server")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.restart_cmd:
            url = os.environ.get("DATABASE_URL", "")
            if not url:
                parser.error("--restart-cmd needs DATABASE_URL")
            reset_database(url)
            restart, how = _command_restart(args.restart_cmd)
        else:
            server = stack.enter_context(bench_server("restart"))
            url = server.url
            migrate(url)
            restart, how = _embedded_restart(server, args.mode)
        info = server_info(url)
        result = run(url, restart, jobs=args.jobs, workers=args.workers, at=args.at)
    result["parameters"]["restart"] = how
    record = ResultRecord.from_report("restart", command_line(__spec__, argv), info, result)
    path = write_result(record, args.out)
    print(
        f"restart: {result['jobs_succeeded']}/{args.jobs} succeeded; at the restart "
        f"{result['at_restart']}; invocations {result['handler_invocations']}, "
        f"deliveries {result['delivery_rows']}, failed attempts {result['failed_attempts']}; "
        f"accepting after {result['accepting_connections_after_seconds']} s, all done after "
        f"{result['all_succeeded_after_seconds']} s; "
        f"invariants {'ok' if result['invariants']['ok'] else 'BROKEN'} -> {path}"
    )
    ok = result["invariants"]["ok"] and not result["committed_before_restart_changed"]
    return 0 if ok and result["jobs_succeeded"] == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
