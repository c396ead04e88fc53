"""Enqueue-to-start latency under load: an open-loop producer at 25 %, 50 % and
80 % of the worker's measured capacity.

    python -m bench.perf.latency_load [--seconds 10] [--loads 0.25,0.5,0.8 | --rates R,...]
                                      [--configs noop,io_10ms] [--capacity-jobs 20000]
                                      [--producers 4] [--repeats 3] [--statements]
                                      [--cold-wal] [--out PATH]

On a fresh server on disk (fsync and synchronous_commit on), its WAL warmed
first (bench.common.warm_wal: the segments a server under steady load
recycles; a fresh one creates each on first use and stalls the commits
behind it; ``--cold-wal`` skips this, to see the difference, and on a
server of DATABASE_URL, which it would check-point), for each
configuration (one forked ``AsyncWorker`` process, as bench.workers runs it):

* ``noop``: no-op jobs, the default worker (concurrency 100);
* ``io_10ms``: jobs that ``await asyncio.sleep(0.01)`` (10 ms of I/O), the
  worker at concurrency 1,000.

1. Capacity: ``--capacity-jobs`` jobs pre-loaded and drained (bench.workers
   ``drain``, as perf.worker_throughput measures it): jobs / (last finish -
   first start), database clock.
2. For each load L: a fresh worker, connected; then ``bench.producer``
   enqueues L x capacity jobs/s for ``--seconds`` on a fixed schedule (a
   batch every 10 ms over 4 connections; open loop: a batch that starts late
   is sent at once, the schedule is not shifted, and the result says whether
   the producer kept up); then the backlog drains.
   Latency = started_at - run_at of each job (database clock: run_at is the
   enqueue transaction's now(), so it includes the producer's COPY and
   commit; started_at is the claim's). Completion rate = jobs / (last finish
   - first start), database clock. And second by second (of run_at): how
   many seconds had a median latency over 25 ms (a stall, or the whole
   level?); and p50/p99 of the jobs enqueued after the level's first
   second ("steady"): each level starts a fresh worker, whose first claims
   and acks on new connections are several times slower, so a backlog
   forms in its first few hundred ms and its wait is the whole level's p99.

``--rates`` offers those jobs/s instead of fractions of the capacity (the
same offer on both sides of an A/B comparison).

Four more configurations are diagnoses (``--configs noop,io_10ms,NAME``), the
``noop`` one with one thing changed (see docs/results.md):

* ``noop_analyzed``: ANALYZE of the jobs table every 0.5 s during each
  level, so that the planner knows how many jobs are queued when it plans
  the claim;
* ``noop_quiet_acks``: ``notify_finished`` off, so that the worker's acks
  send no NOTIFY and do not queue, with the producer's commits, for
  PostgreSQL's one notification lock (held from before each such commit
  until after its WAL flush); since migration 0015 an ack notifies only
  the jobs someone waits for, so this changes nothing here;
* ``noop_naptime_2s`` and ``noop_naptime_10s``: the server's
  ``autovacuum_naptime`` at 2 s or 10 s instead of PostgreSQL's default of a
  minute. Each claimed job leaves a dead entry at the head of the claim
  index until a vacuum, and every claim walks them all: between two vacuums
  a minute apart the walk grows with every job claimed; vacuums more often
  cost CPU of their own. Run them with ``--seconds 60``, a level that long.

``--statements`` loads pg_stat_statements into the server and adds, per
level, the buffers a claim read and its execution time (the walk past the
dead entries shows there first).

Rounds are interleaved (each round measures its own capacity); the tables
give the median of the rounds. Goal (issue 13): p99 < 25 ms at 50 % load
for no-op jobs.

Writes results/latency_load.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.common import (
    STATEMENT_HEADS,
    bench_database,
    clear,
    rate,
    start_latency_percentiles,
    summary,
    warm_wal,
)
from bench.producer import open_loop
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import async_workers, drain, wait_connected, wait_drained
from pgqueue import Settings

GOAL_P99_MS = 25.0
GOAL_LOAD = 0.5
PERCENTILES = ("p50_ms", "p95_ms", "p99_ms", "max_ms")
# Also given as medians over the rounds.
MEDIANS = (
    "completion_per_second",
    "achieved_per_second",
    "enqueue_p50_ms",
    "enqueue_p99_ms",
    "load_average_1m",
    "seconds_median_over_25_ms",
    "steady_p50_ms",
    "steady_p99_ms",
    "jobs_per_claim",
)


@dataclass(frozen=True)
class Config:
    task: str  # a bench.workers.HANDLERS name
    concurrency: int
    label: str
    # A diagnosis: ANALYZE the jobs table this often during each level (0:
    # never, as in production, where autovacuum decides when).
    analyze_seconds: float = 0.0
    # Also a diagnosis: off, an ack's commit sends no NOTIFY (for wait()),
    # so it does not queue for PostgreSQL's one notification lock.
    notify_finished: bool = True
    # Also a diagnosis: the server's autovacuum_naptime during each level
    # (None: the server's own, PostgreSQL's default of a minute).
    naptime: str | None = None


CONFIGS = {
    "noop": Config(
        "noop",
        Settings().concurrency,
        f"no-op jobs, default worker (concurrency {Settings().concurrency})",
    ),
    "io_10ms": Config("io_10ms", 1000, "10 ms async I/O jobs, concurrency 1,000"),
    "noop_analyzed": Config(
        "noop",
        Settings().concurrency,
        "no-op jobs, default worker, ANALYZE every 0.5 s (diagnosis)",
        analyze_seconds=0.5,
    ),
    "noop_quiet_acks": Config(
        "noop",
        Settings().concurrency,
        "no-op jobs, default worker, notify_finished off (diagnosis)",
        notify_finished=False,
    ),
    "noop_naptime_2s": Config(
        "noop",
        Settings().concurrency,
        "no-op jobs, default worker, autovacuum_naptime 2 s (diagnosis)",
        naptime="2s",
    ),
    "noop_naptime_10s": Config(
        "noop",
        Settings().concurrency,
        "no-op jobs, default worker, autovacuum_naptime 10 s (diagnosis)",
        naptime="10s",
    ),
}
DEFAULT_CONFIGS = ["noop", "io_10ms"]


@contextlib.contextmanager
def analyzing(url: str, every: float) -> Iterator[None]:
    """ANALYZE pgqueue_jobs every ``every`` seconds while the block runs
    (0: never), so that the planner knows how many jobs are queued."""
    if not every:
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.wait(every):
                conn.execute("ANALYZE pgqueue_jobs")

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def naptime(url: str, value: str | None) -> Iterator[None]:
    """The server's autovacuum_naptime set to ``value`` while the block runs
    (None: left alone)."""
    if value is None:
        yield
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET autovacuum_naptime = '{value}'")
        conn.execute("SELECT pg_reload_conf()")
        try:
            yield
        finally:
            conn.execute("ALTER SYSTEM RESET autovacuum_naptime")
            conn.execute("SELECT pg_reload_conf()")


AUTOVACUUMS_QUERY = (
    "SELECT autovacuum_count, total_autovacuum_time FROM pg_stat_user_tables "
    "WHERE relname = 'pgqueue_jobs'"
)


def autovacuums(url: str) -> tuple[int, float]:
    """How many times autovacuum has vacuumed the jobs table, and for how
    many seconds in all (as far as the statistics, flushed about once a
    second, know)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(AUTOVACUUMS_QUERY).fetchone()
    return (int(row[0]), float(row[1]) / 1000) if row else (0, 0.0)


def vacuumed(url: str, vacuums: int, seconds: float) -> dict[str, Any]:
    """The autovacuums of the jobs table since ``autovacuums`` read
    ``vacuums`` and ``seconds``: how many, and their time in all."""
    now, now_seconds = autovacuums(url)
    return {"autovacuums": now - vacuums, "autovacuum_seconds": round(now_seconds - seconds, 3)}


# The claim statement's work in a level (``--statements``): what it read, and
# its execution time, per claim.
CLAIM_STATEMENTS_QUERY = """
SELECT sum(calls)::float8, sum(shared_blks_hit + shared_blks_read)::float8, sum(total_exec_time)
FROM pg_stat_statements WHERE toplevel AND query LIKE ANY(%s)
"""


@contextlib.contextmanager
def claim_statements(url: str, enabled: bool) -> Iterator[dict[str, float]]:
    """While the block runs, count the claims' buffers and execution time
    (pg_stat_statements); the dict is filled when it ends (empty: off)."""
    found: dict[str, float] = {}
    if not enabled:
        yield found
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
        yield found
        heads = [f"{head}%" for head in STATEMENT_HEADS["claim"]]
        row = conn.execute(CLAIM_STATEMENTS_QUERY, [heads]).fetchone()
    calls, buffers, ms = row if row and row[0] else (0, 0, 0.0)
    found["claim_buffers_per_claim"] = round(float(buffers) / max(1, calls), 1)
    found["claim_ms_per_claim"] = round(float(ms) / max(1, calls), 3)


# Every job of a claim has the claim's now() as its started_at.
CLAIMS_QUERY = "SELECT count(DISTINCT started_at) FROM pgqueue_jobs WHERE state = 'succeeded'"


def jobs_per_claim(url: str, jobs: int) -> float:
    """How many jobs a claim statement took, on average over the level."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(CLAIMS_QUERY).fetchone()
    return round(jobs / row[0], 1) if row and row[0] else 0.0


PER_SECOND_QUERY = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - run_at))
       * 1000
FROM pgqueue_jobs WHERE state = 'succeeded'
GROUP BY date_trunc('second', run_at)
"""


def slow_seconds(url: str) -> dict[str, Any]:
    """Second by second of enqueue (run_at): how many seconds had a median
    start latency over the goal's 25 ms, and the worst second's median. A
    p99 over a whole level is the worst stall of its window; this says
    whether that was one stall or the whole level."""
    with psycopg.connect(url, autocommit=True) as conn:
        medians = [row[0] for row in conn.execute(PER_SECOND_QUERY).fetchall()]
    return {
        "seconds": len(medians),
        "seconds_median_over_25_ms": sum(m > GOAL_P99_MS for m in medians),
        "worst_second_median_ms": round(max(medians), 2),
    }


STEADY_QUERY = """
SELECT percentile_cont(ARRAY[0.5, 0.99])
       WITHIN GROUP (ORDER BY extract(epoch FROM started_at - run_at) * 1000)
FROM pgqueue_jobs
WHERE state = 'succeeded'
  AND run_at >= (SELECT min(run_at) FROM pgqueue_jobs) + make_interval(secs => %s)
"""


def steady(url: str, warm_up_seconds: float) -> dict[str, float]:
    """p50 and p99 of the jobs enqueued after the level's warm-up, when the
    fresh worker's start is behind it."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(STEADY_QUERY, [warm_up_seconds]).fetchone()
    assert row is not None and row[0] is not None
    p50, p99 = row[0]
    return {"steady_p50_ms": round(p50, 2), "steady_p99_ms": round(p99, 2)}


def level(url: str, config: Config, per_second: float, args: argparse.Namespace) -> dict[str, Any]:
    """One load level against a fresh worker: the latency percentiles, the
    completion rate and what the producer achieved."""
    clear(url)
    settings = Settings(
        database_url=url,
        concurrency=config.concurrency,
        notify_finished=config.notify_finished,
    )
    vacuums, vacuum_seconds = autovacuums(url)
    with (
        claim_statements(url, args.statements) as claims,
        naptime(url, config.naptime),
        async_workers(1, settings, name=f"load-{config.task}", task=config.task) as procs,
        analyzing(url, config.analyze_seconds),
    ):
        wait_connected(url, 1)
        production = open_loop(url, config.task, per_second, args.seconds, producers=args.producers)
        load_average = os.getloadavg()[0]
        wait_drained(url, production.jobs, procs)
    return {
        **vacuumed(url, vacuums, vacuum_seconds),
        **claims,
        "jobs_per_claim": jobs_per_claim(url, production.jobs),
        **start_latency_percentiles(url, production.jobs),
        "completion_per_second": rate(url, production.jobs),
        **production.as_dict(),
        **slow_seconds(url),
        # A second, or half of a shorter level (the smoke test's).
        **steady(url, min(1.0, args.seconds / 2)),
        "load_average_1m": round(load_average, 2),
    }


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    names = [x for x in text.split(",") if x.strip()]
    unknown = set(names) - set(CONFIGS)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {', '.join(sorted(unknown))}; pick from {', '.join(CONFIGS)}"
        )
    return names


def measure(args: argparse.Namespace, url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every round: each configuration's capacity, then its load levels."""
    capacity: dict[str, list[float]] = {name: [] for name in args.configs}
    levels = args.rates or args.loads
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {str(level): [] for level in levels} for name in args.configs
    }
    started = time.monotonic()
    for repeat in range(args.repeats):
        for name in args.configs:
            config = CONFIGS[name]
            cap = drain(url, args.capacity_jobs, concurrency=config.concurrency, task=config.task)
            capacity[name].append(cap)
            print(f"round {repeat + 1} {name}: capacity {cap:,.0f} jobs/s", flush=True)
            for value in levels:
                per_second = value if args.rates else value * cap
                r = level(url, config, per_second, args)
                runs[name][str(value)].append(
                    r | {"load": per_second / cap, "capacity_per_second": cap}
                )
                print(
                    f"round {repeat + 1} {name} {per_second / cap:.0%}: "
                    f"{r['achieved_per_second']:,.0f}/s "
                    f"({'kept up' if r['producer_kept_up'] else 'PRODUCER BEHIND'}), "
                    f"p50 {r['p50_ms']:.1f} p95 {r['p95_ms']:.1f} p99 {r['p99_ms']:.1f} "
                    f"max {r['max_ms']:.1f} ms, steady p99 {r['steady_p99_ms']:.1f} "
                    f"(enqueue p50 {r['enqueue_p50_ms']:.1f} p99 {r['enqueue_p99_ms']:.1f}), "
                    f"completed {r['completion_per_second']:,.0f}/s, "
                    f"{r['jobs_per_claim']:,.0f} jobs a claim "
                    f"[{time.monotonic() - started:,.0f} s]",
                    flush=True,
                )
    return capacity, runs


def tables(
    capacity: dict[str, list[float]], runs: dict[str, dict[str, list[dict[str, Any]]]]
) -> dict[str, Any]:
    """Medians over the rounds, per configuration and load level."""

    def cell(rounds: list[dict[str, Any]]) -> dict[str, Any]:
        keys = (*PERCENTILES, *MEDIANS)
        return {
            **{k: statistics.median(r[k] for r in rounds) for k in keys},
            "producer_kept_up": all(r["producer_kept_up"] for r in rounds),
            "runs": rounds,
        }

    levels = {name: {load: cell(r) for load, r in per.items()} for name, per in runs.items()}
    result: dict[str, Any] = {
        "capacity_jobs_per_second": {k: summary(v) | {"runs": v} for k, v in capacity.items()},
        "levels": levels,
    }
    at_goal = levels.get("noop", {}).get(str(GOAL_LOAD))
    if at_goal is not None:
        result["goal"] = {
            "p99_ms_noop_at_50_percent": at_goal["p99_ms"],
            "target_ms": GOAL_P99_MS,
            "met": at_goal["p99_ms"] < GOAL_P99_MS,
            "met_in_rounds": sum(r["p99_ms"] < GOAL_P99_MS for r in at_goal["runs"]),
            "rounds": len(at_goal["runs"]),
        }
    return result


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="production per level")
    parser.add_argument("--loads", type=_floats, default=[0.25, 0.5, 0.8])
    parser.add_argument(
        "--rates",
        type=_floats,
        default=None,
        help="jobs/s to offer instead of --loads (the same offer on both sides of an A/B)",
    )
    parser.add_argument("--configs", type=_names, default=DEFAULT_CONFIGS)
    parser.add_argument("--capacity-jobs", type=int, default=20_000)
    parser.add_argument("--producers", type=int, default=4, help="producer connections")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--statements",
        action="store_true",
        help="with pg_stat_statements: each level's buffers and time per claim",
    )
    parser.add_argument(
        "--cold-wal",
        action="store_true",
        help="skip the WAL warm-up: the server creates its WAL segments during the levels",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    started = time.monotonic()
    options = {"shared_preload_libraries": "pg_stat_statements"} if args.statements else None
    with bench_database("latency-load", options) as url:
        if args.statements:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        info = server_info(url)
        warmed = 0 if args.cold_wal else warm_wal(url)
        capacity, runs = measure(args, url)
    results = tables(capacity, runs) | {"elapsed_seconds": time.monotonic() - started}
    record = ResultRecord(
        name="latency_load",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "seconds_per_level": args.seconds,
            "loads": args.loads,
            "rates": args.rates,
            "configs": {name: vars(CONFIGS[name]) for name in args.configs},
            "capacity_jobs": args.capacity_jobs,
            "producers": args.producers,
            "repeats": args.repeats,
            "statements": args.statements,
            "wal_segments_warmed": warmed,
            "worker_processes": 1,
            "latency": "started_at - run_at, database clock (includes the producer's commit)",
            "producer": "open loop: a batch every 10 ms (enqueue_many) over the producer "
            "connections; late batches are sent at once, the schedule is not shifted",
        },
        results=results,
    )
    path = write_result(record, args.out)
    print(f"\nenqueue-to-start latency (ms) under load, median of {args.repeats} rounds")
    for name, per in results["levels"].items():
        cap = results["capacity_jobs_per_second"][name]["median"]
        print(f"{CONFIGS[name].label}: capacity {cap:,.0f} jobs/s")
        for load, s in per.items():
            print(
                f"  {load:>7}  p50 {s['p50_ms']:6.1f}  p95 {s['p95_ms']:6.1f}  "
                f"p99 {s['p99_ms']:6.1f}  max {s['max_ms']:7.1f}  "
                f"steady p99 {s['steady_p99_ms']:6.1f}  "
                f"completed {s['completion_per_second']:,.0f}/s"
                + ("" if s["producer_kept_up"] else "  (producer fell behind)")
            )
    goal = results.get("goal")
    if goal:
        print(
            f"goal p99 < {GOAL_P99_MS:g} ms at 50 % (no-op): "
            f"{goal['p99_ms_noop_at_50_percent']:.1f} ms, {'met' if goal['met'] else 'NOT met'}"
        )
    print(f"{results['elapsed_seconds']:,.0f} s; written to {path}")
    return record


if __name__ == "__main__":
    main()
