"""Periodic jobs: what a schedule is, and the flows that store and fire
schedules (I/O-free generators, driven like those of transitions.py).

A schedule enqueues one job per tick of its timing: a cron expression in a
time zone, or every N seconds (``ticks.py`` says when each ticks, daylight
saving time included). Ticks are planned from the database's clock alone:
each flow reads now() from PostgreSQL and computes from it.

    code ──sync──> pgqueue_schedules ──fire, once per tick──> a job whose
                   (one row each)                              idempotency key is
                                                               pgqueue:schedule:NAME@TICK
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from .errors import InvalidJob, InvalidSchedule, ScheduleNotFound
from .flows import Flow, Statement, db_now
from .job_spec import JobSpec
from .jobs import TASK_NAME, Job
from .ticks import CATCH_UP_MODES, Cadence, CatchUp, Plan, cadence, next_tick, plan

__all__ = [
    "Fired",
    "Origin",
    "Schedule",
    "ScheduleRecord",
    "Status",
    "Synced",
    "delete",
    "fire_due",
    "key",
    "list_schedules",
    "next_due",
    "set_enabled",
    "stored_row",
    "sync",
    "tick_of",
]

Status = Literal["enabled", "disabled", "retired"]
Origin = Literal["code", "runtime"]
DEFAULT_CATCH_UP_LIMIT = 100
MAX_CATCH_UP_LIMIT = 10_000
MAX_EVERY_SECONDS = 366 * 24 * 3600
MAX_CRON_LENGTH = 200
KEY_PREFIX = "pgqueue:schedule:"
# Due schedules fired per round of the scheduler.
DUE_BATCH = 100
_TICK_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def _utc(moment: datetime) -> datetime:
    """A time from the database in UTC. psycopg gives the session's zone, and
    two times of one zone compare by wall clock, wrong across a DST change."""
    return moment.astimezone(UTC)


# -- a schedule ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Schedule:
    """A validated schedule: build it with ``Schedule.create`` (or
    ``TaskRegistry.periodic``, ``@task(cron=...)``)."""

    name: str
    task: str
    cron: str | None
    every_seconds: int | None
    tz: str
    payload_json: str
    queue: str
    priority: int
    max_attempts: int | None
    timeout_seconds: float | None
    catch_up: CatchUp
    catch_up_limit: int

    @classmethod
    def create(
        cls,
        name: str,
        *,
        task: str | None = None,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str | None = None,
        payload: Mapping[str, Any] | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int | None = None,
        timeout: float | None = None,
        catch_up: CatchUp = "last",
        catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT,
    ) -> Schedule:
        """Check every argument; raise InvalidSchedule naming the bad one.
        ``task`` defaults to ``name``; give ``cron`` (with ``tz``, default
        UTC) or ``every`` (whole seconds, or a timedelta); max_attempts None
        means the firing worker's default_max_attempts setting."""
        if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
            raise InvalidSchedule(str(name)[:80], "name", f"must match {TASK_NAME.pattern}")
        job = {
            "task": name if task is None else task,
            "payload": {} if payload is None else payload,
            "queue": queue,
            "priority": priority,
            "max_attempts": max_attempts,
            "timeout": timeout,
        }
        try:  # the job's fields, by the rules of every job (jobs.JOB_FIELDS)
            spec = JobSpec.from_fields(job)
        except InvalidJob as exc:
            raise InvalidSchedule(name, exc.field, exc.problem) from None
        expr, seconds, zone = _timing(name, cron, every, tz)
        cadence(name, expr, seconds, zone)
        _check_catch_up(name, catch_up, catch_up_limit)
        return cls(
            name,
            spec.task,
            expr,
            seconds,
            zone,
            spec.payload_json,
            spec.queue,
            spec.priority,
            None if max_attempts is None else spec.max_attempts,
            spec.timeout_seconds,
            catch_up,
            catch_up_limit,
        )

    @property
    def timing(self) -> Cadence:
        return cadence(self.name, self.cron, self.every_seconds, self.tz)


def _check_catch_up(name: str, mode: Any, limit: Any) -> None:
    if mode not in CATCH_UP_MODES:
        raise InvalidSchedule(name, "catch_up", f"must be one of {', '.join(CATCH_UP_MODES)}")
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= MAX_CATCH_UP_LIMIT
    ):
        raise InvalidSchedule(
            name, "catch_up_limit", f"must be an integer from 1 to {MAX_CATCH_UP_LIMIT}"
        )


def _timing(name: str, cron: Any, every: Any, tz: Any) -> tuple[str | None, int | None, str]:
    """(cron, every_seconds, tz) from the arguments, each checked alone."""
    if cron is None and every is None:
        raise InvalidSchedule(name, "cron", "give cron or every")
    if cron is not None and every is not None:
        raise InvalidSchedule(name, "cron", "give cron or every, not both")
    if tz is not None and not isinstance(tz, str):
        raise InvalidSchedule(name, "tz", f"must be a string, got {type(tz).__name__}")
    if every is not None:
        if tz not in (None, "UTC"):
            raise InvalidSchedule(name, "tz", "only for cron: intervals count from 1970 in UTC")
        seconds = every.total_seconds() if isinstance(every, timedelta) else every
        whole = isinstance(seconds, int | float) and not isinstance(seconds, bool)
        if not whole or seconds != int(seconds) or not 1 <= seconds <= MAX_EVERY_SECONDS:
            raise InvalidSchedule(
                name, "every", f"must be a whole number of seconds from 1 to {MAX_EVERY_SECONDS}"
            )
        return None, int(seconds), "UTC"
    if not isinstance(cron, str) or not 0 < len(cron) <= MAX_CRON_LENGTH:
        raise InvalidSchedule(
            name, "cron", f"must be a string of 1 to {MAX_CRON_LENGTH} characters"
        )
    return " ".join(cron.split()), None, tz or "UTC"


def key(name: str, tick: datetime) -> str:
    """The idempotency key of a schedule's job for one tick."""
    return f"{KEY_PREFIX}{name}@{tick.astimezone(UTC).strftime(_TICK_FORMAT)}"


def tick_of(job: Job) -> datetime | None:
    """The tick a job was enqueued for by a schedule (None: not by a schedule)."""
    found = job.idempotency_key or ""
    if not found.startswith(KEY_PREFIX):
        return None
    return datetime.strptime(found.rpartition("@")[2], _TICK_FORMAT).replace(tzinfo=UTC)


# -- what operators see ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A row of pgqueue_schedules, as ``GET /schedules`` and ``pgqueue
    schedules`` show it. ``status``: enabled, disabled, or retired (no longer
    declared by the code of a worker that handles its task). ``origin``: code
    (declared in a worker's code) or runtime (created by an operator:
    ``runtime_schedules``)."""

    name: str
    task: str
    queue: str
    payload: dict[str, Any]
    priority: int
    max_attempts: int | None
    timeout_seconds: float | None
    cron: str | None
    every_seconds: int | None
    tz: str
    catch_up: str
    catch_up_limit: int
    enabled: bool
    retired_at: datetime | None
    next_run_at: datetime | None
    last_tick: datetime | None
    last_run_at: datetime | None
    last_job_id: int | None
    last_job_state: str | None
    origin: Origin

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ScheduleRecord:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})

    @property
    def status(self) -> Status:
        if self.retired_at is not None:
            return "retired"
        return "enabled" if self.enabled else "disabled"

    @property
    def spec(self) -> str:
        """The timing in one line: the cron expression, or ``every N s``."""
        return self.cron if self.cron is not None else f"every {self.every_seconds} s"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO 8601 strings."""
        out: dict[str, Any] = {"status": self.status, "spec": self.spec}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.isoformat() if isinstance(value, datetime) else value
        return out


# -- flows ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Synced:
    """What a worker's start did to the table: schedules it created or
    changed, schedules it retired as (name, task), and the names it declares
    that a runtime schedule holds (left as they are)."""

    written: list[str]
    retired: list[tuple[str, str]]
    shadowed: list[str] = field(default_factory=list)


def sync(declared: Sequence[Schedule], tasks: Collection[str]) -> Flow[Synced]:
    """Make the table match a worker's code: upsert every declared schedule;
    retire the schedules of ``tasks`` (those the worker handles) that it does
    not declare. A new or re-timed schedule starts at its first tick after now.
    A name a runtime schedule holds is left to it (``shadowed``)."""
    now = _utc((yield from db_now()))
    ordered = sorted(declared, key=lambda s: s.name)
    written: list[str] = []
    shadowed: list[str] = []
    if ordered:
        names = {"names": [s.name for s in ordered]}
        shadowed = [row["name"] for row in (yield Statement("schedule_shadowed", names))]
        columns: dict[str, list[Any]] = {name: [] for name in _UPSERT_COLUMNS}
        for schedule in ordered:
            for name, value in stored_row(schedule, next_tick(schedule.timing, now)).items():
                columns[name].append(value)
        written = [row["name"] for row in (yield Statement("schedule_upsert", columns))]
    retired = yield Statement(
        "schedule_retire", {"tasks": sorted(tasks), "names": [s.name for s in ordered]}
    )
    return Synced(written, [(row["name"], row["task"]) for row in retired], shadowed)


_UPSERT_COLUMNS = (
    "name",
    "task",
    "payload",
    "queue",
    "priority",
    "max_attempts",
    "timeout_seconds",
    "cron",
    "every_seconds",
    "tz",
    "catch_up",
    "catch_up_limit",
    "next_run_at",
)


def stored_row(schedule: Schedule, next_run_at: datetime | None) -> dict[str, Any]:
    """A schedule's columns, as the statements that write it take them."""
    return {
        "name": schedule.name,
        "task": schedule.task,
        "payload": schedule.payload_json,
        "queue": schedule.queue,
        "priority": schedule.priority,
        "max_attempts": schedule.max_attempts,
        "timeout_seconds": schedule.timeout_seconds,
        "cron": schedule.cron,
        "every_seconds": schedule.every_seconds,
        "tz": schedule.tz,
        "catch_up": schedule.catch_up,
        "catch_up_limit": schedule.catch_up_limit,
        "next_run_at": next_run_at,
    }


def next_due() -> Flow[float | None]:
    """Seconds until the earliest live schedule is due (None: none planned)."""
    rows = yield Statement("schedule_next_due", {})
    seconds = rows[0]["seconds"]
    return None if seconds is None else float(seconds)


@dataclass(frozen=True, slots=True)
class Fired:
    """One due schedule, handled. ``moved``: this call moved it (False:
    another scheduler did first, and nothing was written here). ``jobs``: the
    (tick, job id) enqueued; ``already``: planned ticks whose job existed
    before (the schedule was deleted and declared again). ``problem``: why it
    has no tick planned now."""

    name: str
    moved: bool
    jobs: list[tuple[datetime, int]]
    plan: Plan | None
    already: list[datetime] = field(default_factory=list)
    problem: str | None = None


def fire_due(default_max_attempts: int) -> Flow[list[Fired]]:
    """Fire every live schedule that is due: enqueue its planned ticks and
    move it to its next one, each in one guarded statement."""
    rows = yield Statement("schedule_due", {"limit": DUE_BATCH})
    fired = []
    for row in rows:
        fired.append((yield from _fire(row, default_max_attempts)))
    return fired


def _fire(row: Mapping[str, Any], default_max_attempts: int) -> Flow[Fired]:
    name, due = row["name"], _utc(row["next_run_at"])
    try:
        timing = cadence(name, row["cron"], row["every_seconds"], row["tz"])
    except InvalidSchedule as exc:  # e.g. a zone this machine's tz database lacks
        moved = yield Statement("schedule_unplan", {"name": name, "due": due})
        return Fired(name, bool(moved), [], None, problem=str(exc))
    steps = plan(timing, due, _utc(row["now"]), row["catch_up"], row["catch_up_limit"])
    by_key = {key(name, tick): tick for tick in steps.ticks}
    rows = yield Statement(
        "schedule_fire",
        {
            "name": name,
            "due": due,
            "keys": list(by_key),
            "default_max_attempts": default_max_attempts,
            "next_run_at": steps.next_run_at,
            "last_tick": steps.ticks[-1] if steps.ticks else None,
        },
    )
    jobs = [(by_key.pop(r["idempotency_key"]), r["id"]) for r in rows if r["id"] is not None]
    already = list(by_key.values()) if rows else []
    problem = None if steps.next_run_at else "its timing has no tick in the next 50 years"
    return Fired(name, bool(rows), jobs, steps, already, problem)


def list_schedules() -> Flow[list[ScheduleRecord]]:
    rows = yield Statement("schedule_list", {})
    return [ScheduleRecord.from_row(row) for row in rows]


def set_enabled(name: str, enabled: bool) -> Flow[ScheduleRecord]:
    """Switch a schedule on or off. Switched on, it starts from its first
    tick after now: what it missed while off is not caught up."""
    rows = yield Statement("schedule_get", {"name": name})
    if not rows:
        raise ScheduleNotFound(name)
    row = rows[0]
    first = None
    if enabled and not row["enabled"]:
        timing = cadence(name, row["cron"], row["every_seconds"], row["tz"])
        first = next_tick(timing, _utc(row["now"]))
    rows = yield Statement(
        "schedule_set_enabled", {"name": name, "enabled": enabled, "next_run_at": first}
    )
    if not rows:  # deleted meanwhile
        raise ScheduleNotFound(name)
    return ScheduleRecord.from_row(rows[0])


def delete(name: str) -> Flow[None]:
    rows = yield Statement("schedule_delete", {"name": name})
    if not rows:
        raise ScheduleNotFound(name)
