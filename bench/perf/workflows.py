"""Workflows at scale: a fan-out of 10,000 children and a fan-in over them,
against 10,000 plain jobs.

    python -m bench.perf.workflows [--children 10000] [--rounds 3] [--out PATH]

One server with fsync on. Each round runs both cases, interleaved, each
drained by one AsyncWorker process (concurrency 100, no-op handlers):

* plain: CHILDREN jobs enqueued in one transaction;
* workflow: one workflow, ``chain(first, group(CHILDREN children), fan_in)``
  enqueued in one transaction: the children wait for the first job, the
  fan-in for every child (its claim reads the CHILDREN results).

Rates are the claim-and-ack rate of the CHILDREN jobs (first start to last
finish, database clock); the figure is the median over the rounds of the
workflow's rate over the plain jobs' in the same round, and the target is
within 20%. Also: how long the first
job's ack took to release the children (its finish to the first child's
start), how long the fan-in waited after the last child ended (release and
claim, with its 10,000 parents' results), and the enqueue times.

Writes results/workflows.json.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psycopg

from bench.common import bench_database, clear, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import async_workers, wait_drained
from pgqueue import Queue, Settings, chain, group

CASES = ("plain", "workflow")
TARGET = 0.8  # the workflow's rate over the plain jobs'
NOOP = {"task": "noop"}


def _span(conn: psycopg.Connection[Any], low: int, high: int) -> dict[str, float]:
    """Over the succeeded jobs with ids from ``low`` to ``high``: their
    count, and the seconds from the first start to the last finish."""
    row = conn.execute(
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8,"
        " min(started_at), max(finished_at)"
        " FROM pgqueue_jobs WHERE state = 'succeeded' AND id BETWEEN %s AND %s",
        (low, high),
    ).fetchone()
    assert row is not None
    return {"jobs": row[0], "seconds": row[1], "first_start": row[2], "last_finish": row[3]}


def _one(url: str, case: str, children: int) -> dict[str, float]:
    clear(url)
    settings = Settings(database_url=url, pool_min_size=0, pool_max_size=1)
    with Queue(url, settings=settings) as q:
        began = time.perf_counter()
        if case == "plain":
            ids = [r.id for r in q.enqueue_many([NOOP] * children)]
            first = fan_in = None
        else:
            jobs = q.enqueue_workflow(chain(NOOP, group(*[NOOP] * children), NOOP)).jobs
            ids = [job.id for job in jobs[1:-1]]
            first, fan_in = jobs[0].id, jobs[-1].id
        enqueue_seconds = time.perf_counter() - began
    total = children + (0 if case == "plain" else 2)
    with async_workers(1, Settings(database_url=url, concurrency=100), name="bench") as procs:
        wait_drained(url, total, procs)
    with psycopg.connect(url, autocommit=True) as conn:
        span = _span(conn, min(ids), max(ids))
        if span["jobs"] != children:
            raise RuntimeError(f"only {span['jobs']} of {children} children succeeded")
        out = {"rate": children / span["seconds"], "enqueue_seconds": enqueue_seconds}
        if first is not None and fan_in is not None:
            row = conn.execute(
                "SELECT extract(epoch FROM %s - f.finished_at)::float8,"
                " extract(epoch FROM z.started_at - %s)::float8"
                " FROM pgqueue_jobs f, pgqueue_jobs z WHERE f.id = %s AND z.id = %s",
                (span["first_start"], span["last_finish"], first, fan_in),
            ).fetchone()
            assert row is not None
            out["release_children_seconds"], out["fan_in_start_seconds"] = row
    return out


def run(url: str, *, children: int, rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {case: [] for case in CASES}
    for round_no in range(rounds):
        for case in CASES if round_no % 2 == 0 else reversed(CASES):
            result = _one(url, case, children)
            runs[case].append(result)
            print(f"round {round_no + 1} {case}: {result['rate']:,.0f} jobs/s", flush=True)

    def med(case: str, key: str) -> dict[str, float]:
        return summary([r[key] for r in runs[case]])

    rates = {case: med(case, "rate") for case in CASES}
    # Both cases of a round share its moment of the (shared, noisy) machine:
    # the ratio within each round is the figure, their median the verdict.
    ratios = [w["rate"] / p["rate"] for w, p in zip(runs["workflow"], runs["plain"], strict=True)]
    ratio = summary(ratios)["median"]
    return {
        "parameters": {"children": children, "rounds": rounds, "workers": 1, "concurrency": 100},
        "rates_jobs_per_second": rates,
        "workflow_over_plain": ratio,
        "workflow_over_plain_per_round": ratios,
        "ratio_of_median_rates": rates["workflow"]["median"] / rates["plain"]["median"],
        "target": TARGET,
        "within_target": ratio >= TARGET,
        "release_children_seconds": med("workflow", "release_children_seconds"),
        "fan_in_start_seconds": med("workflow", "fan_in_start_seconds"),
        "enqueue_seconds": {case: med(case, "enqueue_seconds") for case in CASES},
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--children", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    with bench_database("workflows") as url:
        server = server_info(url)
        result = run(url, children=args.children, rounds=args.rounds)
    record = ResultRecord.from_report("workflows", command_line(__spec__, argv), server, result)
    path = write_result(record, args.out)
    rates = result["rates_jobs_per_second"]
    print(
        f"plain {rates['plain']['median']:,.0f} jobs/s, workflow "
        f"{rates['workflow']['median']:,.0f} jobs/s: {result['workflow_over_plain']:.2f} "
        f"(target {TARGET}) -> {path}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
