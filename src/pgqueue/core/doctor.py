"""The doctor's flows: ``sample()`` one end of the window, ``examine()``
every check (health.py and threats.py judge the rows).

``Queue.doctor()`` runs ``sample()``, waits ``window_seconds``, runs it
again (each outside a transaction: the pg_stat views hold still within
one), then ``examine()``. Every statement reads; none needs a superuser.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..sql import migration_versions
from . import threats
from .errors import InvalidSettings
from .flows import Flow, Row, Statement
from .health import HealthCheck, HealthReport, Sample, capacity
from .settings import Settings
from .transitions import claim
from .workers import list_workers

__all__ = ["STUCK_REAP_INTERVALS", "DoctorOptions", "examine", "sample"]

# Expired leases older than this many reap intervals: no reaper runs.
STUCK_REAP_INTERVALS = 3


@dataclass(frozen=True, slots=True)
class DoctorOptions:
    """What the doctor is asked: how long to measure the rate over, how old
    a transaction may be, and the server's cores (for the headroom; None:
    not known, the headroom is given per core)."""

    window_seconds: float = 5.0
    long_transaction_seconds: float = 60.0
    cores: int | None = None

    def __post_init__(self) -> None:
        for name in ("window_seconds", "long_transaction_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidSettings(f"{name} must be a number of seconds, got {value!r}")
        if not 0.1 <= self.window_seconds <= 60:
            raise InvalidSettings(
                f"window_seconds must be between 0.1 and 60, got {self.window_seconds!r}"
            )
        if not 0 < self.long_transaction_seconds <= 86_400:
            raise InvalidSettings(
                "long_transaction_seconds must be more than 0 and at most 86400, "
                f"got {self.long_transaction_seconds!r}"
            )
        if self.cores is not None and (
            isinstance(self.cores, bool)
            or not isinstance(self.cores, int)
            or not 1 <= self.cores <= 4096
        ):
            raise InvalidSettings(
                f"cores must be a whole number from 1 to 4096, got {self.cores!r}"
            )


# -- the flows -------------------------------------------------------------------------


def sample() -> Flow[Sample]:
    """Read one end of the window (run outside a transaction: the pg_stat
    views hold still within one)."""
    [server] = yield Statement("health_sample_server", {})
    [present] = yield Statement("migration_table_exists", {})
    finished = None
    if present["present"] and not (yield from _pending()):
        [jobs] = yield Statement("health_sample_jobs", {})
        finished = int(jobs["finished"])
    statements_ms = None
    [available] = yield Statement("health_statements_available", {})
    if available["available"]:
        [statements] = yield Statement("health_sample_statements", {})
        statements_ms = float(statements["exec_ms"])
    return Sample(
        at=server["at"],
        wal_bytes=_int(server["wal_bytes"]),
        xact_commit=_int(server["xact_commit"]),
        active_ms=None if server["active_ms"] is None else float(server["active_ms"]),
        finished=finished,
        statements_ms=statements_ms,
    )


def _pending() -> Flow[list[str]]:
    rows = yield Statement("migration_applied", {})
    applied = {row["version"] for row in rows}
    return [v for v in migration_versions() if v not in applied]


def examine(
    settings: Settings, options: DoctorOptions, first: Sample, second: Sample
) -> Flow[HealthReport]:
    """Every check, from the window's two samples and what the database
    says now."""
    [server] = yield Statement("health_server", {})
    [present] = yield Statement("migration_table_exists", {})
    applied: list[str] = []
    if present["present"]:
        applied = [row["version"] for row in (yield Statement("migration_applied", {}))]
    checks = capacity(first, second, options.cores)
    sessions = yield Statement("health_transactions", {})
    checks.append(
        threats.long_transactions(
            sessions, options.long_transaction_seconds, server["read_all_stats"]
        )
    )
    slots = yield Statement("health_slots", {})
    checks.append(threats.replication_slots(slots))
    checks += [threats.synchronous_standby(server), threats.durability(server)]
    checks.append(threats.schema(applied, migration_versions()))
    if checks[-1].status == "fail":
        checks += [_unchecked(name) for name in _TABLE_CHECKS]
    else:
        tables = yield Statement("health_tables", {})
        checks += [threats.vacuum(tables, server), threats.statistics(tables, server)]
        live = yield Statement("queue_stats", {})
        queue = max(live, key=lambda row: (row["queued"], row["queue"]), default=None)
        name = queue["queue"] if queue else "default"
        plan = None
        if server["may_claim"]:
            statement = next(claim(settings, limit=100, worker="doctor", queues=[name]))
            [row] = yield Statement("job_claim_explain", statement.params)
            plan = row["QUERY PLAN"]
        checks.append(threats.claim_plan(plan, name, _live(tables, "pgqueue_jobs")))
        grace = STUCK_REAP_INTERVALS * settings.reap_interval_seconds
        [stuck] = yield Statement("health_stuck", {"grace_seconds": grace})
        checks.append(threats.stuck_jobs(stuck, grace))
        registry = yield from list_workers()
        checks.append(threats.workers(registry, sum(int(row["queued"]) for row in live)))
    return HealthReport(
        checks=tuple(checks),
        window_seconds=round((second.at - first.at).total_seconds(), 3),
        role=str(server["role"]),
        measured_at=second.at,
    )


_TABLE_CHECKS = ("vacuum", "statistics", "claim_plan", "stuck_jobs", "workers")


def _unchecked(name: str) -> HealthCheck:
    return HealthCheck(
        name, "warn", "not checked: the schema is not up to date", "run pgqueue migrate first"
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _live(tables: Iterable[Row], name: str) -> int | None:
    return next((int(row["live"]) for row in tables if row["name"] == name), None)
