"""The per-queue picture of ``pgqueue queues`` and ``pgqueue top``.

Three cheap reads, merged per queue: live counts (queue_stats, from the
partial indexes of queued and running rows), outcome totals (the counters,
which survive pruning) and what ended in the last minute (queue_throughput,
a range read of the finished-rows index).
"""

from __future__ import annotations

from typing import Any

from ..queue import Queue

__all__ = ["THROUGHPUT_WINDOW_SECONDS", "queue_rows"]

THROUGHPUT_WINDOW_SECONDS = 60.0
_ZERO: dict[str, Any] = {
    "queued": 0,
    "scheduled": 0,
    "running": 0,
    "oldest_runnable_seconds": 0.0,
    "succeeded": 0,
    "failed": 0,
    "dead": 0,
    "cancelled": 0,
    "finished_last_minute": 0,
    "succeeded_last_minute": 0,
    "dead_last_minute": 0,
}


def queue_rows(queue: Queue) -> list[dict[str, Any]]:
    """One row per queue, sorted by name, then a total row (queue None)."""
    live = queue.read("queue_stats")
    totals = queue.read("counters_totals")
    recent = queue.read("queue_throughput", window_seconds=THROUGHPUT_WINDOW_SECONDS)
    rows: dict[str, dict[str, Any]] = {}

    def row(name: str) -> dict[str, Any]:
        return rows.setdefault(name, {"queue": name, **_ZERO})

    for r in live:
        row(r["queue"]).update(
            queued=int(r["queued"]),
            scheduled=int(r["scheduled"]),
            running=int(r["running"]),
            oldest_runnable_seconds=float(r["oldest_runnable_seconds"]),
        )
    for r in totals:
        row(r["queue"]).update(
            succeeded=int(r["succeeded"]),
            failed=int(r["failed"]),
            dead=int(r["dead"]),
            cancelled=int(r["cancelled"]),
        )
    for r in recent:
        # Throughput: jobs that workers brought to an end (cancels are not work done).
        row(r["queue"]).update(
            finished_last_minute=int(r["succeeded"]) + int(r["dead"]),
            succeeded_last_minute=int(r["succeeded"]),
            dead_last_minute=int(r["dead"]),
        )
    ordered = [rows[name] for name in sorted(rows)]
    total: dict[str, Any] = {"queue": None}
    for key, zero in _ZERO.items():
        values = [r[key] for r in ordered]
        total[key] = (
            max(values, default=0.0)
            if key == "oldest_runnable_seconds"
            else sum(values, type(zero)())
        )
    return [*ordered, total]
