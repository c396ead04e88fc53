"""Queue controls: pause, concurrency limits and rate limits, per queue.

They live in the table ``pgqueue_queues`` (migration 0005), one row per
queue that has ever had one, and the claim statement (``job_claim``) obeys
them: a paused queue is left out of every claim from the moment the change
commits; a limited queue is claimed under its own lock, within its limits
(``pgqueue_pick_limited``). Nothing here runs per claim.

    paused                     no job of the queue starts; running jobs finish
    concurrency_limit          at most this many of its jobs run at once, on all workers
    concurrency_limit_per_key  ... and at most this many with one concurrency_key
    rate_limit                 at most this many start within any rate_period_seconds
    rate_limit_per_key         ... and at most this many with one concurrency_key
    rate_period_seconds        the window of both rate limits (given with them)
    fair                       slots shared round robin across concurrency_key values
    max_start_lag_seconds      its latency objective: the longest a runnable job should
                               wait to start; workers of several queues claim first
                               from the queues furthest behind theirs

``change(queue, changes)`` is the one way to set them (the library's
``pause``, ``resume`` and ``set_limits``, the HTTP API and the command line
all use it): a limit given as None is removed, a limit not given stays.
Errors name the field (``InvalidQueueControl``) and write nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

from .errors import InvalidJob, InvalidQueueControl
from .flows import Flow, Statement
from .jobs import QUEUE_NAME
from .json_text import printable
from .rules import Integer, Name, Rule, Seconds, Switch

__all__ = ["CONTROLS", "LIMITS", "QueueControls", "change", "checked", "read_all"]

MAX_LIMIT = 1_000_000
MAX_PERIOD_SECONDS = 366 * 24 * 3600.0

# Each limit, the rule its value passes, and what it means.
LIMITS: dict[str, tuple[Rule, str]] = {
    "concurrency_limit": (
        Integer(1, MAX_LIMIT),
        "At most this many of the queue's jobs run at once, across every worker.",
    ),
    "concurrency_limit_per_key": (
        Integer(1, MAX_LIMIT),
        "At most this many of the queue's jobs with one concurrency_key run at once.",
    ),
    "rate_limit": (
        Integer(1, MAX_LIMIT),
        "At most this many of the queue's jobs start within any window of rate_period_seconds.",
    ),
    "rate_limit_per_key": (
        Integer(1, MAX_LIMIT),
        "At most this many of the queue's jobs with one concurrency_key start within any "
        "window of rate_period_seconds.",
    ),
    "rate_period_seconds": (
        Seconds(0.0, MAX_PERIOD_SECONDS, exclusive_low=True),
        "The window of the rate limits; needed with them, removed with them.",
    ),
    "fair": (
        Switch(),
        "Share the queue's slots across its jobs' concurrency_key values, round robin: every "
        "key's next job starts before any key's second (false or null: claim order).",
    ),
    "max_start_lag_seconds": (
        Seconds(0.0, MAX_PERIOD_SECONDS, exclusive_low=True),
        "The queue's latency objective: the longest its runnable jobs should wait to start. "
        "A worker of several queues claims first from those furthest behind their objective.",
    ),
}
CONTROLS = ("paused", *LIMITS)
_QUEUE = Name(QUEUE_NAME)


@dataclass(frozen=True, slots=True)
class QueueControls:
    """A queue's controls. None means no such limit."""

    queue: str
    paused: bool = False
    concurrency_limit: int | None = None
    concurrency_limit_per_key: int | None = None
    rate_limit: int | None = None
    rate_limit_per_key: int | None = None
    rate_period_seconds: float | None = None
    fair: bool | None = None
    max_start_lag_seconds: float | None = None
    updated_at: datetime | None = None

    @property
    def limited(self) -> bool:
        return any(getattr(self, name) is not None for name in LIMITS)

    def limits(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in LIMITS}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, in the shape the HTTP API answers with: the limits in
        an object of their own, the update time as ISO 8601."""
        return {
            "queue": self.queue,
            "paused": self.paused,
            "limits": self.limits(),
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> QueueControls:
        names = [f.name for f in fields(cls) if f.name != "queue"]
        return cls(row["name"], **{name: row[name] for name in names})


def change(
    queue: str, changes: Mapping[str, Any], *, allowed: Collection[str] = CONTROLS
) -> Flow[QueueControls]:
    """Set some of a queue's controls (``allowed``: by default ``paused`` and
    the names of LIMITS; a limit given as None is removed). Run it in a
    transaction: it locks the queue's row, so that two changes at once
    cannot undo each other."""
    queue = checked("queue", queue, _QUEUE)
    given = {name: _check(name, value, allowed) for name, value in changes.items()}
    rows = yield Statement("queue_controls_lock", {"queue": queue})
    wanted = replace(QueueControls.from_row(rows[0]), **given)
    if wanted.rate_limit is None and wanted.rate_limit_per_key is None:
        if given.get("rate_period_seconds") is not None:
            raise InvalidQueueControl(
                "rate_period_seconds", "is the window of a rate limit: give rate_limit too"
            )
        wanted = replace(wanted, rate_period_seconds=None)
    elif wanted.rate_period_seconds is None:
        raise InvalidQueueControl(
            "rate_period_seconds", "missing: a rate limit is a number of starts per period"
        )
    rows = yield Statement(
        "queue_controls_write", {"queue": queue, "paused": wanted.paused, **wanted.limits()}
    )
    return QueueControls.from_row(rows[0])


def read_all() -> Flow[dict[str, QueueControls]]:
    """The controls of every queue that has a row, by name."""
    rows = yield Statement("queue_controls", {})
    return {row["name"]: QueueControls.from_row(row) for row in rows}


def _check(name: str, value: Any, allowed: Collection[str]) -> Any:
    if name not in allowed:
        known = ", ".join(allowed)
        raise InvalidQueueControl(printable(str(name))[:80], f"unknown (known: {known})")
    if name == "paused":
        if not isinstance(value, bool):
            raise InvalidQueueControl(name, f"must be true or false, got {type(value).__name__}")
        return value
    return None if value is None else checked(name, value, LIMITS[name][0])


def checked(name: str, value: Any, rule: Rule) -> Any:
    """The rule's check, its error as one about a queue control."""
    try:
        return rule.check(name, value)
    except InvalidJob as exc:
        raise InvalidQueueControl(exc.field, exc.problem) from None
