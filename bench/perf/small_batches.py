"""Small bulk enqueues: the latency of ``Queue.enqueue_many`` for a few plain
jobs, by its two ways in, at each batch size.

    python -m bench.perf.small_batches [--sizes 1,10,50,100,200,500] [--calls 200]
                                       [--repeats 3] [--out PATH]

A bulk enqueue of plain jobs (runnable now, no key, no batch) goes in
either as one statement outside a transaction (``one_statement``: the
reservation of its ids, then one INSERT that counts and wakes the jobs
itself) or by COPY in a transaction (``copy``: BEGIN, the reservation, the
COPY, the count, COMMIT). pgqueue takes the first up to
``enqueue.ONE_STATEMENT_JOBS`` jobs a call; here each size is measured both
ways, by setting that bound above or below the size, to show where the
bound belongs. On a fresh server on disk (fsync on), for each size and
way, CALLS calls one after another on one Queue, the table emptied first;
the rounds alternate the ways. Per cell: the calls' wall time (p50 and p99
in ms, medians over the repeats) and jobs per second.

Writes results/small_batches.json.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import bench_database, clear, percentiles_ms, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Queue, Settings
from pgqueue.core import enqueue

WAYS = {"one_statement": 10**9, "copy": 0}  # the bound that sends a call each way


def one_cell(url: str, size: int, calls: int, bound: int) -> dict[str, float]:
    """CALLS enqueue_many calls of SIZE plain jobs, with the bound at ``bound``."""
    clear(url, checkpoint=False)
    jobs = [{"task": "noop", "payload": {"n": n}} for n in range(size)]
    kept, enqueue.ONE_STATEMENT_JOBS = enqueue.ONE_STATEMENT_JOBS, bound
    try:
        with Queue(url, settings=Settings(database_url=url)) as queue:
            queue.enqueue_many(jobs)  # the pool's connection made, the statements prepared
            took = []
            started = time.perf_counter()
            for _ in range(calls):
                call = time.perf_counter()
                queue.enqueue_many(jobs)
                took.append((time.perf_counter() - call) * 1000)
            seconds = time.perf_counter() - started
    finally:
        enqueue.ONE_STATEMENT_JOBS = kept
    latency = percentiles_ms(sorted(took))
    return {
        "p50_ms": latency["p50_ms"],
        "p99_ms": latency["p99_ms"],
        "jobs_per_s": size * calls / seconds,
    }


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,10,50,100,200,500")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    runs: dict[int, dict[str, list[dict[str, float]]]] = {s: {w: [] for w in WAYS} for s in sizes}
    with bench_database("small_batches") as url:
        for _ in range(args.repeats):
            for size in sizes:
                for way, bound in WAYS.items():
                    runs[size][way].append(one_cell(url, size, args.calls, bound))
        server = server_info(url)
    cells: dict[str, Any] = {}
    for size in sizes:
        cell: dict[str, Any] = {}
        for way in WAYS:
            cell[way] = {
                name: summary([run[name] for run in runs[size][way]])
                for name in ("p50_ms", "p99_ms", "jobs_per_s")
            }
        one, copy = cell["one_statement"], cell["copy"]
        cell["copy_p50_over_one_statement_p50"] = copy["p50_ms"]["median"] / one["p50_ms"]["median"]
        cells[str(size)] = cell
        print(
            f"{size:5d} jobs: one statement p50 {one['p50_ms']['median']:.2f} ms,"
            f" copy p50 {copy['p50_ms']['median']:.2f} ms"
            f" ({cell['copy_p50_over_one_statement_p50']:.2f}x)",
            flush=True,
        )
    record = ResultRecord(
        name="small_batches",
        command=command_line(__spec__, argv),
        server=server,
        parameters=vars(args) | {"one_statement_jobs": enqueue.ONE_STATEMENT_JOBS},
        results={"sizes": cells},
    )
    path = write_result(record, args.out)
    print(f"-> {path}")
    return record


if __name__ == "__main__":
    main()
