"""What job_finish's batch step costs a job that has no batch: the statement
as shipped against the same statement with that step cut out, in one run.

    python -m bench.perf.finish_statement [--jobs 20000] [--size 100] [--rounds 9] [--out PATH]

Each round enqueues JOBS plain jobs, claims them all (Queue.claim, SIZE at a
time, as a worker does), then acks them SIZE at a time, the two statements
taking turns ack by ack so that both meet the same table, the same server
and the same noise. Measured per ack: the statement's time on the client
(execute to result, one round trip). Reported: median time per ack for
each, and their ratio (as shipped over without the step; 1.0 means the step
costs nothing). The worker runs this statement once per ack of up to 1,000
outcomes, next to a claim, so a fraction of it is a smaller fraction of a
job's cost. A first round, not counted, warms the server's caches (the
first acks of a fresh server took 1.5x as long, whichever statement ran).
Writes results/finish_statement.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, LiteralString

import psycopg

from bench.common import bench_database, clear, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Job, Outcome, Queue, Settings
from pgqueue.sql import QUERIES

# The batch step and its place in the final join (queries.sql job_finish).
BATCH_STEP = (
    "), batched AS (",
    "\n)\nSELECT id, state FROM finished",
)
BATCH_JOIN = ",\n       (SELECT count(*) FROM batched) b"


def without_batch_step(query: LiteralString) -> LiteralString:
    """job_finish without its batch step: the text from ``batched AS`` to the
    CTE list's end, and the join that forces it, cut out."""
    start = query.index(BATCH_STEP[0])
    end = query.index(BATCH_STEP[1])
    cut = query[:start] + query[end:]
    if BATCH_JOIN not in cut:
        raise SystemExit("job_finish changed shape: update bench/perf/finish_statement.py")
    return cut.replace(BATCH_JOIN, "")


def params(settings: Settings, jobs: list[Job]) -> dict[str, Any]:
    """What transitions._finish_statement binds, for successes with no result."""
    outcomes = [Outcome.success(job, None) for job in jobs]
    return {
        "ids": [o.job_id for o in outcomes],
        "tokens": [o.token for o in outcomes],
        "succeeded": [True] * len(outcomes),
        "results": [o.result_json for o in outcomes],
        "errors": [None] * len(outcomes),
        "retryable": [True] * len(outcomes),
        "backoff_base": settings.backoff_base_seconds,
        "backoff_cap": settings.backoff_cap_seconds,
        "notify_finished": settings.notify_finished,
    }


def one_round(url: str, jobs: int, size: int) -> dict[str, list[float]]:
    settings = Settings(database_url=url)
    statements = {"as_shipped": QUERIES["job_finish"]}
    statements["without_batch_step"] = without_batch_step(statements["as_shipped"])
    times: dict[str, list[float]] = {name: [] for name in statements}
    with Queue(url, settings=settings) as queue, psycopg.connect(url, autocommit=True) as conn:
        queue.enqueue_many([{"task": "noop", "queue": "bench"} for _ in range(jobs)])
        conn.execute("VACUUM ANALYZE pgqueue_jobs")
        claims: list[list[Job]] = []
        while claimed := queue.claim(size, worker="bench", queues=["bench"]):
            claims.append(claimed)
        for n, claimed in enumerate(claims):
            # Alternate which goes first in each pair, so neither always
            # meets the table as the other left it.
            name = list(statements)[(n + n // 2) % 2]
            started = time.perf_counter()
            rows = conn.execute(statements[name], params(settings, claimed)).fetchall()
            times[name].append(time.perf_counter() - started)
            if len(rows) != len(claimed):
                raise SystemExit(f"an ack finished {len(rows)} of {len(claimed)} jobs")
    return times


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    medians: dict[str, list[float]] = {"as_shipped": [], "without_batch_step": []}
    ratios: list[float] = []
    with bench_database("finish_statement") as url:
        clear(url)
        one_round(url, args.jobs, args.size)
        for round_ in range(args.rounds):
            clear(url)
            times = one_round(url, args.jobs, args.size)
            for name, values in times.items():
                medians[name].append(statistics.median(values) * 1000)
            ratios.append(medians["as_shipped"][-1] / medians["without_batch_step"][-1])
            print(
                f"round {round_ + 1}: as shipped {medians['as_shipped'][-1]:.3f} ms, "
                f"without the batch step {medians['without_batch_step'][-1]:.3f} ms "
                f"(ratio {ratios[-1]:.3f})",
                flush=True,
            )
        server = server_info(url)
    record = ResultRecord(
        name="finish_statement",
        command=command_line(__spec__, argv),
        server=server,
        parameters={
            **vars(args),
            "measured": "client time of one job_finish execute, per ack of SIZE successes",
        },
        results={
            "ack_ms": {name: summary(values) for name, values in medians.items()},
            "as_shipped_over_without_batch_step": summary(ratios),
            "rounds": ratios,
        },
    )
    path = write_result(record, args.out)
    print(f"-> {path}")
    return record


if __name__ == "__main__":
    main()
