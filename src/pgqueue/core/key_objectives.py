"""Per-key latency objectives: in a fair queue, the longest the runnable
jobs of one concurrency_key (a tenant) should wait to start.

They live in ``pgqueue_key_objectives`` (migration 0042), one row per
(queue, key) an operator declared. A fair queue's claim (``pgqueue_pick_fair``
and ``pgqueue_pick_limited``) takes first the jobs of its keys whose next job
has waited at least half of their objective, the furthest behind first, then
the other keys round robin; per-key limits still hold. In a queue that is
not fair an objective is kept but weighs nothing.

``set_objective`` is the one way to write them (the library's
``set_key_objective``, the HTTP API and the command line use it): None
removes one. ``read`` lists them with the wait the claim weighs (the key's
next job's, on the database's clock) and the shortfall. Errors name the
field (``InvalidQueueControl``) and write nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .flows import Flow, Statement
from .jobs import MAX_KEY_LENGTH, QUEUE_NAME
from .queue_controls import LIMITS, checked
from .rules import Key, Name, Rule

__all__ = ["RULES", "KeyObjective", "read", "removed", "set_objective"]

# Each argument and the rule its value passes: the objective's as the
# queue's own objective's.
RULES: dict[str, Rule] = {
    "queue": Name(QUEUE_NAME),
    "key": Key(MAX_KEY_LENGTH),
    "max_start_lag_seconds": LIMITS["max_start_lag_seconds"][0],
}


@dataclass(frozen=True, slots=True)
class KeyObjective:
    """One key's objective, and how long its next job has waited (0: none
    is runnable)."""

    queue: str
    key: str
    max_start_lag_seconds: float
    wait_seconds: float

    @property
    def shortfall_seconds(self) -> float:
        """How far the wait is past the objective (0: within it)."""
        return max(0.0, self.wait_seconds - self.max_start_lag_seconds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "key": self.key,
            "max_start_lag_seconds": self.max_start_lag_seconds,
            "wait_seconds": self.wait_seconds,
            "shortfall_seconds": self.shortfall_seconds,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> KeyObjective:
        return cls(
            row["queue"], row["key"], row["max_start_lag_seconds"], float(row["wait_seconds"])
        )


def set_objective(
    queue: str, key: str, max_start_lag_seconds: float | None
) -> Flow[KeyObjective | None]:
    """Declare (or, with None, remove) ``key``'s objective in ``queue``; the
    objective as the claims now weigh it (None: removed)."""
    params = {name: _checked(name, value) for name, value in (("queue", queue), ("key", key))}
    if max_start_lag_seconds is None:
        yield Statement("key_objective_remove", params)
        return None
    seconds = _checked("max_start_lag_seconds", max_start_lag_seconds)
    yield Statement("key_objective_set", {**params, "max_start_lag_seconds": seconds})
    return next(o for o in (yield from read(queue)) if o.key == key)


def removed(queue: str, key: str) -> dict[str, Any]:
    """What a removal answers (the HTTP API, the command line's --json):
    ``KeyObjective.to_dict``'s keys, the objective and its numbers null."""
    numbers = dict.fromkeys(("max_start_lag_seconds", "wait_seconds", "shortfall_seconds"))
    return {"queue": queue, "key": key, **numbers}


def read(queue: str | None = None) -> Flow[list[KeyObjective]]:
    """The objectives of ``queue`` (None: of every queue), by queue and key."""
    if queue is not None:
        queue = _checked("queue", queue)
    rows = yield Statement("key_objective_list", {"queue": queue})
    return [KeyObjective.from_row(row) for row in rows]


def _checked(name: str, value: Any) -> Any:
    return checked(name, value, RULES[name])
