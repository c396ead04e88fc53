"""Per-transition cost of the core, without a worker runtime.

    python -m bench.perf.core [--jobs 100000] [--single-jobs 5000] [--repeats 3] [--out PATH]

Measures, on a server with fsync and synchronous_commit on:
  * enqueue_many of N jobs (one transaction, chunks of a few thousand rows);
  * single enqueue from 1 producer, and from 4 concurrent producers with and
    without NOTIFY (runnable jobs notify, delayed ones do not; nothing else
    differs), which is what NOTIFY costs at a high enqueue rate;
  * transactional enqueue: a business row and its job in one transaction;
  * claim + ack of N jobs in batches of 100 on one connection.
Writes results/core.json.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import psycopg

from bench.common import bench_database, clear, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import AsyncQueue, Outcome, Queue, Settings


def enqueue_many_rate(queue: Queue, jobs: int, **fields: Any) -> float:
    """``fields`` go in every job (a delay: the INSERT path, not COPY)."""
    specs = [{"task": "noop", "payload": {"i": i}, **fields} for i in range(jobs)]
    started = time.perf_counter()
    queue.enqueue_many(specs)
    return jobs / (time.perf_counter() - started)


def single_enqueue_rate(queue: Queue, jobs: int) -> float:
    started = time.perf_counter()
    for i in range(jobs):
        queue.enqueue("noop", {"i": i})
    return jobs / (time.perf_counter() - started)


async def concurrent_enqueue_rate(url: str, jobs: int, producers: int, notify: bool) -> float:
    """Producers enqueue at full speed; without NOTIFY the jobs are delayed,
    which is the only difference (delayed jobs send no notification)."""
    settings = Settings(database_url=url, pool_min_size=producers, pool_max_size=producers)
    delay = None if notify else 3600.0
    async with AsyncQueue(url, settings=settings) as queue:

        async def produce(count: int) -> None:
            for i in range(count):
                await queue.enqueue("noop", {"i": i}, delay=delay)

        started = time.perf_counter()
        await asyncio.gather(*(produce(jobs // producers) for _ in range(producers)))
        return jobs / (time.perf_counter() - started)


def transactional_enqueue_rate(queue: Queue, url: str, jobs: int) -> float:
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_orders (id bigserial PRIMARY KEY, n int)")
        conn.commit()
        started = time.perf_counter()
        for i in range(jobs):
            conn.execute("INSERT INTO bench_orders (n) VALUES (%s)", (i,))
            queue.enqueue("receipt", {"order": i}, connection=conn)
            conn.commit()
        return jobs / (time.perf_counter() - started)


def claim_ack_rate(queue: Queue, jobs: int, batch: int) -> float:
    queue.enqueue_many([{"task": "noop"} for _ in range(jobs)])
    started = time.perf_counter()
    done = 0
    while claimed := queue.claim(batch, worker="bench"):
        queue.finish([Outcome.success(job, None) for job in claimed])
        done += len(claimed)
    assert done == jobs
    return jobs / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--single-jobs", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    runs: dict[str, list[float]] = {}

    def note(name: str, rate: float) -> None:
        runs.setdefault(name, []).append(rate)
        print(f"  {name:<38} {rate:>10,.0f} jobs/s", flush=True)

    with bench_database("core") as url:
        settings = Settings(database_url=url, pool_max_size=4)
        with Queue(url, settings=settings) as queue:
            for repeat in range(args.repeats):
                print(f"repeat {repeat + 1}/{args.repeats}")
                clear(url, checkpoint=False)
                note("enqueue_many", enqueue_many_rate(queue, args.jobs))
                clear(url, checkpoint=False)
                note("claim_ack_batch_100", claim_ack_rate(queue, args.jobs, 100))
                clear(url, checkpoint=False)
                note("enqueue_single_1_producer", single_enqueue_rate(queue, args.single_jobs))
                clear(url, checkpoint=False)
                note(
                    "enqueue_transactional",
                    transactional_enqueue_rate(queue, url, args.single_jobs),
                )
                for notify in (True, False):
                    clear(url, checkpoint=False)
                    rate = asyncio.run(
                        concurrent_enqueue_rate(url, args.single_jobs * 2, 4, notify)
                    )
                    note(f"enqueue_single_4_producers_notify_{'on' if notify else 'off'}", rate)
        server = server_info(url)

    results = {name: summary(values) for name, values in runs.items()}
    on = results["enqueue_single_4_producers_notify_on"]["median"]
    off = results["enqueue_single_4_producers_notify_off"]["median"]
    record = ResultRecord(
        name="core",
        command=command_line(__spec__, argv),
        server=server,
        parameters={"jobs": args.jobs, "single_jobs": args.single_jobs, "repeats": args.repeats},
        results={"results_jobs_per_second": results, "notify_cost_ratio": on / off},
    )
    path = write_result(record, args.out)
    print(f"\nmedians (jobs/s), {args.repeats} repeats -> {path}")
    for name, stats in results.items():
        print(f"  {name:<38} {stats['median']:>10,.0f}  ({stats['min']:,.0f}-{stats['max']:,.0f})")
    print(f"  NOTIFY on/off throughput ratio: {on / off:.2f}")
    return record


if __name__ == "__main__":
    main()
