"""PostgreSQL failover under continuous load, with Patroni and etcd.

    python -m bench.faults.failover [--rounds 2] [--replication sync,async]
                                    [--modes kill,partition] [--out PATH]

For each replication mode, a fresh cluster (tests/ha.py: two PostgreSQL 18
nodes under Patroni, etcd, each node a host in a network namespace; needs
root, Debian's etcd-server and the dev extra's Patroni) and the load of
harness/failover.py, which runs throughout: producers through the library
(sync and async) and over HTTP (``pgqueue api``), 4 ``pgqueue worker``
processes, all on the multi-host URL with pgqueue's default settings. Then,
ROUNDS times for each mode, a fault of the primary:

- kill: SIGKILL of its postmaster (Patroni fails over at once:
  ``primary_start_timeout`` 0);
- partition: its host's link taken down; Patroni demotes it when its leader
  key runs out (``ttl`` 20 s) and promotes the standby; the link comes back
  once the new primary is up, and the old one rejoins (pg_rewind).

Each fault is followed by 15 s of load and a wait for the cluster to be
whole again. Reported per fault: the write outage (the longest time without
an acknowledged enqueue), the time until completions/s are back to 90 % of
their rate before; per cluster: acknowledged enqueues missing and
acknowledged completions reverted (each counted against the first fault
after it was acknowledged), jobs left unfinished, the HTTP answers and the
invariants of harness.invariants.

Writes results/failover.json.
"""

from __future__ import annotations

import argparse
import bisect
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.record import ResultRecord, command_line, server_info, write_result
from harness.failover import WORKER_SETTINGS, FailoverLoad
from harness.invariants import check
from tests.ha import DCS_TIMINGS, Cluster, ha_cluster

AFTER_SECONDS = 15.0


def _fault(cluster: Cluster, mode: str) -> dict[str, Any]:
    """One fault of the primary; returns when the other node is primary."""
    cluster.wait_healthy()
    at = time.time()
    old = cluster.kill_primary() if mode == "kill" else cluster.partition_primary()
    while cluster.primary() in (None, old):
        if time.time() - at > 120:
            raise TimeoutError(f"no failover after {mode}: {cluster.log(cluster.other(old))}")
        time.sleep(0.1)
    promoted = time.time() - at
    if mode == "partition":
        cluster.heal(old)
    return {"mode": mode, "at": at, "promoted_after_s": round(promoted, 2)}


def run_cluster(
    synchronous: bool,
    modes: list[str],
    rounds: int,
    logs: Path,
    api_settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One cluster under load, ``rounds`` faults of each mode; the figures."""
    faults: list[dict[str, Any]] = []
    plan = [mode for mode in modes for _ in range(rounds)]
    with ha_cluster(synchronous=synchronous) as cluster:
        load = FailoverLoad(cluster.url, logs, api_settings=api_settings)
        with load.running():
            load.warm()
            server = server_info(cluster.url)
            for n, mode in enumerate(plan, start=1):
                faults.append(_fault(cluster, mode))
                time.sleep(AFTER_SECONDS)
                if n < len(plan):
                    cluster.wait_healthy()
                    load.warm()  # the next fault's baseline
            load.settle()
        report = check(cluster.url, enqueued_ids=list(load.ledger.acked))
        ends = [f["at"] for f in faults[1:]] + [math.inf]
        verdicts = [load.verdict(f["at"], end) for f, end in zip(faults, ends, strict=True)]
    times = [f["at"] for f in faults]
    for fault, verdict in zip(faults, verdicts, strict=True):
        fault["write_outage_s"] = round(verdict.write_outage_s, 2)
        fault["recovery_to_90pct_s"] = (
            None if verdict.recovery_s is None else round(verdict.recovery_s, 2)
        )
    overall = verdicts[-1]
    # Each loss is counted against the first fault after it was acknowledged.
    for fault in faults:
        fault["missing"] = fault["reverted"] = 0
    for job_id in overall.missing:
        faults[min(bisect.bisect(times, load.ledger.acked[job_id]), len(faults) - 1)][
            "missing"
        ] += 1
    for job_id in overall.reverted:
        faults[min(bisect.bisect(times, load.ledger.seen_at[job_id]), len(faults) - 1)][
            "reverted"
        ] += 1
    for fault in faults:
        fault.pop("at")
    return {
        "replication": "sync" if synchronous else "async",
        "server": server,
        "faults": faults,
        "by_mode": {mode: _summary([f for f in faults if f["mode"] == mode]) for mode in modes},
        "enqueued": overall.enqueued,
        "completions_seen": len(load.ledger.completed),
        "missing": len(overall.missing),
        "reverted": len(overall.reverted),
        "unfinished": overall.unfinished,
        "http": overall.http,
        "http_503_without_retry_after": load.ledger.http_without_retry_after,
        "refused": overall.refused,
        "written_though_refused": len(overall.written_though_refused),
        "standby_lag": _lag(load.ledger.lag_bytes, load.ledger.lag_ms),
        "invariants": report.as_dict(),
        "exit_codes": load.worker_codes(),  # the API's, then the workers'
    }


def _lag(lag_bytes: list[int], lag_ms: list[float]) -> dict[str, Any]:
    """The standby's lag under the load, as sampled on the primary (the
    window an asynchronous failover loses)."""

    def spread(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        ordered = sorted(values)
        return {
            "p50": round(ordered[len(ordered) // 2], 2),
            "p99": round(ordered[int(len(ordered) * 0.99)], 2),
            "max": round(ordered[-1], 2),
        }

    return {
        "samples": len(lag_bytes),
        "wal_bytes": spread([float(b) for b in lag_bytes]),
        "flush_ms": spread(lag_ms),
    }


def _summary(faults: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str) -> float | None:
        values = [f[key] for f in faults if f[key] is not None]
        return round(statistics.median(values), 2) if values else None

    return {
        "faults": len(faults),
        "promoted_after_s": median("promoted_after_s"),
        "write_outage_s": median("write_outage_s"),
        "write_outage_max_s": max(f["write_outage_s"] for f in faults),
        "recovery_to_90pct_s": median("recovery_to_90pct_s"),
        "missing": sum(f["missing"] for f in faults),
        "reverted": sum(f["reverted"] for f in faults),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="faults per mode and replication")
    parser.add_argument("--replication", default="sync,async")
    parser.add_argument("--modes", default="kill,partition")
    parser.add_argument("--logs", default="/tmp/pgqueue-failover-logs")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not set(modes) <= {"kill", "partition"}:
        parser.error("--modes: kill, partition")
    runs = [
        run_cluster(kind == "sync", modes, args.rounds, Path(args.logs) / kind)
        for kind in args.replication.split(",")
    ]
    record = ResultRecord(
        name="failover",
        command=command_line(__spec__, argv),
        server=runs[0]["server"],
        parameters={
            "rounds": args.rounds,
            "modes": modes,
            "patroni": DCS_TIMINGS | {"primary_start_timeout": 0},
            "worker_settings": WORKER_SETTINGS,
            "after_fault_s": AFTER_SECONDS,
        },
        results={run["replication"]: run for run in runs},
    )
    path = write_result(record, args.out)
    for run in runs:
        print(f"{run['replication']}: {run['by_mode']}; missing {run['missing']}, ", end="")
        print(f"reverted {run['reverted']}, unfinished {run['unfinished']}, http {run['http']}")
    print(f"-> {path}")
    sync = next((r for r in runs if r["replication"] == "sync"), None)
    return 1 if sync and (sync["missing"] or sync["reverted"] or sync["unfinished"]) else 0


if __name__ == "__main__":
    sys.exit(main())
