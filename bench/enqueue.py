"""Enqueue throughput: library calls and the HTTP API, in one run.

    python -m bench.enqueue [--jobs 1000] [--many-jobs 20000] [--batch 1000]
                            [--repeats 3] [--out PATH]

On a fresh server on disk (fsync and synchronous_commit on), each repeat runs,
with the table emptied before each:
  * single: ``Queue.enqueue``, one job per call (one commit each), 1 producer;
  * enqueue_many: ``Queue.enqueue_many`` of MANY_JOBS jobs (COPY, one commit);
  * transactional: a business row and its job in the caller's transaction
    (``enqueue(..., connection=conn)``), one commit per pair;
  * http_single: POST /jobs, one job per request, 1 client (keep-alive);
  * http_single_4_clients: the same from 4 client threads at once;
  * http_batch: POST /jobs/batch, BATCH jobs per request, 1 client.
The API runs in its own process (``pgqueue.api.serve``, one uvicorn worker)
on 127.0.0.1. The library rows reuse bench/core.py's measurements.
Writes results/enqueue.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import sys
import threading
import time
from typing import Any

import httpx

from bench.common import bench_database, server_info, summary, write_result
from bench.core import enqueue_many_rate, single_enqueue_rate, transactional_enqueue_rate
from bench.worker_throughput import clear
from pgqueue import Queue, Settings

ROWS = (
    "single",
    "enqueue_many",
    "transactional",
    "http_single",
    "http_single_4_clients",
    "http_batch",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(url: str, port: int) -> None:
    import logging

    from pgqueue.api import serve

    logging.disable(logging.WARNING)  # no "no token" warnings in the output
    serve(Settings(database_url=url, api_port=port), host="127.0.0.1", port=port)


class Api:
    """The API in a forked process, for the duration of a ``with``."""

    def __init__(self, url: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = mp.get_context("fork").Process(target=_serve, args=(url, self.port))

    def __enter__(self) -> Api:
        self.proc.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.base + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError("the API did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def http_single_rate(base: str, jobs: int, clients: int = 1) -> float:
    def produce(count: int) -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            for i in range(count):
                r = client.post("/jobs", json={"task": "noop", "payload": {"i": i}})
                r.raise_for_status()

    threads = [threading.Thread(target=produce, args=(jobs // clients,)) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (jobs // clients) * clients / (time.perf_counter() - started)


def http_batch_rate(base: str, jobs: int, batch: int) -> float:
    with httpx.Client(base_url=base, timeout=120) as client:
        started = time.perf_counter()
        sent = 0
        while sent < jobs:
            n = min(batch, jobs - sent)
            body = {"jobs": [{"task": "noop", "payload": {"i": sent + i}} for i in range(n)]}
            client.post("/jobs/batch", json=body).raise_for_status()
            sent += n
        return jobs / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per one-at-a-time row")
    parser.add_argument("--many-jobs", type=int, default=20_000, help="jobs per bulk row")
    parser.add_argument("--batch", type=int, default=1000, help="jobs per POST /jobs/batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    runs: dict[str, list[float]] = {name: [] for name in ROWS}

    def record(name: str, rate: float) -> None:
        runs[name].append(rate)
        print(f"  {name:<24} {rate:>10,.0f} jobs/s", flush=True)

    with bench_database("enqueue") as url:
        info = server_info(url)
        settings = Settings(database_url=url, pool_max_size=4)
        with Queue(url, settings=settings) as queue, Api(url) as api:
            for repeat in range(args.repeats):
                print(f"repeat {repeat + 1}/{args.repeats}", flush=True)
                clear(url)
                record("single", single_enqueue_rate(queue, args.jobs))
                clear(url)
                record("enqueue_many", enqueue_many_rate(queue, args.many_jobs))
                clear(url)
                record("transactional", transactional_enqueue_rate(queue, url, args.jobs))
                clear(url)
                record("http_single", http_single_rate(api.base, args.jobs))
                clear(url)
                record("http_single_4_clients", http_single_rate(api.base, args.jobs, 4))
                clear(url)
                record("http_batch", http_batch_rate(api.base, args.many_jobs, args.batch))

    results = {name: summary(v) | {"runs": v} for name, v in runs.items()}
    payload: dict[str, Any] = {
        "command": "python -m bench.enqueue "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "server": info,
        "settings": {
            "jobs": args.jobs,
            "many_jobs": args.many_jobs,
            "batch": args.batch,
            "repeats": args.repeats,
            "api": "pgqueue.api.serve, one uvicorn worker, 127.0.0.1, no auth; httpx "
            "keep-alive clients in the benchmark process",
        },
        "results_jobs_per_second": results,
    }
    path = write_result("enqueue", payload, args.out)
    print(f"\nmedian jobs/s of {args.repeats} (min-max) -> {path}")
    for name, s in results.items():
        print(f"  {name:<24} {s['median']:>10,.0f}  ({s['min']:,.0f}-{s['max']:,.0f})")
    return payload


if __name__ == "__main__":
    main()
