"""The doctor's verdicts: a live capacity and health check, from the
database itself (docs/howto/health-check.md).

``doctor.py`` reads the rows (two ``Sample``s a window apart, then the
views); this module and ``threats.py`` turn rows into ``HealthCheck``s, pure
functions that the unit tier hands crafted rows:

    rate, cost, wal, headroom   here: what one job costs the server now, and how
                                far it goes at that cost (docs/scaling.md's model:
                                one core does 1e6 / cost jobs a second)
    long_transactions, replication_slots, vacuum, statistics, claim_plan,
    synchronous_standby, durability, schema, stuck_jobs, workers
                                threats.py: what threatens it

Each check says ok, warn or fail, with a one-line finding that carries its
number, what to do, and where the number came from. A figure that cannot
be measured (no job ended in the window; a view this role may not read) is
said to be so, never guessed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "DOCUMENTED_COST_US",
    "DOCUMENTED_WAL_BYTES",
    "HEADROOM_WARN_SHARE",
    "NOT_VISIBLE",
    "HealthCheck",
    "HealthReport",
    "Sample",
    "Status",
    "ago",
    "capacity",
]

Status = Literal["ok", "warn", "fail"]
_RANK: dict[Status, int] = {"ok": 0, "warn": 1, "fail": 2}

# docs/scaling.md, measured on 2 shared vCPUs: server CPU per job for a
# batched enqueue plus the worker's claim and ack, and WAL per job.
DOCUMENTED_COST_US = 48.0
DOCUMENTED_WAL_BYTES = 1_100.0
# The share of the model's rate past which the headroom is a warning: a
# burst has little room left.
HEADROOM_WARN_SHARE = 0.7
NOT_VISIBLE = "not visible to this role"


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """One check's verdict. ``value`` is its number in ``unit`` (None: not
    measured); ``source`` where the number came from."""

    name: str
    status: Status
    finding: str
    advice: str = ""
    source: str = ""
    value: float | None = None
    unit: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class HealthReport:
    """Every check, in a fixed order; ``status`` is the worst of them."""

    checks: tuple[HealthCheck, ...]
    window_seconds: float
    role: str
    measured_at: datetime

    @property
    def status(self) -> Status:
        return max((c.status for c in self.checks), key=_RANK.__getitem__, default="ok")

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def check(self, name: str) -> HealthCheck:
        """The check named ``name`` (KeyError if there is none)."""
        for found in self.checks:
            if found.name == name:
                return found
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "window_seconds": self.window_seconds,
            "role": self.role,
            "measured_at": self.measured_at.isoformat(),
            "checks": [c.to_dict() for c in self.checks],
        }


@dataclass(frozen=True, slots=True)
class Sample:
    """One end of the window. ``finished`` is None when the schema is not
    there to count jobs; ``statements_ms`` when pg_stat_statements is not."""

    at: datetime
    wal_bytes: int | None
    xact_commit: int | None
    active_ms: float | None
    finished: int | None = None
    statements_ms: float | None = None


# -- capacity: rate, cost, wal, headroom --------------------------------------------------

_COUNTERS = "pgqueue_counters (jobs succeeded or dead, written with each outcome)"
_STATEMENTS = "pg_stat_statements (executor time of pgqueue's statements)"
_ACTIVE = (
    "pg_stat_database.active_time (time every session of this database spent in "
    "statements, lock and I/O waits included; flushed about once a second)"
)
_WAL = "pg_current_wal_lsn() (the whole server's WAL, other databases' writes included)"


_PER_JOB = ("cost", "wal", "headroom")


def capacity(first: Sample, second: Sample, cores: int | None) -> list[HealthCheck]:
    """The rate, the server time and WAL per job over the window, and the
    headroom the model of docs/scaling.md gives at that cost."""
    seconds = max((second.at - first.at).total_seconds(), 1e-6)
    window = f"the {seconds:.1f} s window"
    jobs = _delta(first.finished, second.finished)
    if jobs is None:
        rate = HealthCheck(
            "rate", "warn", "not measured: the schema is not up to date", "run pgqueue migrate"
        )
        idle = "not measured: the schema is not up to date"
        return [rate, *(HealthCheck(name, "ok", idle) for name in _PER_JOB)]
    per_second = jobs / seconds
    checks = [
        HealthCheck(
            "rate",
            "ok",
            f"{per_second:,.1f} jobs/s ended ({jobs:,} in {window})",
            source=_COUNTERS,
            value=round(per_second, 3),
            unit="jobs/s",
        )
    ]
    if jobs <= 0:
        idle = f"not measured: no job ended in {window}, so there is no cost per job to divide"
        advice = "measure while the workers are busy (a longer window takes in more jobs)"
        return [*checks, *(HealthCheck(name, "ok", idle, advice) for name in _PER_JOB)]
    cost, source = _cost(first, second, jobs)
    checks.append(_cost_check(cost, source, window))
    wal = _delta(first.wal_bytes, second.wal_bytes)
    if wal is None:
        checks.append(HealthCheck("wal", "ok", f"not measured: the WAL position is {NOT_VISIBLE}"))
    else:
        checks.append(
            HealthCheck(
                "wal",
                "ok",
                f"{wal / jobs:,.0f} bytes of WAL per job ({wal:,} bytes for {jobs:,} jobs)",
                "size disks, archives and replicas with it (docs/scaling.md, section 3: "
                f"about {DOCUMENTED_WAL_BYTES:,.0f} bytes per job measured there)",
                _WAL,
                round(wal / jobs, 1),
                "bytes/job",
            )
        )
    checks.append(_headroom(cost, per_second, cores))
    return checks


def _delta(before: float | None, after: float | None) -> Any:
    if before is None or after is None:
        return None
    return after - before


def _cost(first: Sample, second: Sample, jobs: int) -> tuple[float | None, str]:
    """µs of server time per job: pgqueue's statements' executor time when
    pg_stat_statements shows them, else the database's active time."""
    statements = _delta(first.statements_ms, second.statements_ms)
    if statements is not None and statements > 0:
        return statements * 1000 / jobs, _STATEMENTS
    active = _delta(first.active_ms, second.active_ms)
    if active is not None and active > 0:
        return active * 1000 / jobs, _ACTIVE
    return None, ""


def _cost_check(cost: float | None, source: str, window: str) -> HealthCheck:
    if cost is None:
        return HealthCheck(
            "cost",
            "ok",
            f"not measured: neither pg_stat_statements nor pg_stat_database moved in {window}",
            "use a longer window; pg_stat_statements (shared_preload_libraries) measures "
            "at once, pg_stat_database only as sessions flush their counters",
        )
    return HealthCheck(
        "cost",
        "ok",
        f"{cost:,.0f} µs of server time per job",
        f"docs/scaling.md measured {DOCUMENTED_COST_US:.0f} µs of CPU per job with batched "
        "enqueues and 640 with single ones; far more: batch enqueues, look at the "
        "handlers' own queries",
        source,
        round(cost, 1),
        "µs/job",
    )


def _headroom(cost: float | None, rate: float, cores: int | None) -> HealthCheck:
    if cost is None:
        return HealthCheck("headroom", "ok", "not measured: the cost per job is not known")
    per_core = 1e6 / cost
    busy = rate * cost / 1e6
    model = "docs/scaling.md: one core does 1e6 / cost jobs a second (an upper bound: CPU only)"
    if cores is None:
        return HealthCheck(
            "headroom",
            "ok",
            f"{rate:,.1f} jobs/s keep {busy:.2f} of a core busy; one core does "
            f"≈ {per_core:,.0f} jobs/s at this cost",
            "give the server's core count (cores=, --cores) for the headroom in jobs/s",
            model,
            round(per_core, 1),
            "jobs/s per core",
        )
    most = cores * per_core
    room = most - rate
    status: Status = "ok"
    advice = "room for bursts"
    if rate >= most:
        status, advice = (
            "fail",
            "the server is at its limit: batch enqueues, add cores, or split the queues "
            "over clusters (docs/scaling.md, section 5)",
        )
    elif rate >= HEADROOM_WARN_SHARE * most:
        status, advice = "warn", "little room left: batch enqueues, or plan more cores or clusters"
    return HealthCheck(
        "headroom",
        status,
        f"{room:,.0f} jobs/s of headroom: ≈ {most:,.0f} jobs/s on {cores} cores at "
        f"{cost:,.0f} µs/job, {rate:,.1f} jobs/s now",
        advice,
        model,
        round(room, 1),
        "jobs/s",
    )


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"
