"""Workers on three hosts and PostgreSQL on a fourth, in network namespaces
(tests/netns.py); one worker host is cut off mid-run.

The partitioned host keeps its sessions, which hang instead of failing, as
across a real partition: its leases run out, the other hosts reap and finish
its jobs, and when it comes back its late acks are refused by the fencing
token. The ledger (every enqueue acknowledged, every handler run recorded on
its own connection) shows that nothing was lost and explains every
duplicate."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness.fault_tasks import create_deliveries, stop_worker, worker_env
from harness.invariants import check
from pgqueue import Queue, Settings, migrate
from tests.netns import Network, network, postgres_on

pytestmark = pytest.mark.acceptance

WORKER_SETTINGS = {
    "lease_seconds": 3.0,
    "heartbeat_seconds": 1.0,
    "reap_interval_seconds": 0.5,
    "backoff_base_seconds": 0.05,
    "backoff_cap_seconds": 0.5,
    "poll_interval_seconds": 0.2,
    "shutdown_timeout_seconds": 5,
}


def _start_worker(net: Network, host: str, url: str, log: Path) -> subprocess.Popen[bytes]:
    command = ["--log-format", "json", "worker", "--handlers", "harness.fault_tasks:HANDLERS"]
    with open(log, "wb") as out:
        return subprocess.Popen(
            net.on(host, [sys.executable, "-m", "pgqueue", *command, "--concurrency", "20"]),
            cwd=Path(__file__).resolve().parents[2],
            env=worker_env(url, **WORKER_SETTINGS),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _held_by(conn: psycopg.Connection[Any], pid: int) -> set[int]:
    """Jobs running on the lease that the worker ``pid``'s handler started."""
    rows = conn.execute(
        "SELECT j.id FROM pgqueue_jobs j JOIN fault_deliveries d"
        " ON d.job_id = j.id AND d.token = j.lease_token"
        " WHERE j.state = 'running' AND d.worker_pid = %s",
        (pid,),
    ).fetchall()
    return {row[0] for row in rows}


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return value


@pytest.mark.timeout(240)
def test_a_partitioned_worker_host_loses_its_jobs_to_the_others_and_its_late_acks_are_refused(
    server_dir: Path,
) -> None:
    with network(["db", "w1", "w2", "w3"]) as net, postgres_on(net, "db", server_dir) as url:
        migrate(url)
        create_deliveries(url)
        with Queue(url, settings=Settings(database_url=url)) as queue:
            # Work of 1 s each: the cut-off host is surely holding some.
            enqueued = [
                job.id
                for job in queue.enqueue_many(
                    [{"task": "work", "payload": {"ms": 1000}, "max_attempts": 10}] * 240
                )
            ]
        logs = {host: server_dir.parent / f"{server_dir.name}-{host}.log" for host in net.hosts}
        workers = {host: _start_worker(net, host, url, logs[host]) for host in ("w1", "w2", "w3")}
        cut = workers["w1"].pid  # `ip netns exec` execs: the worker has its pid
        try:
            with psycopg.connect(url, autocommit=True) as watch:
                held = _wait(lambda: _held_by(watch, cut), 60, "w1 never held a job")
                net.partition("w1")
                # Its leases run out; the other hosts reap its jobs and finish them.
                _wait(
                    lambda: watch.execute(
                        "SELECT bool_and(state = 'succeeded') FROM pgqueue_jobs WHERE id = ANY(%s)",
                        (list(held),),
                    ).fetchone()[0],
                    60,
                    "the cut-off host's jobs were not finished elsewhere",
                )
                net.heal("w1")
                _wait(
                    lambda: watch.execute(
                        "SELECT count(*) = 0 FROM pgqueue_jobs WHERE state <> 'succeeded'"
                    ).fetchone()[0],
                    120,
                    "jobs left unfinished",
                )
                # Back on the network, w1 sends the acks it held: refused.
                _wait(lambda: _refused(logs["w1"]) >= held, 60, "w1's late acks were not refused")
                others = watch.execute(
                    "SELECT DISTINCT (result->>'pid')::int FROM pgqueue_jobs WHERE id = ANY(%s)",
                    (list(held),),
                ).fetchall()
        finally:
            codes = {host: stop_worker(proc) for host, proc in workers.items()}
        assert codes == {"w1": 0, "w2": 0, "w3": 0}, {h: logs[h].read_text()[-2000:] for h in codes}
        assert cut not in {row[0] for row in others}  # each result came from another host
        report = check(url, enqueued_ids=enqueued)
        report.assert_ok()
        assert report.states == {"succeeded": 240}
        assert report.duplicate_deliveries >= len(held)  # the cut-off runs, explained


def _refused(log: Path) -> set[int]:
    """Jobs whose outcome the worker found it could no longer write (its
    lease was taken over), from its JSON log lines."""
    refused = set()
    for text in log.read_text().splitlines():
        with_fields = text.startswith("{") and json.loads(text)
        if with_fields and with_fields.get("action") in ("lost", "discard"):
            refused.add(with_fields["job_id"])
    return refused
