"""The invariants every fault test checks after its run.

    python -m harness.invariants URL [--allow-queued] [--allow-pruned]

Reads ``pgqueue_jobs``, ``pgqueue_counters`` and the ``fault_deliveries``
rows that ``harness.fault_tasks`` handlers write, and checks:

1. every job is finished (succeeded, dead, cancelled), or queued when the
   run leaves jobs queued on purpose; none is left running;
2. attempts <= max_attempts;
3. no job is both succeeded and dead: a succeeded job has a result and no
   later failure, a dead one has no result; and the outcome counters agree
   with the rows (no job was acked twice, none counted both ways);
4. every delivery row belongs to a job (or, with retention pruning on, to a
   job this run enqueued), names an attempt that was made, and no fencing
   token was delivered twice (the handler ran at most once per claim);
5. every succeeded job's result was produced by its last delivery: the
   result's token and attempt are those of the job's last delivery (the
   highest attempt), the job's final lease token and its attempt count.

``check`` returns a ``Report``; ``Report.assert_ok()`` raises with every
violation listed (at most 20 of each kind).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

__all__ = ["Report", "check"]

FINISHED = ("succeeded", "dead", "cancelled")
MAX_LISTED = 20


@dataclass
class Report:
    """What the checker found: counts, and every broken invariant."""

    jobs: int = 0
    states: dict[str, int] = field(default_factory=dict)
    deliveries: int = 0
    jobs_delivered: int = 0
    duplicate_deliveries: int = 0  # deliveries beyond the first, summed over jobs
    max_deliveries_per_job: int = 0
    attempts: int = 0  # claims, summed over jobs still in the table
    failed_attempts: int = 0  # from the outcome counters (handler errors and expired leases)
    lease_expiries_last_error: int = 0  # jobs whose last error is an expired lease
    counters: dict[str, int] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, kind: str, message: str) -> None:
        self.violations.setdefault(kind, []).append(message)

    def assert_ok(self) -> None:
        if self.ok:
            return
        lines = []
        for kind, messages in self.violations.items():
            lines.append(f"{kind}: {len(messages)}")
            lines.extend(f"  {m}" for m in messages[:MAX_LISTED])
        raise AssertionError("invariants broken:\n" + "\n".join(lines))

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "jobs": self.jobs,
            "states": self.states,
            "deliveries": self.deliveries,
            "jobs_delivered": self.jobs_delivered,
            "duplicate_deliveries": self.duplicate_deliveries,
            "max_deliveries_per_job": self.max_deliveries_per_job,
            "attempts": self.attempts,
            "failed_attempts": self.failed_attempts,
            "lease_expiries_last_error": self.lease_expiries_last_error,
            "counters": self.counters,
            "violations": {k: v[:MAX_LISTED] for k, v in self.violations.items()},
        }


Row = dict[str, Any]


def check(
    url: str,
    *,
    allow_queued: bool = False,
    enqueued_ids: Iterable[int] | None = None,
    pruned: bool = False,
) -> Report:
    """Check the database at ``url`` after a run (no worker may be running).

    ``allow_queued``: jobs left queued are legitimate (e.g. a shutdown test
    enqueues work that must not be claimed). ``enqueued_ids``: the ids the
    run enqueued; each must still be in the table unless ``pruned`` (then a
    missing id must have been delivered and counted as succeeded, since only
    finished jobs are pruned).
    """
    jobs, counters, deliveries = _snapshot(url)
    report = _counts(jobs, counters, deliveries)
    per_job: dict[int, list[Row]] = {}
    for d in deliveries:
        per_job.setdefault(d["job_id"], []).append(d)
    _check_jobs(report, jobs, allow_queued)
    _check_counters(report, pruned)
    by_id = {row["id"]: row for row in jobs}
    known = set(enqueued_ids) if enqueued_ids is not None else None
    _check_deliveries(report, by_id, per_job, known, pruned)
    if known is not None:
        _check_enqueued(report, by_id, per_job, known, pruned)
    if deliveries:
        _check_results(report, jobs, per_job)
    return report


def _snapshot(url: str) -> tuple[list[Row], Row, list[Row]]:
    """Jobs, summed counters and deliveries, read in one consistent snapshot."""
    with (
        psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn,
        conn.transaction(),
    ):
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        jobs = conn.execute(
            "SELECT id, state, attempts, max_attempts, lease_token, result, last_error,"
            " finished_at FROM pgqueue_jobs"
        ).fetchall()
        counters = conn.execute(
            "SELECT coalesce(sum(succeeded), 0)::bigint AS succeeded,"
            " coalesce(sum(failed), 0)::bigint AS failed,"
            " coalesce(sum(dead), 0)::bigint AS dead,"
            " coalesce(sum(cancelled), 0)::bigint AS cancelled FROM pgqueue_counters"
        ).fetchone()
        has_deliveries = conn.execute(
            "SELECT to_regclass('fault_deliveries') IS NOT NULL AS present"
        ).fetchone()
        deliveries = (
            conn.execute(
                "SELECT job_id, attempt, token, worker_pid FROM fault_deliveries ORDER BY id"
            ).fetchall()
            if has_deliveries and has_deliveries["present"]
            else []
        )
    assert counters is not None
    return jobs, counters, deliveries


def _counts(jobs: list[Row], counters: Row, deliveries: list[Row]) -> Report:
    report = Report()
    report.counters = {k: int(v) for k, v in counters.items()}
    report.failed_attempts = report.counters["failed"]
    report.jobs = len(jobs)
    report.states = dict(Counter(row["state"] for row in jobs))
    report.attempts = sum(row["attempts"] for row in jobs)
    report.deliveries = len(deliveries)
    report.lease_expiries_last_error = sum(
        1 for row in jobs if (row["last_error"] or "").startswith("lease expired")
    )
    return report


def _check_jobs(report: Report, jobs: list[Row], allow_queued: bool) -> None:
    """1-3: each job on its own."""
    for row in jobs:
        jid, state = row["id"], row["state"]
        if state == "running" or (state == "queued" and not allow_queued):
            report.add("not_finished", f"job {jid} is {state} (attempts {row['attempts']})")
        if state not in (*FINISHED, "queued", "running"):
            report.add("bad_state", f"job {jid} has state {state!r}")
        if row["attempts"] > row["max_attempts"]:
            report.add("too_many_attempts", f"job {jid}: {row['attempts']} > {row['max_attempts']}")
        if state == "succeeded" and (row["finished_at"] is None or row["attempts"] < 1):
            report.add("succeeded_incomplete", f"job {jid}: succeeded without a finished attempt")
        if state == "dead" and row["result"] is not None:
            report.add("dead_with_result", f"job {jid} is dead but holds a result")


def _check_counters(report: Report, pruned: bool) -> None:
    """3: the counters agree with the rows, so nothing was counted twice or
    counted both succeeded and dead. (Pruned rows are gone, the counters are not.)"""
    for outcome in FINISHED:
        counted, present = report.counters[outcome], report.states.get(outcome, 0)
        if counted < present or (not pruned and counted != present):
            report.add(
                "counters_disagree", f"{outcome}: counters say {counted}, the table has {present}"
            )


def _check_deliveries(
    report: Report,
    by_id: dict[int, Row],
    per_job: dict[int, list[Row]],
    known: set[int] | None,
    pruned: bool,
) -> None:
    """4: every delivery belongs to a job and an attempt that was made, and
    no claim (token, attempt) was delivered twice."""
    for jid, delivered in per_job.items():
        job = by_id.get(jid)
        if job is None:
            if not pruned or known is None or jid not in known:
                report.add("orphan_delivery", f"delivery for job {jid}, which does not exist")
            continue
        for d in delivered:
            if d["attempt"] > job["attempts"]:
                report.add(
                    "delivery_attempt",
                    f"job {jid}: delivery of attempt {d['attempt']} > attempts {job['attempts']}",
                )
        for key in ("token", "attempt"):
            for value, n in Counter(d[key] for d in delivered).items():
                if n > 1:
                    report.add(
                        "claim_delivered_twice", f"job {jid}: {key} {value} delivered {n} times"
                    )
    report.jobs_delivered = len(per_job)
    report.duplicate_deliveries = sum(len(d) - 1 for d in per_job.values())
    report.max_deliveries_per_job = max((len(d) for d in per_job.values()), default=0)


def _check_enqueued(
    report: Report,
    by_id: dict[int, Row],
    per_job: dict[int, list[Row]],
    known: set[int],
    pruned: bool,
) -> None:
    """4: every job the run enqueued is still there, or was delivered before
    retention pruned it."""
    for jid in known:
        if jid in by_id:
            continue
        if not pruned:
            report.add("lost", f"job {jid} was enqueued and is gone")
        elif jid not in per_job:
            report.add("lost", f"job {jid} is gone (pruned?) but was never delivered")


def _check_results(report: Report, jobs: list[Row], per_job: dict[int, list[Row]]) -> None:
    """5: a succeeded job's result comes from its last delivery."""
    for row in jobs:
        if row["state"] != "succeeded":
            continue
        jid = row["id"]
        delivered = per_job.get(jid)
        if not delivered:
            report.add("succeeded_undelivered", f"job {jid} succeeded with no delivery row")
            continue
        # Tokens are unique but not ordered (the sequence caches values per
        # session); the attempt number orders the claims of one job.
        last = max(delivered, key=lambda d: d["attempt"])
        result = row["result"] if isinstance(row["result"], dict) else {}
        if not (
            result.get("token") == last["token"] == row["lease_token"]
            and result.get("attempt") == last["attempt"] == row["attempts"]
        ):
            report.add(
                "result_not_last_delivery",
                f"job {jid}: result {result}, last delivery token {last['token']} attempt "
                f"{last['attempt']}, job token {row['lease_token']} attempts {row['attempts']}",
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--allow-queued", action="store_true")
    parser.add_argument("--allow-pruned", action="store_true")
    args = parser.parse_args(argv)
    report = check(args.url, allow_queued=args.allow_queued, pruned=args.allow_pruned)
    print(json.dumps(report.as_dict(), indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())


def dependency_violations(url: str) -> list[str]:
    """Workflows: every edge of pgqueue_job_deps whose child was delivered
    (its handler started) before its parent finished, or whose parent did
    not succeed although the child did. Times are the database's clock."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT e.parent, e.child, p.state, p.finished_at, c.state, first.at"
            " FROM pgqueue_job_deps e"
            " JOIN pgqueue_jobs p ON p.id = e.parent JOIN pgqueue_jobs c ON c.id = e.child"
            " LEFT JOIN LATERAL (SELECT min(d.at) AS at FROM fault_deliveries d"
            "                    WHERE d.job_id = e.child) first ON true"
            " WHERE (first.at IS NOT NULL AND (p.finished_at IS NULL OR first.at < p.finished_at))"
            "    OR (c.state = 'succeeded' AND p.state <> 'succeeded')"
        ).fetchall()
    return [
        f"job {child} ({child_state}, first started {at}) depends on job {parent} "
        f"({parent_state}, finished {finished})"
        for parent, child, parent_state, finished, child_state, at in rows
    ]
