"""Crash test: worker processes SIGKILLed mid-job, and nothing is lost.

    python -m bench.faults.crash [--jobs 1000] [--workers 6] [--kill-every 0.3] [--seed 1]
                                 [--log-dir DIR] [--out PATH] [--workflow]

A fresh server on disk with default durability (fsync and synchronous_commit
on; or DATABASE_URL). JOBS jobs are enqueued, then WORKERS worker processes
(``pgqueue worker``, concurrency 1) run the fault handlers
(``harness.fault_tasks``): each run inserts a delivery row on its own
connection, then works 10-50 ms. Every KILL_EVERY
seconds a random worker gets SIGKILL and a new one is started in its place,
until every job has succeeded. Replacements are spares started ahead of
time, already imported (a cold start costs about a second of CPU on a
2-core machine, longer than the kill interval). Leases are short (1 s, heartbeat 0.3 s, reaper
every 0.5 s) so that killed workers' jobs come back quickly.

Only workers that have started a handler at least once are killed (a
worker still importing is not mid-job). Just before each kill, the jobs the
victim holds are counted: running jobs whose current lease token its
handler has delivered (the delivery rows name the worker's pid). A worker
can finish or claim a job between that query and the kill, so "holding a
job" is close to, not exactly, the number of interrupted attempts. The expired leases are the
failed attempts (the handler never raises here, so every failure is a lease
the reaper took back).

With --workflow, the jobs are one workflow (a first job, a fan-out of
chains of two, a fan-in over them): no step may start before every job it
depends on has succeeded (checked from the delivery times), and the fan-in
must receive every result.

Writes results/crash.json.
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, LiteralString

import psycopg

from bench.common import bench_database
from bench.record import ResultRecord, command_line, server_info, write_result
from harness.fault_tasks import create_deliveries, release, scalar, spawn_worker, stop_worker
from harness.invariants import check, dependency_violations
from pgqueue import Queue, Settings, chain, group
from pgqueue.core.workflows import Chain

WORKER_SETTINGS: dict[str, Any] = {
    "lease_seconds": 1.0,
    "heartbeat_seconds": 0.3,
    "reap_interval_seconds": 0.5,
    "backoff_base_seconds": 0.05,
    "backoff_cap_seconds": 0.5,
    "poll_interval_seconds": 0.2,
    "shutdown_timeout_seconds": 5,
}
MAX_ATTEMPTS = 10
# Replacement workers kept imported and waiting (see harness.fault_tasks.spawn_worker).
SPARES = 3


def _step(n: int) -> dict[str, Any]:
    return {"task": "work", "payload": {"n": n}, "max_attempts": MAX_ATTEMPTS}


def _workflow(jobs: int) -> Chain:
    """``jobs`` jobs (an even number, 4 or more) as one workflow: a first job,
    then chains of two side by side (fan-out), then one job that waits for
    the end of every chain (fan-in)."""
    pairs = (jobs - 2) // 2
    if jobs < 4 or jobs % 2:
        raise ValueError(
            f"a workflow of the crash test has an even number of jobs (4+), not {jobs}"
        )
    middle = group(*(chain(_step(2 * i + 1), _step(2 * i + 2)) for i in range(pairs)))
    return chain(_step(0), middle, _step(jobs - 1))


def _workflow_report(url: str, fan_in: int) -> dict[str, Any]:
    """Whether any step started before a job it depends on had succeeded,
    and which results the fan-in received (the job ids its parents' results
    name), against the jobs it depends on."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT depends_on, result FROM pgqueue_jobs WHERE id = %s", [fan_in]
        ).fetchone()
    assert row is not None
    depends_on, result = row
    return {
        "dependency_violations": dependency_violations(url),
        "fan_in_parents": len(depends_on),
        "fan_in_received_every_result": (result or {}).get("parents") == depends_on,
    }


def _count(conn: psycopg.Connection[Any], query: LiteralString) -> int:
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def _holding(conn: psycopg.Connection[Any]) -> dict[int, int]:
    """Per worker pid whose handler has run at least once: the jobs it holds
    now (running, on the lease its handler was delivered)."""
    rows = conn.execute(
        "SELECT d.worker_pid,"
        " count(*) FILTER (WHERE j.state = 'running' AND j.lease_token = d.token)"
        " FROM fault_deliveries d JOIN pgqueue_jobs j ON j.id = d.job_id GROUP BY 1"
    ).fetchall()
    return {pid: n for pid, n in rows}


def run(
    url: str,
    *,
    jobs: int = 1000,
    workers: int = 6,
    kill_every: float = 0.3,
    max_kills: int | None = None,
    target: str = "random",
    seed: int = 1,
    timeout: float = 300.0,
    log_dir: str | None = None,
    workflow: bool = False,
) -> dict[str, Any]:
    """Run the crash test on the database at ``url`` (migrated, empty).

    ``target``: "random" kills any worker; "busy" picks among the workers
    holding a job when there are any (the pytest version, so that its few
    kills surely interrupt jobs). ``max_kills``: stop killing after this many
    (None: until every job has succeeded). ``workflow``: the jobs are one
    workflow (``_workflow``) instead of independent jobs.
    """
    rng = random.Random(seed)
    create_deliveries(url)
    with Queue(url, settings=Settings(database_url=url)) as q:
        if workflow:
            fan_in = q.enqueue_workflow(_workflow(jobs)).jobs[-1].id
        else:
            q.enqueue_many([_step(i) for i in range(jobs)])
    logs: list[Any] = []

    def spawn() -> subprocess.Popen[bytes]:
        log: Any = subprocess.DEVNULL
        if log_dir:
            log = open(Path(log_dir) / f"crash-worker-{len(logs)}.log", "wb")  # noqa: SIM115
            logs.append(log)
        return spawn_worker(url, concurrency=1, log=log, warm=True, **WORKER_SETTINGS)

    spares = [spawn() for _ in range(SPARES)]

    def start() -> subprocess.Popen[bytes]:
        """A warm spare starts working; a new spare starts importing."""
        proc = spares.pop(0)
        spares.append(spawn())
        release(proc)
        return proc

    procs = [spawn() for _ in range(workers)]
    for proc in procs:
        release(proc)
    kills: list[dict[str, Any]] = []
    started = time.monotonic()
    conn = psycopg.connect(url, autocommit=True)
    try:
        # Kill from the first claim on, not while the workers are still importing.
        while _count(conn, "SELECT count(*) FROM pgqueue_jobs WHERE attempts > 0") == 0:
            if time.monotonic() - started > 60:
                raise TimeoutError("no worker claimed anything within 60 s")
            time.sleep(0.02)
        first_claim = time.monotonic()
        next_kill = first_claim + kill_every
        while True:
            left = _count(conn, "SELECT count(*) FROM pgqueue_jobs WHERE state <> 'succeeded'")
            if left == 0:
                break
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{left} jobs not done after {timeout} s")
            if (max_kills is None or len(kills) < max_kills) and time.monotonic() >= next_kill:
                next_kill += kill_every
                holding = _holding(conn)
                # Only workers that have run a job: killing one still importing proves nothing.
                working = [i for i, p in enumerate(procs) if p.pid in holding]
                if not working:
                    continue
                busy = [i for i in working if holding[procs[i].pid] > 0]
                victim = rng.choice(busy if target == "busy" and busy else working)
                proc = procs[victim]
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills.append(
                    {
                        "at": round(time.monotonic() - first_claim, 2),
                        "pid": proc.pid,
                        "holding": holding[proc.pid],
                    }
                )
                procs[victim] = start()
            time.sleep(0.02)
        wall = time.monotonic() - first_claim
    finally:
        conn.close()
        codes = [stop_worker(p) for p in procs]
        for spare in spares:
            stop_worker(spare)
        for log in logs:
            log.close()
    report = check(url)
    never = scalar(
        url,
        "SELECT count(*) FROM pgqueue_jobs j WHERE NOT EXISTS"
        " (SELECT 1 FROM fault_deliveries d WHERE d.job_id = j.id)",
    )
    other_failures = scalar(
        url,
        "SELECT count(*) FROM pgqueue_jobs WHERE last_error IS NOT NULL"
        " AND last_error NOT LIKE 'lease expired%%'",
    )
    ordered = _workflow_report(url, fan_in) if workflow else {}
    return {
        **ordered,
        "parameters": {
            "jobs": jobs,
            "workflow": workflow,
            "workers": workers,
            "concurrency_per_worker": 1,
            "kill_every_seconds": kill_every,
            "max_kills": max_kills,
            "target": target,
            "seed": seed,
            "max_attempts": MAX_ATTEMPTS,
            "worker_settings": WORKER_SETTINGS,
        },
        "jobs_succeeded": report.states.get("succeeded", 0),
        "jobs_never_delivered": never,
        "duplicate_deliveries": report.duplicate_deliveries,
        "max_deliveries_per_job": report.max_deliveries_per_job,
        "expired_leases": report.failed_attempts,
        "failures_other_than_lease_expiry": other_failures,
        "workers_killed": len(kills),
        "killed_while_holding_a_job": sum(1 for k in kills if k["holding"] > 0),
        "wall_seconds": round(wall, 2),
        "final_worker_exit_codes": codes,
        "kills": kills,
        "invariants": report.as_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--kill-every", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--workflow", action="store_true", help="the jobs as one workflow")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    with bench_database("crash") as url:
        server = server_info(url)
        result = run(
            url,
            jobs=args.jobs,
            workers=args.workers,
            kill_every=args.kill_every,
            seed=args.seed,
            log_dir=args.log_dir,
            workflow=args.workflow,
        )
    record = ResultRecord.from_report("crash", command_line(__spec__, argv), server, result)
    path = write_result(record, args.out)
    print(
        f"crash: {result['jobs_succeeded']}/{args.jobs} succeeded, "
        f"never delivered {result['jobs_never_delivered']}, "
        f"duplicates {result['duplicate_deliveries']}, max {result['max_deliveries_per_job']}, "
        f"expired leases {result['expired_leases']}, killed {result['workers_killed']} "
        f"({result['killed_while_holding_a_job']} holding), {result['wall_seconds']} s, "
        f"invariants {'ok' if result['invariants']['ok'] else 'BROKEN'} -> {path}"
    )
    ok = result["invariants"]["ok"] and result["jobs_never_delivered"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
