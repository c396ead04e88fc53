"""Fair queues: how soon a small tenant's jobs start beside a big tenant's
backlog, against the same jobs on an empty queue.

    python -m bench.perf.fairness [--big 1000000] [--small 10] [--rounds 20]
                                  [--concurrency 100] [--only NAME,...] [--out PATH]

On a fresh server on disk (fsync on), the queue ``tenants`` gets the
control ``fair`` (docs/howto/limits.md, "Fair queues"). Five scenarios, one
after the other, each on an emptied table:

  * ``empty``: no backlog, an idle machine;
  * ``busy``: no backlog in ``tenants``, but BIG jobs in another queue,
    ``other``, drained by a second worker process meanwhile: the machine as
    busy as beside a backlog, the small key's queue and worker idle;
  * ``shared_worker``: the same backlog in ``other``, drained by the small
    key's own worker (it serves both queues);
  * ``fair``: BIG jobs of the key ``big`` in ``tenants`` enqueued first
    (bulk enqueues), then ``VACUUM ANALYZE`` (what autovacuum does after it);
  * ``plain``: the same backlog, with ``fair`` off (claim order), for
    contrast: its rounds are cut short (``--plain-rounds``).

In each, one worker process (a forked ``AsyncWorker``, CONCURRENCY slots,
no-op handlers, serving ``tenants``, and ``other`` in ``shared_worker``)
starts;
once it has been running for a second, ROUNDS times SMALL jobs of the key
``small`` are enqueued together, PAUSE seconds apart.
A small job's start latency is its ``started_at`` minus its
``enqueued_at`` (the database clock). A small job not started within
WAIT seconds of its round counts as not started. Writes results/fairness.json
with each scenario's latency percentiles, and the ratio of fair's p99 to
empty's p99.

The latency is split in two at the moment the enqueue call returned (its
transaction committed; the wall clock, which the server on this host
shares): ``enqueue_ms``, each round's enqueue itself (``enqueued_at`` is
its transaction's start), and ``after_enqueue_ms``, from then until each
job started (below 0 when the claim came before the client heard of the
commit). The first is what the machine's load costs any enqueue; the
second is the claim's part. ``handler_start_ms`` is from ``enqueued_at`` to
the moment the handler began (the handler's wall clock): a claimed job may
wait in the worker's buffer of prefetched jobs after ``started_at``.

Three ratios of p99s: ``fair`` over ``empty`` (the issue's goal as written:
the same p99 as on an empty queue), ``fair`` over ``busy`` (the same, with
the machine as loaded in both: on two cores a backlog being worked slows
every enqueue and commit, whatever the claim does), and ``shared_worker``
over ``fair`` (a backlog in another queue of the same worker, against one
beside the key in a fair queue).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from multiprocessing.synchronize import Event
from typing import Any

import psycopg

from bench.common import bench_database, clear, percentiles_ms
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import stop, wait_connected
from pgqueue import Job, Queue, Settings
from pgqueue.worker import AsyncWorker

QUEUE = "tenants"
OTHER = "other"  # the busy scenario's backlog
WAIT_SECONDS = 30.0
# The backlog is enqueued this many jobs per call.
CHUNK = 50_000
SCENARIOS = ("empty", "busy", "shared_worker", "fair", "plain")
LATENCIES = (
    "SELECT extract(epoch FROM started_at - enqueued_at)::float8 * 1000 FROM pgqueue_jobs"
    " WHERE concurrency_key = 'small' AND started_at IS NOT NULL ORDER BY 1"
)
# Each small job's enqueue and start (epoch seconds), to split its latency.
SMALL_TIMES = (
    "SELECT id, extract(epoch FROM enqueued_at)::float8, extract(epoch FROM started_at)::float8,"
    " (result ->> 'at')::float8"
    " FROM pgqueue_jobs WHERE concurrency_key = 'small' AND started_at IS NOT NULL"
)
SMALL_NOT_STARTED = (
    "SELECT count(*) FROM pgqueue_jobs WHERE concurrency_key = 'small' AND started_at IS NULL"
)


async def noop(job: Job) -> dict[str, float] | None:
    """A small job says when its handler began (the wall clock, which the
    server on this host shares): a claimed job may wait in the worker's
    buffer before it starts."""
    return {"at": time.time()} if job.concurrency_key == "small" else None


def _worker(url: str, concurrency: int, queues: list[str], done: Event) -> None:
    import asyncio

    async def run() -> None:
        settings = Settings(database_url=url, concurrency=concurrency)
        worker = AsyncWorker({"work": noop}, settings=settings, queues=queues, name="fairness")
        running = asyncio.create_task(worker.run())
        await asyncio.to_thread(done.wait)
        await worker.stop()
        await running

    asyncio.run(run())


def _scenario(
    url: str,
    *,
    big: int,
    fair: bool,
    small: int,
    rounds: int,
    pause: float,
    concurrency: int,
    elsewhere: str | None = None,
) -> dict[str, Any]:
    """One scenario. ``elsewhere``: the BIG jobs go to ``other`` instead of
    beside the small key, drained by a worker of their own ("own_worker")
    or by the small key's worker ("same_worker")."""
    clear(url)
    queues = [QUEUE, OTHER] if elsewhere == "same_worker" else [QUEUE]
    with Queue(url, settings=Settings(database_url=url)) as q:
        q.set_limits(QUEUE, fair=fair)
        big_job = {"task": "work", "queue": OTHER if elsewhere else QUEUE, "concurrency_key": "big"}
        for start in range(0, big, CHUNK):  # each call within its deadline
            q.enqueue_many([big_job] * min(CHUNK, big - start))
    if big:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE pgqueue_jobs")
    ctx = mp.get_context("fork")
    done = ctx.Event()
    procs = [ctx.Process(target=_worker, args=(url, concurrency, queues, done), daemon=True)]
    if elsewhere == "own_worker":
        procs.append(
            ctx.Process(target=_worker, args=(url, concurrency, [OTHER], done), daemon=True)
        )
    for proc in procs:
        proc.start()
    try:
        wait_connected(url, len(procs))
        time.sleep(1.0)  # the worker claiming the backlog, if any
        small_job = {"task": "work", "queue": QUEUE, "concurrency_key": "small"}
        returned: dict[int, float] = {}  # job id: when its enqueue call returned
        with Queue(url, settings=Settings(database_url=url)) as q:
            for _ in range(rounds):
                jobs = q.enqueue_many([small_job] * small)
                returned.update(dict.fromkeys((job.id for job in jobs), time.time()))
                time.sleep(pause)
            deadline = time.monotonic() + WAIT_SECONDS
            while _not_started(url) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        stop(procs, done)
    with psycopg.connect(url, autocommit=True) as conn:
        ms = [row[0] for row in conn.execute(LATENCIES).fetchall()]
        [[big_started]] = conn.execute(
            "SELECT count(*) FROM pgqueue_jobs WHERE concurrency_key = 'big'"
            " AND started_at IS NOT NULL"
        )
        times = conn.execute(SMALL_TIMES).fetchall()
    enqueues = {enqueued: returned[id_] - enqueued for id_, enqueued, _, _ in times}
    after = sorted((started - returned[id_]) * 1000 for id_, _, started, _ in times)
    handler = sorted((at - enqueued) * 1000 for _, enqueued, _, at in times if at is not None)
    return {
        "small_jobs": small * rounds,
        "small_started": len(ms),
        "big_jobs_started_meanwhile": big_started,
        "latency_ms": percentiles_ms(ms) if ms else None,
        "enqueue_ms": percentiles_ms(sorted(v * 1000 for v in enqueues.values()))
        if enqueues
        else None,
        "after_enqueue_ms": percentiles_ms(after) if after else None,
        "handler_start_ms": percentiles_ms(handler) if handler else None,
    }


def _not_started(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        [[count]] = conn.execute(SMALL_NOT_STARTED)
    return int(count)


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--plain-rounds", type=int, default=3)
    parser.add_argument("--pause", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument(
        "--only",
        default=None,
        help="a comma-separated list of the scenarios to run (default: all five)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.only and not set(args.only.split(",")) <= set(SCENARIOS):
        parser.error(f"--only takes some of {', '.join(SCENARIOS)}")
    load_before = os.getloadavg()
    started = time.monotonic()
    common = {"small": args.small, "pause": args.pause, "concurrency": args.concurrency}
    with bench_database("fairness") as url:
        info = server_info(url)
        scenarios = {
            "empty": lambda: _scenario(url, big=0, fair=True, rounds=args.rounds, **common),
            "busy": lambda: _scenario(
                url, big=args.big, fair=True, rounds=args.rounds, elsewhere="own_worker", **common
            ),
            "shared_worker": lambda: _scenario(
                url, big=args.big, fair=True, rounds=args.rounds, elsewhere="same_worker", **common
            ),
            "fair": lambda: _scenario(url, big=args.big, fair=True, rounds=args.rounds, **common),
            "plain": lambda: _scenario(
                url, big=args.big, fair=False, rounds=args.plain_rounds, **common
            ),
        }
        only = args.only.split(",") if args.only else list(scenarios)
        results = {name: scenarios[name]() for name in only}
    empty, busy, shared, fair = (
        results.get(name, {}).get("latency_ms")
        for name in ("empty", "busy", "shared_worker", "fair")
    )
    ratio = fair["p99_ms"] / empty["p99_ms"] if empty and fair else None
    busy_ratio = fair["p99_ms"] / busy["p99_ms"] if busy and fair else None
    shared_ratio = shared["p99_ms"] / fair["p99_ms"] if shared and fair else None
    record = ResultRecord(
        name="fairness",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "big": args.big,
            "small": args.small,
            "rounds": args.rounds,
            "plain_rounds": args.plain_rounds,
            "pause_seconds": args.pause,
            "wait_seconds": WAIT_SECONDS,
            "worker": f"1 AsyncWorker process, concurrency {args.concurrency}, no-op handlers"
            " (busy: a second one draining the other queue)",
            "latency": "started_at - enqueued_at of the small key's jobs (database clock)",
            "machine_state": "shared, not idle (load averages below)",
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
        results={
            "elapsed_seconds": time.monotonic() - started,
            "scenarios": results,
            "fair_p99_over_empty_p99": ratio,
            "fair_p99_over_busy_p99": busy_ratio,
            "shared_worker_p99_over_fair_p99": shared_ratio,
        },
    )
    path = write_result(record, args.out)
    for name, result in results.items():
        lat = result["latency_ms"]
        shown = (
            "none started"
            if lat is None
            else f"p50 {lat['p50_ms']:.1f}  p99 {lat['p99_ms']:.1f} ms"
        )
        started_of = f"{result['small_started']}/{result['small_jobs']}"
        split = result["enqueue_ms"], result["after_enqueue_ms"]
        if split[0] and split[1]:
            shown += (
                f" (enqueue p50 {split[0]['p50_ms']:.1f} p99 {split[0]['p99_ms']:.1f},"
                f" then p50 {split[1]['p50_ms']:.1f} p99 {split[1]['p99_ms']:.1f})"
            )
        if result["handler_start_ms"]:
            handler = result["handler_start_ms"]
            shown += f"; handler p50 {handler['p50_ms']:.1f} p99 {handler['p99_ms']:.1f}"
        print(f"{name:>6}: {started_of} small jobs started, {shown}")
    print(
        f"fair p99 / empty p99: {ratio}; fair p99 / busy p99: {busy_ratio};"
        f" shared_worker p99 / fair p99: {shared_ratio}; written to {path}"
    )
    return record


if __name__ == "__main__":
    main()
