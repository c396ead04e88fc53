"""Where a spawned worker's clocked time goes: start-up, then draining.

    python -m bench.perf.worker_startup [--jobs 20000] [--repeats 5] [--out PATH]

The outside harness's drain (bench.perf.outside_harness: load, VACUUM
ANALYZE, spawn, clock to an empty queue), with one more mark: the first job
that leaves ``queued``. From the spawn to it is the processes' start-up (the
interpreter, imports, connections, the schema check, the first claim); from
it to the empty queue is the drain. For 1 and 2 worker processes; medians.

And, from the rows (database clock), the drain's end: the tail (from the last
job's start to the last ack's commit), how long one process had nothing left
to start while another still had (its last start before the other's), and
the mean sizes of the claims and acks (a statement's rows share their
``started_at`` / ``finished_at``).

And where the CPU goes (Linux, the server on this host: each process's time
on a CPU from /proc/PID/schedstat): the worker processes' at the first mark
(their start-up) and at the empty queue, and the server's over the clocked
time (its processes then: the workers' backends, which live until the
workers stop, and the rest; a process that ended meanwhile is not
counted). None where the server's processes cannot be read.

Writes results/worker_startup.json.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psycopg

from bench.common import (
    LIVE_JOBS,
    bench_database,
    child_pids,
    clear,
    postmaster_pid,
    summary,
)
from bench.perf.worker_throughput import compile_workers, spawn_workers, stop_workers
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Queue, Settings

CONCURRENCY = 100


def _cpu_seconds(pid: int) -> float:
    """Seconds process ``pid`` has run on a CPU (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _server_cpu(postmaster: int | None) -> dict[int, float]:
    """The CPU seconds of the server's processes, by pid (none if unknown)."""
    if postmaster is None:
        return {}
    try:
        pids = [postmaster, *child_pids(postmaster)]
    except OSError:
        return {}
    return {pid: _cpu_seconds(pid) for pid in pids}


def _postmaster(conn: psycopg.Connection[Any]) -> int | None:
    """The server's main process, if it runs on this host."""
    try:
        return postmaster_pid(conn)
    except OSError:
        return None


def drain(url: str, jobs: int, processes: int) -> dict[str, float]:
    """One load, VACUUM ANALYZE and timed drain: start-up and drain seconds."""
    clear(url)
    with Queue(url, settings=Settings(database_url=url)) as queue:
        queue.enqueue_many([{"task": "noop"}] * jobs)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE pgqueue_jobs")
        conn.execute("CHECKPOINT")
        compile_workers()  # before the clock: an install compiles once
        postmaster = _postmaster(conn)
        server_before = _server_cpu(postmaster)
        started = time.monotonic()
        procs = spawn_workers(url, processes, "noop", CONCURRENCY, byte_compiled=False)
        first: float | None = None
        startup_cpu = 0.0
        try:
            while True:
                if first is None and _one_left_queued(conn):
                    first = time.monotonic() - started
                    startup_cpu = sum(_cpu_seconds(proc.pid) for proc in procs)
                if _empty(conn):
                    break
                time.sleep(0.005)
            total = time.monotonic() - started
            workers_cpu = sum(_cpu_seconds(proc.pid) for proc in procs)
            server_after = _server_cpu(postmaster)
        finally:
            stop_workers(procs)
    assert first is not None
    cpu = {
        "workers_startup_cpu_seconds": startup_cpu,
        "workers_cpu_seconds": workers_cpu,
        "server_cpu_seconds": sum(t - server_before.get(p, 0.0) for p, t in server_after.items()),
    }
    return {
        "startup_seconds": first,
        "drain_seconds": total - first,
        "clocked_jobs_per_second": jobs / total,
        "draining_jobs_per_second": jobs / (total - first),
        **(cpu if server_after else {}),
        **_drain_end(url),
    }


def _drain_end(url: str) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT count(*), count(DISTINCT started_at), count(DISTINCT finished_at),"
            " extract(epoch FROM max(started_at)), extract(epoch FROM max(finished_at))"
            " FROM pgqueue_jobs GROUP BY worker"
        ).fetchall()
    last_starts = [float(row[3]) for row in rows]
    return {
        "tail_seconds": max(float(row[4]) for row in rows) - max(last_starts),
        "idle_process_seconds": max(last_starts) - min(last_starts),
        "jobs_per_claim": sum(row[0] for row in rows) / sum(row[1] for row in rows),
        "jobs_per_ack": sum(row[0] for row in rows) / sum(row[2] for row in rows),
    }


def _one_left_queued(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT EXISTS (SELECT FROM pgqueue_jobs WHERE state <> 'queued')")
    found = row.fetchone()
    return bool(found and found[0])


def _empty(conn: psycopg.Connection[Any]) -> bool:
    found = conn.execute(f"SELECT NOT ({LIVE_JOBS})").fetchone()
    return bool(found and found[0])


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    cells: dict[str, dict[str, dict[str, float]]] = {}
    with bench_database("startup") as url:
        for processes in (1, 2):
            runs = [drain(url, args.jobs, processes) for _ in range(args.repeats)]
            cell = {metric: summary([run[metric] for run in runs]) for metric in runs[0]}
            cells[f"{processes}_process{'es' if processes > 1 else ''}"] = cell
            print(
                f"{processes} process(es): start-up {cell['startup_seconds']['median']:.3f} s, "
                f"draining {cell['draining_jobs_per_second']['median']:,.0f} jobs/s, "
                f"clocked {cell['clocked_jobs_per_second']['median']:,.0f} jobs/s, "
                f"tail {cell['tail_seconds']['median']:.3f} s, "
                f"claims of {cell['jobs_per_claim']['median']:,.0f} jobs",
                flush=True,
            )
            if "server_cpu_seconds" in cell:
                print(
                    f"  CPU: workers {cell['workers_cpu_seconds']['median']:.2f} s "
                    f"({cell['workers_startup_cpu_seconds']['median']:.2f} s of it by the "
                    f"first claim), server {cell['server_cpu_seconds']['median']:.2f} s",
                    flush=True,
                )
        server = server_info(url)
    record = ResultRecord(
        name="worker_startup",
        command=command_line(__spec__, argv),
        server=server,
        parameters={**vars(args), "concurrency": CONCURRENCY},
        results={"cells": cells},
    )
    path = write_result(record, args.out)
    print(f"-> {path}")
    return record


if __name__ == "__main__":
    main()
