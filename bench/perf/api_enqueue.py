"""HTTP enqueue throughput: POST /jobs and POST /jobs/batch.

    python -m bench.perf.api_enqueue [--requests 4000] [--clients 4] [--concurrency 8]
                                     [--batch-jobs 50000] [--repeats 3] [--out PATH]

One uvicorn process (``pgqueue api``, with a token configured) on loopback,
in front of a fresh embedded PostgreSQL with fsync and synchronous_commit
on. The load comes from httpx asyncio clients keeping a fixed number of
requests in flight: 4 processes with 8 each for POST /jobs (one process
could not keep the server busy), one process for the batches.
Client, API and database share the machine's cores, so the figures are what
one small box does end to end, not the API's ceiling.

Writes results/api_enqueue.json.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg

from bench.common import bench_database, summary
from bench.record import ResultRecord, command_line, server_info, write_result

TOKEN = "bench-admin-token"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def api_server(url: str, **settings: Any) -> Iterator[str]:
    """``pgqueue api`` in a child process, with the admin token TOKEN and
    ``settings`` (as PGQUEUE_* variables); yields its base URL."""
    with api_process(url, **settings) as (base, _):
        yield base


@contextmanager
def api_process(url: str, **settings: Any) -> Iterator[tuple[str, int]]:
    """``api_server``, yielding its base URL and its process id."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env |= {"PGQUEUE_DATABASE_URL": url, "PGQUEUE_API_TOKENS": TOKEN}
    env |= {f"PGQUEUE_{name.upper()}": str(value) for name, value in settings.items()}
    with served([sys.executable, "-m", "pgqueue", "api"], env) as server:
        yield server


@contextmanager
def served(command: list[str], env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """``command --host 127.0.0.1 --port N`` in a child process, once its
    GET /healthz answers 200; yields its base URL and its process id."""
    port = _free_port()
    process = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)], env=env, stdout=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command} did not start")
            time.sleep(0.1)
        yield base, process.pid
    finally:
        process.terminate()
        process.wait(15)


def _client(base: str, concurrency: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base,
        headers={"Authorization": f"Bearer {TOKEN}"},
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        timeout=30,
    )


async def _run(
    base: str, concurrency: int, bodies: list[tuple[str, Any]], *, warm: bool = True
) -> float:
    """Send every (path, body), ``concurrency`` at a time; seconds taken."""
    pending = iter(bodies)
    async with _client(base, concurrency) as client:

        async def sender() -> None:
            for path, body in pending:
                response = await client.post(path, json=body)
                if response.status_code not in (200, 201):
                    raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")

        if warm:  # open the connections (and the server's pool) before timing
            await asyncio.gather(*(client.get("/healthz") for _ in range(concurrency)))
        started = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(concurrency)))
        return time.perf_counter() - started


def _client_process(
    base: str, bodies: list[tuple[str, Any]], concurrency: int, start: Any, out: Any
) -> None:
    start.wait()
    began = time.time()
    asyncio.run(_run(base, concurrency, bodies, warm=False))
    out.put((began, time.time()))


def single_rate(base: str, requests: int, clients: int, concurrency: int) -> float:
    """POST /jobs from ``clients`` processes with ``concurrency`` requests in
    flight each, released together; jobs over the wall time of the whole run.
    (One httpx process tops out well below the server: it spent 70% of a
    core at 32 connections while uvicorn used 22%.)"""
    share = requests // clients
    context = multiprocessing.get_context("spawn")
    start, out = context.Event(), context.Queue()
    processes = [
        context.Process(
            target=_client_process,
            args=(
                base,
                [("/jobs", {"task": "noop", "payload": {"i": i}}) for i in range(share)],
                concurrency,
                start,
                out,
            ),
        )
        for _ in range(clients)
    ]
    for process in processes:
        process.start()
    time.sleep(1.0)  # let every client import and connect
    start.set()
    spans = [out.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    return float(share * clients / (max(e for _, e in spans) - min(b for b, _ in spans)))


def batch_rate(base: str, jobs: int, batch: int, concurrency: int) -> float:
    bodies = [
        ("/jobs/batch", {"jobs": [{"task": "noop", "payload": {"i": i}} for i in range(batch)]})
        for _ in range(jobs // batch)
    ]
    return (jobs // batch) * batch / asyncio.run(_run(base, concurrency, bodies))


def count_jobs(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0])  # type: ignore[index]


def single_load_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options of ``single_rate``'s load, in a script's parser."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=4000, help="POST /jobs per run")
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--concurrency", type=int, default=8, help="in flight per client")
    return parser


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = single_load_parser(__doc__)
    parser.add_argument("--batch-jobs", type=int, default=50_000, help="jobs per batch run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    runs: dict[str, list[float]] = {"single": [], "batch_100": [], "batch_1000": []}
    with bench_database("api-enqueue") as url, api_server(url, api_max_batch=1000) as base:
        for repeat in range(args.repeats):
            runs["single"].append(single_rate(base, args.requests, args.clients, args.concurrency))
            runs["batch_100"].append(batch_rate(base, args.batch_jobs, 100, 4))
            runs["batch_1000"].append(batch_rate(base, args.batch_jobs, 1000, 2))
            print(
                f"run {repeat + 1}: "
                + ", ".join(f"{k} {v[-1]:.0f} jobs/s" for k, v in runs.items())
            )
        single_jobs = args.requests // args.clients * args.clients
        expected = args.repeats * (single_jobs + 2 * args.batch_jobs)
        assert count_jobs(url) == expected, "every accepted job must be in the table"
        info = server_info(url)
    record = ResultRecord(
        name="api_enqueue",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "api_processes": 1,
            "server": "uvicorn via pgqueue api, auth on, access log off",
            "client": "httpx.AsyncClient processes on the same machine",
            "requests_per_single_run": single_jobs,
            "single_client_processes": args.clients,
            "single_in_flight_per_process": args.concurrency,
            "jobs_per_batch_run": args.batch_jobs,
            "batch_100_concurrency": 4,
            "batch_1000_concurrency": 2,
            "payload": '{"i": <n>}',
            "load_average_at_end": os.getloadavg(),
        },
        results={"jobs_per_second": {k: summary(v) for k, v in runs.items()}, "runs": runs},
    )
    path = write_result(record, args.out)
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
