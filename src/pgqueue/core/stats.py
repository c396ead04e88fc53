"""Per-queue numbers: the API's ``GET /queues`` and the command line's
``queues`` and ``top``.

``per_queue()`` is a flow of three cheap reads in one REPEATABLE READ READ ONLY
snapshot (so they agree and share one now()), merged per queue:

    queue_stats        live jobs: the partial indexes of queued, running and
                       waiting rows, never the history
    counters_totals    outcome totals, written by the transitions themselves,
                       so pruning does not lower them
    queue_throughput   what ended within the window: a range read of the
                       finished-rows index
    queue_controls     pause and limits (pgqueue_queues, one row per queue
                       that has any)

Run it with ``transaction=True`` (``snapshot_begin`` must open the
transaction): ``queue.run(per_queue(), transaction=True)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .flows import Flow, Statement
from .queue_controls import QueueControls

__all__ = ["THROUGHPUT_WINDOW_SECONDS", "QueueStats", "per_queue", "total"]

THROUGHPUT_WINDOW_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue (or all of them) at one moment."""

    # Live, now.
    queued: int = 0  # runnable now
    scheduled: int = 0  # waiting for their run_at
    running: int = 0
    waiting: int = 0  # for the jobs they depend on (workflows)
    oldest_runnable_seconds: float = 0.0
    # Totals since the queue began; ``failed`` counts failed attempts,
    # ``snoozed`` the snoozes handlers asked for (neither failures nor attempts).
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    cancelled: int = 0
    snoozed: int = 0
    # Ended within the last THROUGHPUT_WINDOW_SECONDS (cancels are not work done).
    succeeded_last_minute: int = 0
    dead_last_minute: int = 0
    # Pause and limits (None: the queue never had any).
    controls: QueueControls | None = None

    @property
    def finished_last_minute(self) -> int:
        return self.succeeded_last_minute + self.dead_last_minute

    @property
    def paused(self) -> bool:
        return self.controls is not None and self.controls.paused

    def limits(self) -> dict[str, Any]:
        """Each limit (None: none), as ``controls.LIMITS`` names them."""
        return (self.controls or QueueControls("")).limits()

    @property
    def start_lag_shortfall_seconds(self) -> float | None:
        """How far the oldest runnable job's wait is past the queue's latency
        objective (0: within it; None: the queue has none)."""
        objective = self.controls.max_start_lag_seconds if self.controls else None
        return None if objective is None else max(0.0, self.oldest_runnable_seconds - objective)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        del values["controls"]
        recent = {name: values.pop(name) for name in ("succeeded_last_minute", "dead_last_minute")}
        return {
            **values,
            "finished_last_minute": self.finished_last_minute,
            **recent,
            "start_lag_shortfall_seconds": self.start_lag_shortfall_seconds,
            "paused": self.paused,
            "limits": self.limits(),
        }


def per_queue() -> Flow[dict[str, QueueStats]]:
    """Every queue with live jobs, counted outcomes or controls, by name, in
    name order."""
    yield Statement("snapshot_begin", {})
    live = yield Statement("queue_stats", {})
    totals = yield Statement("counters_totals", {})
    recent = yield Statement("queue_throughput", {"window_seconds": THROUGHPUT_WINDOW_SECONDS})
    controls = yield Statement("queue_controls", {})
    fields: dict[str, dict[str, Any]] = {}
    for row in live:
        fields.setdefault(row["queue"], {}).update(
            queued=int(row["queued"]),
            scheduled=int(row["scheduled"]),
            running=int(row["running"]),
            waiting=int(row["waiting"]),
            oldest_runnable_seconds=float(row["oldest_runnable_seconds"]),
        )
    for row in totals:
        fields.setdefault(row["queue"], {}).update(
            {
                name: int(row[name])
                for name in ("succeeded", "failed", "dead", "cancelled", "snoozed")
            }
        )
    for row in recent:
        fields.setdefault(row["queue"], {}).update(
            succeeded_last_minute=int(row["succeeded"]), dead_last_minute=int(row["dead"])
        )
    for row in controls:
        fields.setdefault(row["name"], {})["controls"] = QueueControls.from_row(row)
    return {name: QueueStats(**fields[name]) for name in sorted(fields)}


def total(rows: Iterable[QueueStats]) -> QueueStats:
    """All queues together: counts add up, the oldest wait is the longest."""
    rows = list(rows)
    sums = {
        f.name: sum(getattr(row, f.name) for row in rows)
        for f in dataclasses.fields(QueueStats)
        if f.name not in ("oldest_runnable_seconds", "controls")
    }
    oldest = max((row.oldest_runnable_seconds for row in rows), default=0.0)
    return QueueStats(oldest_runnable_seconds=oldest, **sums)
