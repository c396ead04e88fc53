"""Latency objectives: how long a tight queue's (or key's) jobs wait to
start when the workers are overloaded, with and without its objective.

    python -m bench.perf.objectives [--keys] [--seconds 20] [--concurrency 5]
                                    [--tight-rate 300] [--bulk-rate 400]
                                    [--objective 1.0] [--out PATH]

On a fresh server on disk (fsync on), one worker process (a forked
``AsyncWorker`` of the queues ``bulk`` and ``tight``, CONCURRENCY slots,
handlers that wait 10 ms: about 100 x CONCURRENCY jobs a second) is given
more than it can do: for SECONDS, jobs are enqueued every 50 ms, TIGHT_RATE
a second to ``tight`` and BULK_RATE to ``bulk``. The round robin alone gives
each queue half the slots, less than ``tight`` needs, so its wait grows for
as long as the overload lasts. Two scenarios, each on an emptied table:

  * ``without``: no objective (the round robin);
  * ``with``: ``tight`` gets ``max_start_lag_seconds`` OBJECTIVE.

With ``--keys``, the same streams are two concurrency_keys, ``bulk`` and
``tight``, of one fair queue ``tenants`` (docs/howto/limits.md, "Fair
queues"), and ``with`` gives the key ``tight`` the objective
(``Queue.set_key_objective``): the round robin across keys alone gives each
key half the slots.

A job's start lag is its ``started_at`` minus its ``run_at`` (the database
clock); a job not started when the enqueuing stops counts with its wait until
then. Writes each stream's percentiles, and how many ``tight`` jobs waited
past the objective, to results/objectives.json (with ``--keys``:
results/key_objectives.json).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from bench.common import bench_database, clear, percentiles_ms
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import async_workers, wait_connected
from pgqueue import Queue, Settings

STREAMS = ("bulk", "tight")
TICK_SECONDS = 0.05
FAIR_QUEUE = "tenants"


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the two streams of jobs go: two queues, or two keys of one fair
    queue. ``column`` is the pgqueue_jobs column that tells them apart."""

    name: str
    column: str
    queues: tuple[str, ...]

    def job(self, stream: str) -> dict[str, Any]:
        if self.column == "queue":
            return {"task": "io_10ms", "queue": stream}
        return {"task": "io_10ms", "queue": FAIR_QUEUE, "concurrency_key": stream}

    def declare(self, q: Queue, objective: float | None) -> None:
        """``tight``'s objective (None: none), ``bulk`` without one."""
        if self.column == "queue":
            q.set_limits("tight", max_start_lag_seconds=objective)
            q.set_limits("bulk", max_start_lag_seconds=None)
        else:
            q.set_limits(FAIR_QUEUE, fair=True)
            q.set_key_objective(FAIR_QUEUE, "tight", objective)

    def lags(self) -> sql.Composed:
        """Each job's stream and start lag in ms, for a stop moment (%s)."""
        return sql.SQL(
            "SELECT {}, extract(epoch FROM coalesce(started_at, %s) - run_at)::float8 * 1000"
            " FROM pgqueue_jobs ORDER BY 2"
        ).format(sql.Identifier(self.column))

    def not_started(self) -> sql.Composed:
        return sql.SQL(
            "SELECT count(*) FROM pgqueue_jobs WHERE {} = 'tight' AND started_at IS NULL"
        ).format(sql.Identifier(self.column))


QUEUES = Layout("objectives", "queue", STREAMS)
KEYS = Layout("key_objectives", "concurrency_key", (FAIR_QUEUE,))


def _scenario(
    url: str,
    layout: Layout,
    *,
    objective: float | None,
    seconds: float,
    concurrency: int,
    rates: dict[str, int],
) -> dict[str, Any]:
    clear(url)
    settings = Settings(database_url=url, concurrency=concurrency)
    with Queue(url, settings=settings) as q:
        layout.declare(q, objective)
    with async_workers(1, settings, name="objectives", queues=layout.queues, task="io_10ms"):
        wait_connected(url, 1)
        with Queue(url, settings=settings) as q:
            started = time.monotonic()
            owed = dict.fromkeys(STREAMS, 0.0)
            while (elapsed := time.monotonic() - started) < seconds:
                for name in STREAMS:
                    owed[name] += rates[name] * TICK_SECONDS
                    n, owed[name] = int(owed[name]), owed[name] - int(owed[name])
                    if n:
                        q.enqueue_many([layout.job(name)] * n)
                time.sleep(max(0.0, TICK_SECONDS - (time.monotonic() - started - elapsed)))
        with psycopg.connect(url, autocommit=True) as conn:
            [[stopped_at]] = conn.execute("SELECT now()")
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(layout.lags(), [stopped_at]).fetchall()
        [[not_started]] = conn.execute(layout.not_started())
    result: dict[str, Any] = {}
    for name in STREAMS:
        ms = [lag for stream, lag in rows if stream == name]
        result[name] = {"jobs": len(ms), "start_lag_ms": percentiles_ms(ms) if ms else None}
    if objective is not None:
        tight = [lag for stream, lag in rows if stream == "tight"]
        result["tight"]["over_objective"] = sum(lag > objective * 1000 for lag in tight)
    result["tight"]["not_started_at_stop"] = not_started
    return result


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--keys", action="store_true", help="two keys of one fair queue, not two queues"
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=5)
    parser.add_argument("--tight-rate", type=int, default=300)
    parser.add_argument("--bulk-rate", type=int, default=400)
    parser.add_argument("--objective", type=float, default=1.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    layout = KEYS if args.keys else QUEUES
    rates = {"tight": args.tight_rate, "bulk": args.bulk_rate}
    load_before = os.getloadavg()
    started = time.monotonic()
    common = {"seconds": args.seconds, "concurrency": args.concurrency, "rates": rates}
    with bench_database("objectives") as url:
        info = server_info(url)
        results = {
            "without": _scenario(url, layout, objective=None, **common),
            "with": _scenario(url, layout, objective=args.objective, **common),
        }
    worker = "1 AsyncWorker process of both queues"
    if args.keys:
        worker = f"1 AsyncWorker process of the fair queue {FAIR_QUEUE} (keys bulk and tight)"
    record = ResultRecord(
        name=layout.name,
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "seconds": args.seconds,
            "rates_per_second": rates,
            "objective_seconds": args.objective,
            "worker": f"{worker}, concurrency {args.concurrency}, handlers waiting 10 ms",
            "start_lag": "started_at - run_at (database clock); a job not started when the "
            "enqueuing stopped counts with its wait until then",
            "machine_state": "shared, not idle (load averages below)",
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
        results={"elapsed_seconds": time.monotonic() - started, "scenarios": results},
    )
    path = write_result(record, args.out)
    for scenario, result in results.items():
        for name in STREAMS:
            lag = result[name]["start_lag_ms"]
            shown = (
                "none" if lag is None else f"p50 {lag['p50_ms']:.0f}  p99 {lag['p99_ms']:.0f} ms"
            )
            print(f"{scenario:>7} {name:>5}: {result[name]['jobs']} jobs, start lag {shown}")
    print(f"written to {path}")
    return record


if __name__ == "__main__":
    main()
