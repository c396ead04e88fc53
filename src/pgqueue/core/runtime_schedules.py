"""Schedules created and changed at run time (``Queue.create_schedule``,
``POST /schedules``, ``pgqueue schedules create``), and "run now" for any
schedule. I/O-free flows, driven like those of ``schedules``.

A runtime schedule is a row of pgqueue_schedules like one declared in code,
with ``origin = 'runtime'``: the same scheduler loop fires its ticks, under
the same exactly-once key ``pgqueue:schedule:NAME@TICK``. Each name belongs
to one origin:

- a create of a name already in the table (declared in code, or created
  before) is refused with ScheduleConflict, and nothing is written;
- a worker whose code declares a name that a runtime schedule holds leaves
  that schedule as it is (its start logs ``schedule_shadowed``), and never
  retires a runtime schedule;
- an update of a schedule declared in code is refused (ScheduleConflict):
  the next worker start would write the code's definition back.

"Run now" enqueues one job under the key ``pgqueue:schedule-now:NAME@SECOND``
(the database's clock, to the second): the same request twice within one
second enqueues one job (the second call returns it, ``duplicate`` True);
calls a second or more apart enqueue one job each. The schedule's next tick
does not move; the job becomes its last run.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from .errors import InvalidSchedule, ScheduleConflict, ScheduleNotFound
from .flows import Flow, Row, Statement, db_now
from .jobs import Job
from .schedules import Schedule, ScheduleRecord, stored_row
from .ticks import next_tick

__all__ = ["FIELDS", "RUN_KEY_PREFIX", "create", "run_key", "run_now", "update"]

# What create and update take, besides the name (Schedule.create's arguments).
FIELDS = (
    "task",
    "cron",
    "every",
    "tz",
    "payload",
    "queue",
    "priority",
    "max_attempts",
    "timeout",
    "catch_up",
    "catch_up_limit",
)
RUN_KEY_PREFIX = "pgqueue:schedule-now:"
_SECOND_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def run_key(name: str, now: datetime) -> str:
    """The idempotency key of a schedule's "run now" job at ``now`` (to the second)."""
    return f"{RUN_KEY_PREFIX}{name}@{now.astimezone(UTC).strftime(_SECOND_FORMAT)}"


def _taken(name: str, origin: str) -> ScheduleConflict:
    holder = "a schedule declared in a worker's code" if origin == "code" else "a runtime schedule"
    return ScheduleConflict(name, "name", f"is taken by {holder}")


def create(schedule: Schedule, *, enabled: bool = True) -> Flow[ScheduleRecord]:
    """Store a runtime schedule; it starts at its first tick after now.
    ScheduleConflict when the name is in the table (nothing is written)."""
    now = (yield from db_now()).astimezone(UTC)
    params = stored_row(schedule, next_tick(schedule.timing, now))
    rows = yield Statement("schedule_create", {**params, "enabled": enabled})
    if not rows:
        held = yield Statement("schedule_get", {"name": schedule.name})
        raise _taken(schedule.name, held[0]["origin"] if held else "runtime")
    return ScheduleRecord.from_row(rows[0])


def update(name: str, changes: Mapping[str, Any]) -> Flow[ScheduleRecord]:
    """Change some fields of a runtime schedule (the names of FIELDS); the
    others stay. A changed timing (cron, every, tz) starts again from its
    first tick after now, by the database's clock; any other change keeps
    the planned tick. Run in one transaction (the row is locked from the
    read to the write). Raises InvalidSchedule (no field, an unknown one, a
    bad value), ScheduleNotFound, or ScheduleConflict for a schedule
    declared in code; nothing is written in each case."""
    unknown = sorted(set(changes) - set(FIELDS))
    if unknown:
        raise InvalidSchedule(name, unknown[0], "is not a field of a schedule")
    if not changes:
        raise InvalidSchedule(name, "changes", "give at least one field to change")
    rows = yield Statement("schedule_lock", {"name": name})
    if not rows:
        raise ScheduleNotFound(name)
    row = rows[0]
    if row["origin"] != "runtime":
        raise ScheduleConflict(
            name,
            "origin",
            "is declared in a worker's code: change it there (a worker's start writes "
            "the code's definition back)",
        )
    schedule = Schedule.create(name, **_merged(name, row, changes))
    timing = (schedule.cron, schedule.every_seconds, schedule.tz)
    next_run_at = row["next_run_at"]
    if timing != (row["cron"], row["every_seconds"], row["tz"]) or next_run_at is None:
        next_run_at = next_tick(schedule.timing, row["now"].astimezone(UTC))
    rows = yield Statement("schedule_update", stored_row(schedule, next_run_at))
    return ScheduleRecord.from_row(rows[0])


def _merged(name: str, row: Row, changes: Mapping[str, Any]) -> dict[str, Any]:
    """Schedule.create's arguments: the row's, with ``changes`` over them. A
    new cron or every replaces the timing (tz stays only from cron to cron)."""
    merged: dict[str, Any] = {
        "task": row["task"],
        "payload": row["payload"],
        "queue": row["queue"],
        "priority": row["priority"],
        "max_attempts": row["max_attempts"],
        "timeout": row["timeout_seconds"],
        "catch_up": row["catch_up"],
        "catch_up_limit": row["catch_up_limit"],
        "cron": row["cron"],
        "every": row["every_seconds"],
        "tz": row["tz"],
    }
    cron, every = changes.get("cron"), changes.get("every")
    if cron is not None and every is not None:
        raise InvalidSchedule(name, "cron", "give cron or every, not both")
    if cron is not None:
        merged.update(every=None, tz=row["tz"] if row["cron"] is not None else None)
    elif every is not None:
        merged.update(cron=None, tz=None)
    merged.update({k: v for k, v in changes.items() if k not in ("cron", "every") or v is not None})
    return merged


def run_now(name: str, default_max_attempts: int) -> Flow[Job]:
    """Enqueue one job of the schedule now (enabled or not), as its tick
    would; it becomes the schedule's last run. Within the same second, the
    job already enqueued is returned (``duplicate`` True)."""
    rows = yield Statement("schedule_get", {"name": name})
    if not rows:
        raise ScheduleNotFound(name)
    key = run_key(name, rows[0]["now"])
    params = {"name": name, "key": key, "default_max_attempts": default_max_attempts}
    rows = yield Statement("schedule_run_now", params)
    if not rows:  # deleted meanwhile
        raise ScheduleNotFound(name)
    if rows[0]["id"] is not None:
        return Job.from_row(rows[0])
    found = yield Statement("job_get_by_idempotency_key", {"idempotency_key": key})
    if not found:  # its job was deleted within the same second
        raise ScheduleConflict(name, "run", "run it again in a second")
    return Job.from_row(found[0], duplicate=True)
