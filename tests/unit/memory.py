"""A scripted in-memory database for the unit tier.

``MemoryDatabase`` answers pgqueue's named statements by name, with a method
per statement that mimics what the SQL does to a dict of job rows (as
procrastinate's InMemoryConnector does). It is for testing flow logic and the
worker's parts without PostgreSQL, never for proving what the database does:
the integration tier does that against a real server.

Tests script faults with ``db.fail(name, exc, times)``, read every statement
sent from ``db.statements``, and move the clock with ``db.advance(seconds)``.
Schedules live in ``db.schedules`` (name -> row).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pgqueue.core.errors import KeyTaken
from pgqueue.core.flows import Flow, Statement
from pgqueue.core.jobs import Job
from pgqueue.db import driver
from pgqueue.sql import migration_versions

T = TypeVar("T")
Row = dict[str, Any]


class MemoryDatabase:
    def __init__(self, *, migrated: bool = True) -> None:
        self.jobs: dict[int, Row] = {}
        self.workers: dict[str, Row] = {}  # the registry, by worker name
        self.schedules: dict[str, Row] = {}
        self.migrated = migrated
        self.clock = datetime(2030, 1, 1, tzinfo=UTC)
        self.statements: list[Statement] = []
        self.limited: list[str] = []  # queues with a concurrency limit
        self.fair: list[str] = []  # fair queues
        self.objectives: dict[str, float] = {}  # latency objectives, by queue
        self._faults: list[tuple[str, BaseException]] = []
        self._ids = itertools.count(1)
        self._tokens = itertools.count(1)

    # -- scripting -----------------------------------------------------------------

    def fail(self, name: str, exc: BaseException, times: int = 1) -> None:
        """The next ``times`` statements called ``name`` raise ``exc``."""
        self._faults += [(name, exc)] * times

    def advance(self, seconds: float) -> None:
        self.clock += timedelta(seconds=seconds)

    def sent(self, name: str) -> list[Statement]:
        return [s for s in self.statements if s.name == name]

    def add(self, task: str = "t", **fields: Any) -> int:
        job_id = fields.pop("id", None) or next(self._ids)
        row: Row = {
            "id": job_id,
            "queue": "default",
            "task": task,
            "payload": {},
            "priority": 0,
            "state": "queued",
            "run_at": self.clock,
            "attempts": 0,
            "max_attempts": 5,
            "snoozes": 0,
            "timeout_seconds": None,
            "lease_token": None,
            "lease_expires_at": None,
            "worker": None,
            "last_error": None,
            "result": None,
            "idempotency_key": None,
            "unique_scope": None,
            "enqueued_at": self.clock,
            "started_at": None,
            "finished_at": None,
            "concurrency_key": None,
            "workflow_id": None,
            "depends_on": None,
            "errors": None,
            "metadata": None,
            "progress_fraction": None,
            "progress_info": None,
            "progress_at": None,
            "last_checkpoint": None,
            "batch_id": None,
            "call_key": None,
        }
        row.update(fields)
        self.jobs[job_id] = row
        return job_id

    def state(self, job_id: int) -> str:
        return str(self.jobs[job_id]["state"])

    # -- the session --------------------------------------------------------------

    def execute(self, statement: Statement) -> list[Any]:
        self.statements.append(statement)
        for index, (name, exc) in enumerate(self._faults):
            if name == statement.name:
                del self._faults[index]
                raise exc
        rows: list[Row] = getattr(self, statement.name)(**statement.params)
        return [Job.from_row(row) for row in rows] if statement.jobs else rows

    # -- statements -----------------------------------------------------------------

    def migration_table_exists(self) -> list[Row]:
        return [{"present": self.migrated}]

    def migration_applied(self) -> list[Row]:
        return [{"version": v} for v in migration_versions()]

    def job_get(self, id: int) -> list[Row]:
        return [dict(self.jobs[id])] if id in self.jobs else []

    # Enqueue, simplified: a key is held by any job that has it (no scopes),
    # and run_at and delays are ignored.

    def job_reserve_ids(self, count: int) -> list[Row]:
        return [{"ids": [next(self._ids) for _ in range(count)]}]

    def _holder(self, key: str | None) -> Row | None:
        rows = (row for row in self.jobs.values() if row["idempotency_key"] == key)
        return next(rows, None) if key is not None else None

    def _insert(self, params: Row) -> Row | None:
        """The new job's row, or None when its key is held."""
        if self._holder(params["idempotency_key"]) is not None:
            return None
        names = ("queue", "priority", "max_attempts", "idempotency_key", "concurrency_key")
        fields = {name: params[name] for name in names}
        fields["timeout_seconds"] = params["timeout_seconds"]
        fields["metadata"] = json.loads(params["metadata"]) if params["metadata"] else None
        fields["call_key"] = params["call_key"]
        job_id = self.add(
            params["task"], id=params["id"], payload=json.loads(params["payload"]), **fields
        )
        return dict(self.jobs[job_id])

    def job_enqueue(self, **params: Any) -> list[Row]:
        if params["id"] in self.jobs:
            raise KeyTaken()  # the primary key: an earlier attempt's job
        row = self._insert(params)
        return [row] if row is not None else []

    @staticmethod
    def _rows(call_key: Any, columns: dict[str, list[Any]]) -> list[Row]:
        """The rows of a statement's parameter arrays, each with the call's key."""
        return [
            dict(zip(columns, values, strict=True), call_key=call_key)
            for values in zip(*columns.values(), strict=True)
        ]

    def job_enqueue_many(self, call_key: Any, **columns: list[Any]) -> list[Row]:
        rows = self._rows(call_key, columns)
        fresh = [row for row in rows if row["id"] not in self.jobs]
        return [{"id": row["id"]} for row in fresh if self._insert(row) is not None]

    def job_enqueue_plain_rows(self, call_key: Any, **columns: list[Any]) -> list[Row]:
        """All of the jobs or none: an id that is taken fails the statement."""
        if any(job_id in self.jobs for job_id in columns["id"]):
            raise KeyTaken()
        rows = self._rows(call_key, columns)
        return [inserted for row in rows if (inserted := self._insert(row)) is not None]

    def job_enqueue_plain(self, call_key: Any, **columns: list[Any]) -> list[Row]:
        self.job_enqueue_plain_rows(call_key, **columns)
        return [{"notified": 1}]

    def job_enqueue_found(self, ids: list[int], idempotency_keys: list[str]) -> list[Row]:
        holders = [row for key in idempotency_keys if (row := self._holder(key)) is not None]
        found = [self.jobs[i] for i in ids if i in self.jobs] + holders
        return [
            {**row, "reserved": row["id"] in ids, "holds_key": row["idempotency_key"]}
            for row in found
        ]

    def job_get_many(self, ids: list[int]) -> list[Row]:
        return [dict(self.jobs[i]) for i in ids if i in self.jobs]

    def job_get_by_idempotency_key(self, idempotency_key: str) -> list[Row]:
        holder = self._holder(idempotency_key)
        return [dict(holder)] if holder is not None else []

    def job_claim(
        self,
        limit: int,
        queues: list[str],
        shares: list[int],
        lease_seconds: float,
        worker: str,
        latency_bounds: list[float],
    ) -> list[Row]:
        claimed: list[Row] = []  # (the statement stops at `limit`)
        for queue, share in zip(queues, shares, strict=True):
            runnable = [
                row
                for row in self.jobs.values()
                if row["queue"] == queue
                and row["state"] == "queued"
                and row["run_at"] <= self.clock
            ]
            runnable.sort(key=lambda r: (-r["priority"], r["run_at"], r["id"]))
            claimed += runnable[:share]
        claimed = claimed[:limit]
        for row in claimed:
            row.update(
                state="running",
                attempts=row["attempts"] + 1,
                lease_token=next(self._tokens),
                lease_expires_at=self.clock + timedelta(seconds=lease_seconds),
                worker=worker,
                started_at=self.clock,
            )
        return [dict(row, parents=self._parents_results(row)) for row in claimed]

    def _parents_results(self, row: Row) -> list[Any] | None:
        """As job_claim's ``parents``: the results of ``depends_on`` in
        order (None for a parent that did not succeed), or None."""
        if row.get("depends_on") is None:
            return None
        parents = [self.jobs.get(parent) for parent in row["depends_on"]]
        return [p["result"] if p and p["state"] == "succeeded" else None for p in parents]

    def queue_names_queued(self) -> list[Row]:
        names = {row["queue"] for row in self.jobs.values() if row["state"] == "queued"}
        return [{"queue": name} for name in sorted(names)]

    def _held(self, job_id: int, token: int) -> Row | None:
        row = self.jobs.get(job_id)
        if row is None or row["state"] != "running" or row["lease_token"] != token:
            return None
        return row

    def job_heartbeat(self, ids: list[int], tokens: list[int], lease_seconds: float) -> list[Row]:
        still = []
        for job_id, token in zip(ids, tokens, strict=True):
            row = self._held(job_id, token)
            if row is not None:
                row["lease_expires_at"] = self.clock + timedelta(seconds=lease_seconds)
                still.append({"id": job_id})
        return still

    def job_finish(
        self,
        ids: list[int],
        tokens: list[int],
        succeeded: list[bool],
        results: list[str | None],
        errors: list[str | None],
        retryable: list[bool],
        **_: Any,
    ) -> list[Row]:
        out = []
        for job_id, token, ok, error, again in zip(
            ids, tokens, succeeded, errors, retryable, strict=True
        ):
            row = self._held(job_id, token)
            if row is None:
                continue
            if ok:
                row.update(state="succeeded", finished_at=self.clock)
            elif again and row["attempts"] < row["max_attempts"]:
                row.update(state="queued", last_error=error, run_at=self.clock)
            else:
                row.update(state="dead", last_error=error, finished_at=self.clock)
            row["lease_expires_at"] = None
            out.append({"id": job_id, "state": row["state"]})
        return out

    def _fenced(
        self, ids: list[int], tokens: list[int], values: list[Any]
    ) -> Iterator[tuple[Row, Any]]:
        """The rows these tokens still hold, each with its value."""
        for job_id, token, value in zip(ids, tokens, values, strict=True):
            row = self._held(job_id, token)
            if row is not None:
                yield row, value

    def job_snooze(
        self, ids: list[int], tokens: list[int], seconds: list[float], errors: list[str | None]
    ) -> list[Row]:
        snoozed = []
        for (row, delay), error in zip(self._fenced(ids, tokens, seconds), errors, strict=False):
            row["last_error"] = error or row["last_error"]
            row.update(
                state="queued",
                attempts=row["attempts"] - 1,
                snoozes=row["snoozes"] + 1,
                run_at=self.clock + timedelta(seconds=delay),
                lease_expires_at=None,
            )
            snoozed.append({"id": row["id"], "state": "queued"})
        return snoozed

    def job_release(self, ids: list[int], tokens: list[int]) -> list[Row]:
        released = []
        for row, _ in self._fenced(ids, tokens, ids):
            row.update(state="queued", attempts=row["attempts"] - 1, lease_expires_at=None)
            released.append({"id": row["id"]})
        return released

    def job_cancel_held(
        self, ids: list[int], tokens: list[int], reasons: list[str], **_: Any
    ) -> list[Row]:
        cancelled = []
        for row, reason in self._fenced(ids, tokens, reasons):
            row.update(state="cancelled", last_error=reason, finished_at=self.clock)
            row["lease_expires_at"] = None
            cancelled.append({"id": row["id"], "state": "cancelled"})
        return cancelled

    def job_reap(self, limit: int, **_: Any) -> list[Row]:
        out = []
        for row in self.jobs.values():
            expires = row["lease_expires_at"]
            if row["state"] == "running" and expires is not None and expires < self.clock:
                left = row["attempts"] < row["max_attempts"]
                row.update(state="queued" if left else "dead", lease_expires_at=None)
                out.append({"id": row["id"], "state": row["state"]})
        return out[:limit]

    def job_prune(self, retention_seconds: float, limit: int) -> list[Row]:
        return [{"pruned": 0}]

    # The archive (core/archive.py): nothing is moved here, no partition made or dropped.
    def job_archive_partitions(self, archive_after_seconds: float, after: Any) -> list[Row]:
        return [{"created": 0}]

    def job_archive(self, archive_after_seconds: float, limit: int, after: Any) -> list[Row]:
        return [{"moved": 0, "cutoff": self.clock}]

    def job_archive_drop(self, retention_seconds: float) -> list[Row]:
        return []

    def wait_prune(self) -> list[Row]:
        return []  # nobody registers a wait() here

    def queue_next_wake(self, queues: list[str] | None) -> list[Row]:
        return [{"seconds": None, "limited": self.limited}]

    def queue_claim_hints(self, queues: list[str] | None) -> list[Row]:
        """The scripted ``fair`` queues and ``objectives``."""
        names = sorted(set(self.fair) | set(self.objectives))
        return [
            {"name": n, "fair": n in self.fair, "max_start_lag_seconds": self.objectives.get(n)}
            for n in names
            if queues is None or n in queues
        ]

    def queue_start_lags(self, queues: list[str]) -> list[Row]:
        lags = []
        for name in sorted(queues):
            runnable = [
                row["run_at"]
                for row in self.jobs.values()
                if row["queue"] == name and row["state"] == "queued" and row["run_at"] <= self.clock
            ]
            waited = (self.clock - min(runnable)).total_seconds() if runnable else 0.0
            lags.append({"queue": name, "lag_seconds": waited})
        return lags

    def worker_register(self, name: str, **info: Any) -> list[Row]:
        self.workers[name] = {"name": name, **info}
        return []

    def worker_seen(self, name: str, **load: Any) -> list[Row]:
        if name not in self.workers:
            return []
        self.workers[name].update(load)
        return [{"name": name}]

    def worker_reap_dead(self, worker: str) -> list[Row]:
        """The workers a test marked ``session_ended`` (never the caller):
        dead now, their running jobs' leases ended."""
        out = []
        for name, row in self.workers.items():
            if name == worker or not row.pop("session_ended", False) or not row["session"]:
                continue
            row["session"] = False
            held = [j for j in self.jobs.values() if (j["state"], j["worker"]) == ("running", name)]
            for job in held:
                job["lease_expires_at"] = datetime(1970, 1, 1, tzinfo=UTC)
            out.append({"name": name, "jobs": len(held)})
        return out

    def worker_leave(self, name: str) -> list[Row]:
        self.workers.pop(name, None)
        return []

    def worker_prune(self, retention_seconds: float) -> list[Row]:
        return [{"pruned": 0}]

    # -- schedules (pgqueue/schedules.py) ----------------------------------------------

    # The history's statements (maintenance): nothing to fold or prune, and
    # no counters to snapshot.
    def history_fold(self) -> list[Row]:
        return []

    def history_snapshot(self, minute: datetime | None) -> list[Row]:
        return [{"taken": 1, "written": 0}]

    def history_prune(self, retention_seconds: float) -> list[Row]:
        return [{"pruned": 0}]

    def db_now(self) -> list[Row]:
        return [{"now": self.clock}]

    def schedule_upsert(self, **columns: list[Any]) -> list[Row]:
        written = []
        for values in zip(*columns.values(), strict=True):
            row = dict(zip(columns, values, strict=True))
            old = self.schedules.get(row["name"])
            if old is not None and old["origin"] == "runtime":
                continue
            if old is not None:
                timing = ("cron", "every_seconds", "tz")
                keep = old["retired_at"] is None and old["next_run_at"] is not None
                if keep and all(old[k] == row[k] for k in timing):
                    row["next_run_at"] = old["next_run_at"]
                row = {**old, **row, "retired_at": None}
            else:
                row.update(
                    enabled=True, retired_at=None, last_tick=None, last_job_id=None, origin="code"
                )
            self.schedules[row["name"]] = row
            written.append({"name": row["name"]})
        return written

    def schedule_shadowed(self, names: list[str]) -> list[Row]:
        held = (self.schedules.get(name) for name in sorted(names))
        return [{"name": row["name"]} for row in held if row and row["origin"] == "runtime"]

    def schedule_retire(self, tasks: list[str], names: list[str]) -> list[Row]:
        retired = []
        for row in self.schedules.values():
            if row["origin"] == "runtime":
                continue
            if row["task"] in tasks and row["name"] not in names and row["retired_at"] is None:
                row["retired_at"] = self.clock
                retired.append({"name": row["name"], "task": row["task"]})
        return retired

    @staticmethod
    def _is_live(row: Row) -> bool:
        return row["enabled"] and row["retired_at"] is None and row["next_run_at"] is not None

    def _live(self) -> list[Row]:
        return [row for row in self.schedules.values() if self._is_live(row)]

    def schedule_next_due(self) -> list[Row]:
        planned = [row["next_run_at"] for row in self._live()]
        seconds = (min(planned) - self.clock).total_seconds() if planned else None
        return [{"seconds": seconds}]

    def schedule_due(self, limit: int) -> list[Row]:
        due = [
            dict(row, now=self.clock) for row in self._live() if row["next_run_at"] <= self.clock
        ]
        return sorted(due, key=lambda r: (r["next_run_at"], r["name"]))[:limit]

    def schedule_fire(
        self,
        name: str,
        due: datetime,
        keys: list[str],
        default_max_attempts: int,
        next_run_at: datetime | None,
        last_tick: datetime | None,
    ) -> list[Row]:
        row = self.schedules.get(name)
        if row is None or not self._is_live(row) or row["next_run_at"] != due:
            return []
        taken = {job["idempotency_key"] for job in self.jobs.values()}
        new = [
            {
                "id": self.add(
                    row["task"],
                    queue=row["queue"],
                    idempotency_key=key,
                    max_attempts=row["max_attempts"] or default_max_attempts,
                ),
                "idempotency_key": key,
            }
            for key in keys
            if key not in taken
        ]
        row.update(next_run_at=next_run_at, last_tick=last_tick or row["last_tick"])
        if new:
            row["last_job_id"] = new[-1]["id"]
        return new or [{"name": name, "id": None, "idempotency_key": None}]

    def schedule_unplan(self, name: str, due: datetime) -> list[Row]:
        row = self.schedules.get(name)
        if row is None or row["next_run_at"] != due:
            return []
        row["next_run_at"] = None
        return [{"name": name}]


class MemorySession:
    """The database as an asyncio session."""

    def __init__(self, db: MemoryDatabase) -> None:
        self.db = db

    async def execute(self, statement: Statement) -> list[Any]:
        return self.db.execute(statement)


class MemoryConnection:
    """A worker connection (``FlowDriver``) over the in-memory database."""

    def __init__(self, db: MemoryDatabase) -> None:
        self.db = db
        self.opened = False
        self.closed = False

    async def drive(self, flow: Flow[T]) -> T:
        return await driver.drive_async(flow, MemorySession(self.db))

    async def open(self) -> None:
        self.opened = True

    async def close(self) -> None:
        self.closed = True


async def no_hints() -> AsyncIterator[str | None]:
    """A LISTEN stream that says "listening" once and then nothing."""
    yield None
    await asyncio.Event().wait()
