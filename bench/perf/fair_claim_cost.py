"""A fair queue's claim functions against an earlier migration's, in one
database: what a change to them costs a claim.

    python -m bench.perf.fair_claim_cost [--jobs 20000] [--keys 100] [--wanted 100]
                                         [--calls 60] [--against 0040_fair_claims_overlap]
                                         [--declared 0,10,100,1000] [--out PATH]

On a fresh server, JOBS queued jobs of one queue spread over KEYS
concurrency_keys, analyzed. The functions ``pgqueue_pick_fair`` and
``pgqueue_pick_limited`` as the migration AGAINST defined them are created
beside today's under other names (``earlier_pick_fair``,
``earlier_pick_limited``). For each control setup of SETUPS, each function
picks WANTED jobs, CALLS times, today's and the earlier one in turn (so that
the machine's load weighs on both alike), each call rolled back: the same
jobs every time. Writes each setup's median and minimum milliseconds a call,
and today's over the earlier median, to results/fair_claim_cost.json.

With DECLARED (counts, ascending), the setups are measured again at each
count of key objectives declared on the queue (``declared`` in the
results; ``setups`` is the first count's): half of them on keys that have
queued jobs, the others (and those beyond KEYS) on keys with none, each an
hour long, so that no key is behind and every claim picks the same jobs as
without them. Today's claims probe each declared key once; the earlier
functions know no objectives, so their times are the machine's load at
that count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql

from bench.common import bench_database, clear
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Queue, Settings
from pgqueue.sql import migration_files

QUEUE = "tenants"
# The controls of each setup, and the function a claim of it calls.
SETUPS: dict[str, tuple[dict[str, Any], str]] = {
    "fair": ({"fair": True}, "pick_fair"),
    "fair_concurrency_limit": ({"fair": True, "concurrency_limit": 1_000_000}, "pick_limited"),
    "fair_concurrency_limit_per_key_5": (
        {"fair": True, "concurrency_limit_per_key": 5},
        "pick_limited",
    ),
    "concurrency_limit_per_key_5": ({"concurrency_limit_per_key": 5}, "pick_limited"),
}


def earlier_functions(version: str) -> list[str]:
    """The CREATE statements of the claim functions as migration ``version``
    defined them, renamed ``earlier_*``."""
    [text] = [body for name, body in migration_files() if name == version]
    made = []
    for function in ("pick_fair", "pick_limited"):
        start = text.index(f"FUNCTION pgqueue_{function}(")
        start = text.rindex("CREATE", 0, start)
        body_start = text.index("AS $$", start)
        end = text.index("$$;", body_start + len("AS $$")) + len("$$;")
        made.append(
            text[start:end]
            .replace(f"pgqueue_{function}(", f"earlier_{function}(", 1)
            .replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
        )
    return made


# An hour: the keys' jobs, queued moments ago, are not behind it.
OBJECTIVE_SECONDS = 3600.0


def declared_keys(count: int, keys: int) -> list[str]:
    """The keys of ``count`` objectives: in turn one with queued jobs (k0,
    k1, ... while KEYS last) and one with none (absent0, ...), so that a
    larger count declares a smaller one's keys and more."""
    queued = [f"k{i}" for i in range(min(keys, (count + 1) // 2))]
    absent = [f"absent{i}" for i in range(count - len(queued))]
    turns = [key for pair in zip(queued, absent, strict=False) for key in pair]
    return (turns + queued[len(absent) :] + absent[len(queued) :])[:count]


def _counts(text: str) -> list[int]:
    return sorted({int(n) for n in text.split(",")})


def _time(conn: psycopg.Connection[Any], function: str, wanted: int) -> float:
    began = time.perf_counter()
    query = sql.SQL("SELECT * FROM {}(%s, %s)").format(sql.Identifier(function))
    conn.execute(query, [QUEUE, wanted]).fetchall()
    spent = time.perf_counter() - began
    conn.rollback()
    return spent * 1000


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--wanted", type=int, default=100)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--against", default="0040_fair_claims_overlap")
    parser.add_argument(
        "--declared",
        type=_counts,
        default=None,
        help="counts of key objectives to declare on the queue, each measured (e.g. 0,10,100)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    by_count: dict[int, dict[str, Any]] = {}
    with bench_database("fair_claim_cost") as url:
        info = server_info(url)
        clear(url)
        with Queue(url, settings=Settings(database_url=url)) as q:
            jobs = [
                {"task": "t", "queue": QUEUE, "concurrency_key": f"k{i % args.keys}"}
                for i in range(args.jobs)
            ]
            q.enqueue_many(jobs)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE pgqueue_jobs")
                for statement in earlier_functions(args.against):
                    conn.execute(statement)
            declared: list[str] = []
            for count in args.declared or [0]:
                for key in declared_keys(count, args.keys)[len(declared) :]:
                    q.set_key_objective(QUEUE, key, OBJECTIVE_SECONDS)
                    declared.append(key)
                with psycopg.connect(url, autocommit=True) as conn:
                    # As autovacuum would: the planner knows how many rows.
                    conn.execute("ANALYZE pgqueue_key_objectives")
                by_count[count] = _setups(q, url, args.calls, args.wanted)
    record = ResultRecord(
        name="fair_claim_cost",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "jobs": args.jobs,
            "keys": args.keys,
            "wanted": args.wanted,
            "calls": args.calls,
            "against": args.against,
            **({"declared": args.declared} if args.declared else {}),
            "objective_seconds": OBJECTIVE_SECONDS,
            "setups": {name: controls for name, (controls, _) in SETUPS.items()},
            "machine_state": "shared, not idle (load averages below)",
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
        results={
            "setups": next(iter(by_count.values())),
            **({"declared": {str(n): row for n, row in by_count.items()}} if args.declared else {}),
        },
    )
    path = write_result(record, args.out)
    for count, results in by_count.items():
        for setup, row in results.items():
            print(
                f"{count:>5} declared {setup:>34}: today {row['today']['median_ms']:.2f} ms, "
                f"{args.against} {row['earlier']['median_ms']:.2f} ms "
                f"({row['today_over_earlier']:.2f}x)"
            )
    print(f"written to {path}")
    return record


def _setups(q: Queue, url: str, calls: int, wanted: int) -> dict[str, Any]:
    """Each setup's times a call, today's functions and the earlier ones in turn."""
    results: dict[str, Any] = {}
    for setup, (controls, function) in SETUPS.items():
        off = dict.fromkeys(("fair", "concurrency_limit", "concurrency_limit_per_key"))
        q.set_limits(QUEUE, **{**off, **controls})
        ms: dict[str, list[float]] = {"today": [], "earlier": []}
        with psycopg.connect(url) as conn:
            for _ in range(calls):
                ms["today"].append(_time(conn, f"pgqueue_{function}", wanted))
                ms["earlier"].append(_time(conn, f"earlier_{function}", wanted))
        row: dict[str, Any] = {
            name: {"median_ms": statistics.median(v), "min_ms": min(v)} for name, v in ms.items()
        }
        row["today_over_earlier"] = row["today"]["median_ms"] / row["earlier"]["median_ms"]
        results[setup] = row
    return results


if __name__ == "__main__":
    main()
