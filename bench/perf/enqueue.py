"""Enqueue throughput: library calls and the HTTP API, in one run.

    python -m bench.perf.enqueue [--jobs 1000] [--many-jobs 20000] [--repeats 3] [--out PATH]

On a fresh server on disk (fsync and synchronous_commit on), each repeat runs,
with the table emptied before each:
  * single: ``Queue.enqueue``, one job per call (one commit each), 1 producer;
  * enqueue_many: ``Queue.enqueue_many`` of MANY_JOBS jobs (COPY, one commit);
  * enqueue_many_delayed: the same, delayed jobs (INSERT, 5,000 a statement);
  * transactional: a business row and its job in the caller's transaction
    (``enqueue(..., connection=conn)``), one commit per pair;
  * http_single: POST /jobs, one job per request, one request in flight;
  * http_single_4_clients_x8_in_flight: the same (2 x JOBS requests) from 4
    client processes with 8 requests in flight each (api_enqueue's default);
  * http_batch_100_4_in_flight / http_batch_1000_2_in_flight: POST /jobs/batch
    of 100 (1000) jobs per request, MANY_JOBS jobs, 4 (2) requests in flight.
The library rows reuse bench/perf/core.py's functions, the HTTP rows
bench/perf/api_enqueue.py's (one uvicorn process, ``pgqueue api``, auth
on, httpx.AsyncClient clients, all on the same 2 cores).
Writes results/enqueue.json.
"""

from __future__ import annotations

import argparse

from bench.common import bench_database, clear, summary
from bench.perf.api_enqueue import api_server, batch_rate, single_rate
from bench.perf.core import enqueue_many_rate, single_enqueue_rate, transactional_enqueue_rate
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Queue, Settings

ROWS = (
    "single",
    "enqueue_many",
    "enqueue_many_delayed",
    "transactional",
    "http_single",
    "http_single_4_clients_x8_in_flight",
    "http_batch_100_4_in_flight",
    "http_batch_1000_2_in_flight",
)


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per one-at-a-time row")
    parser.add_argument("--many-jobs", type=int, default=20_000, help="jobs per bulk row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    runs: dict[str, list[float]] = {name: [] for name in ROWS}

    def note(name: str, rate: float) -> None:
        runs[name].append(rate)
        print(f"  {name:<24} {rate:>10,.0f} jobs/s", flush=True)

    with bench_database("enqueue") as url:
        info = server_info(url)
        settings = Settings(database_url=url, pool_max_size=4)
        with Queue(url, settings=settings) as queue, api_server(url, api_max_batch=1000) as api:
            for repeat in range(args.repeats):
                print(f"repeat {repeat + 1}/{args.repeats}", flush=True)
                clear(url)
                note("single", single_enqueue_rate(queue, args.jobs))
                clear(url)
                note("enqueue_many", enqueue_many_rate(queue, args.many_jobs))
                clear(url)
                delayed = enqueue_many_rate(queue, args.many_jobs, delay_seconds=3600)
                note("enqueue_many_delayed", delayed)
                clear(url)
                note("transactional", transactional_enqueue_rate(queue, url, args.jobs))
                clear(url)
                note("http_single", single_rate(api, args.jobs, 1, 1))
                clear(url)
                note("http_single_4_clients_x8_in_flight", single_rate(api, args.jobs * 2, 4, 8))
                clear(url)
                note("http_batch_100_4_in_flight", batch_rate(api, args.many_jobs, 100, 4))
                clear(url)
                note("http_batch_1000_2_in_flight", batch_rate(api, args.many_jobs, 1000, 2))

    results = {name: summary(v) | {"runs": v} for name, v in runs.items()}
    record = ResultRecord(
        name="enqueue",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "jobs": args.jobs,
            "many_jobs": args.many_jobs,
            "repeats": args.repeats,
            "api": "bench.perf.api_enqueue: pgqueue api (one uvicorn process, auth on, "
            "127.0.0.1); http_single: one client process, 1 in flight; 4_clients_x8: 4 "
            "client processes, 8 in flight each; batches: one client, 4 or 2 in flight",
        },
        results={"results_jobs_per_second": results},
    )
    path = write_result(record, args.out)
    print(f"\nmedian jobs/s of {args.repeats} (min-max) -> {path}")
    for name, s in results.items():
        print(f"  {name:<24} {s['median']:>10,.0f}  ({s['min']:,.0f}-{s['max']:,.0f})")
    return record


if __name__ == "__main__":
    main()
