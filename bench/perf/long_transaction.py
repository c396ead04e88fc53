"""Worker throughput while a long transaction holds back vacuum, pgqueue and
PgQueuer in the same run.

    python -m bench.perf.long_transaction [--jobs 20000] [--rounds 10]
        [--no-pgqueuer] [--venv-dir DIR] [--page-cost N] [--out PATH]

A report, a pg_dump or a session left idle in a transaction keeps a snapshot
open; no vacuum may then remove a row version that snapshot might still
see. A queue makes such versions with every job it runs, and the index its
claim walks keeps an entry for each: every claim steps over the entries of
all the jobs run since the snapshot was taken.

Each system, in its own database, runs two sequences of drains, each as
bench.perf.outside_harness measures one (enqueue JOBS no-op jobs, VACUUM
ANALYZE, spawn 2 worker processes, clock to an empty queue), the jobs of
earlier drains left in place (no TRUNCATE between them: a queue that has
run for a while):

  * ``free``: a first drain on emptied tables, then ROUNDS drains;
  * ``held``: the same, but after the first drain a REPEATABLE READ
    transaction on the same database takes a snapshot and stays open for
    ROUNDS drains (as pg_dump's does); then it ends, and one more drain
    (``after``) shows what ending it gives back.

After each drain the queue table's dead row versions are recorded
(``n_dead_tup``): each drain leaves its own jobs' (PgQueuer's delete, or
pgqueue's claim and ack), and the VACUUM before the next removes them,
except under the snapshot, where they pile up (the proof that vacuum was
held back); and the snapshot's ``backend_xmin``. The ratio to read is a
held drain's rate over the free drain of the same round, per system.

Writes results/long_transaction.json.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.common import add_page_cost_option, bench_database, page_cost_options, summary
from bench.compare.compare import database_url, ensure_venv
from bench.perf.outside_harness import ROOT, pgqueue_drain, pgqueuer_drain
from bench.perf.worker_throughput import compile_workers
from bench.record import ResultRecord, command_line, server_info, write_result

PROCESSES = 2

# What the snapshot's holder runs: nothing that locks a queue table (a
# TRUNCATE or index build would wait on it), only what pins the snapshot.
HOLD = "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class"
DEAD_VERSIONS = "SELECT coalesce(max(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname = %s"
SNAPSHOT_XMIN = "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = %s"

Drain = Callable[[str, bool], float]


def dead_versions(url: str, table: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(DEAD_VERSIONS, (table,)).fetchone()
    return int(row[0]) if row else 0


def sequence(url: str, drain: Drain, table: str, rounds: int, hold: bool) -> dict[str, Any]:
    """A drain on emptied tables, then ``rounds`` drains keeping the jobs;
    with ``hold``, under a snapshot taken after the first drain, and one
    drain more once it has ended."""
    first = drain(url, False)
    rates: list[float] = []
    dead: list[int] = []
    holder = psycopg.connect(url, autocommit=True) if hold else None
    xmin = None
    try:
        if holder is not None:
            holder.execute(HOLD)
            row = holder.execute(SNAPSHOT_XMIN, (holder.info.backend_pid,)).fetchone()
            xmin = row[0] if row else None
        for _ in range(rounds):
            rates.append(drain(url, True))
            dead.append(dead_versions(url, table))
            print(f"  {'held' if hold else 'free'}: {rates[-1]:,.0f} jobs/s, dead {dead[-1]:,}")
    finally:
        if holder is not None:
            holder.close()
    result: dict[str, Any] = {"first": first, "rates": rates, "dead_versions_after_drain": dead}
    if hold:
        result["snapshot_xmin"] = xmin
        result["after"] = drain(url, True)
        print(f"  after the snapshot ended: {result['after']:,.0f} jobs/s")
    return result


def compare(free: dict[str, Any], held: dict[str, Any]) -> dict[str, Any]:
    ratios = [h / f for h, f in zip(held["rates"], free["rates"], strict=True)]
    return {
        "held_over_free_by_round": ratios,
        "last_round": ratios[-1],
        "held_last_over_first": held["rates"][-1] / held["first"],
        "after_over_first": held["after"] / held["first"],
        "rates": {"free": summary(free["rates"]), "held": summary(held["rates"])},
    }


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs a drain")
    parser.add_argument("--rounds", type=int, default=10, help="drains under the snapshot")
    parser.add_argument("--no-pgqueuer", action="store_true", help="pgqueue alone (smoke test)")
    parser.add_argument("--venv-dir", type=Path, default=ROOT / ".bench-venvs")
    add_page_cost_option(parser)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    systems: dict[str, tuple[Drain, str, str | None]] = {
        "pgqueue": (
            lambda url, keep: pgqueue_drain(url, args.jobs, PROCESSES, 100, keep=keep),
            "pgqueue_jobs",
            None,  # the benchmark's database, where pgqueue's schema is
        )
    }
    pgqueuer_version = None
    if not args.no_pgqueuer:
        python, pgqueuer_version = ensure_venv(args.venv_dir, "pgqueuer")
        if python is None:
            raise SystemExit(pgqueuer_version)
        venv_python = python

        def pgqueuer(url: str, keep: bool) -> float:
            return pgqueuer_drain(venv_python, url, args.jobs, PROCESSES, keep=keep)

        systems["pgqueuer"] = (
            pgqueuer,
            "pgqueuer",
            "bench_pgqueuer",
        )

    options = page_cost_options(args.page_cost)
    results: dict[str, Any] = {}
    compile_workers()
    with bench_database("long_transaction", options or None) as url:
        info = server_info(url)
        for system, (drain, table, database) in systems.items():
            own = url if database is None else database_url(url, database)
            print(f"{system}:", flush=True)
            free = sequence(own, drain, table, args.rounds, hold=False)
            held = sequence(own, drain, table, args.rounds, hold=True)
            results[system] = {"free": free, "held": held, "ratios": compare(free, held)}
    if "pgqueuer" in results:
        results["pgqueue_over_pgqueuer_held_by_round"] = [
            a / b
            for a, b in zip(
                results["pgqueue"]["held"]["rates"],
                results["pgqueuer"]["held"]["rates"],
                strict=True,
            )
        ]
    record = ResultRecord(
        name="long_transaction",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "jobs_a_drain": args.jobs,
            "rounds": args.rounds,
            "processes": PROCESSES,
            "pgqueuer": pgqueuer_version,
            "snapshot": HOLD,
            "clock": "wall, from the spawn of the worker processes to an empty queue",
            "server_options": options or None,
        },
        results=results,
    )
    path = write_result(record, args.out)
    print()
    for system in systems:
        ratios = results[system]["ratios"]
        print(
            f"{system}: held/free last round {ratios['last_round']:.2f}, "
            f"median {statistics.median(ratios['held_over_free_by_round']):.2f}; "
            f"after the snapshot / first {ratios['after_over_first']:.2f}"
        )
    print(f"written to {path}")
    return record


if __name__ == "__main__":
    main()
