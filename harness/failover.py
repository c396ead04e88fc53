"""Continuous load across a PostgreSQL failover, and its ledger.

``FailoverLoad(url)`` runs, for as long as its block lasts, what a user's
deployment runs against a highly available database: producers through the
library (a ``Queue`` in a thread, an ``AsyncQueue`` on an event loop), a
producer over HTTP against ``pgqueue api`` (a real server process), 4
``pgqueue worker`` processes on the fault handlers (harness.fault_tasks),
and a watcher that reads, on the primary, which jobs have succeeded. All of
them are given only the cluster's multi-host URL
(``target_session_attrs=read-write``) and pgqueue's ordinary settings.

The ledger keeps what the clients were told: every enqueue acknowledged (the
job id and when), every HTTP answer (status, error code, Retry-After), and
every completion seen committed on the primary (job id and fencing token).
``verdict()`` then compares it with what the database holds after the
failover: acknowledged enqueues missing, acknowledged completions reverted
(the job is no longer succeeded on that token), jobs not finished, and the
write outage and the time until the completion rate is back to 90 %.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from harness.fault_tasks import create_deliveries, spawn_worker, stop_worker, worker_env
from pgqueue import AsyncQueue, Queue, Settings, migrate
from pgqueue.core.errors import PgQueueError

__all__ = ["WORKER_SETTINGS", "FailoverLoad", "Ledger", "Verdict"]

# What a user sets for a worker that should notice a lost primary within
# seconds (every one is an ordinary pgqueue setting, PGQUEUE_*).
WORKER_SETTINGS: dict[str, Any] = {
    "lease_seconds": 10.0,
    "heartbeat_seconds": 2.0,
    "reap_interval_seconds": 1.0,
    "backoff_base_seconds": 0.05,
    "backoff_cap_seconds": 1.0,
    "poll_interval_seconds": 0.2,
}
WORKERS = 4
CONCURRENCY = 8
# The completion rate before a fault is measured over this many seconds.
BASELINE_SECONDS = 5.0
JOB: dict[str, Any] = {"task": "work", "payload": {"ms": 20}, "max_attempts": 50}
# The library's errors that say nothing was written (EnqueueOutcomeUnknown
# says the job may exist).
NOTHING_WRITTEN = {"DatabaseUnavailable", "DatabaseReadOnly"}


@dataclass
class Ledger:
    """What the clients were told, in wall-clock seconds (time.time())."""

    acked: dict[int, float] = field(default_factory=dict)  # job id -> acknowledged at
    refused: Counter[str] = field(default_factory=Counter)  # library errors, by class
    # Each refused library call's mark (its job's metadata "call") -> its
    # error's class: a call refused with "nothing was written" must have no job.
    refused_calls: dict[str, str] = field(default_factory=dict)
    http: Counter[str] = field(default_factory=Counter)  # "201", "503 database_read_only"...
    http_without_retry_after: int = 0  # 503 answers that lacked the header
    completed: dict[int, int] = field(default_factory=dict)  # job id -> token seen succeeded
    seen_at: dict[int, float] = field(default_factory=dict)  # job id -> first seen succeeded
    # The standby's lag behind the primary, sampled by the watcher: WAL the
    # primary has and the standby has not flushed (bytes), and how long the
    # last flush took to be confirmed (ms). Under asynchronous replication
    # this is what a failover loses.
    lag_bytes: list[int] = field(default_factory=list)
    lag_ms: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, job_id: int) -> None:
        with self.lock:
            self.acked[job_id] = time.time()

    def refuse(self, exc: BaseException, call: str) -> None:
        with self.lock:
            self.refused[type(exc).__name__] += 1
            self.refused_calls[call] = type(exc).__name__

    def answer(self, response: httpx.Response) -> None:
        body = response.json() if response.status_code != 201 else {}
        with self.lock:
            self.http[f"{response.status_code} {body.get('error', '')}".strip()] += 1
            if response.status_code == 503 and "retry-after" not in response.headers:
                self.http_without_retry_after += 1


@dataclass
class Verdict:
    """The failover as the ledger and the database tell it."""

    enqueued: int
    missing: list[int]  # acknowledged enqueues the database does not have
    reverted: list[int]  # completions seen committed that are no longer succeeded on that token
    unfinished: int
    write_outage_s: float  # the longest time without an acknowledged enqueue, around the fault
    recovery_s: float | None  # from the fault until completions/s are back to 90 % of before
    http: dict[str, int]
    refused: dict[str, int]
    # Jobs of library calls refused with DatabaseUnavailable itself or
    # DatabaseReadOnly, which say that nothing was written.
    written_though_refused: list[int] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class FailoverLoad:
    """The load (producers, API, workers, watcher) against ``url``."""

    def __init__(
        self,
        url: str,
        logs: Path,
        *,
        rate: float = 20.0,
        api_settings: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.logs = logs
        self.rate = rate  # enqueues per second, per producer (three of them)
        self.api_settings = api_settings or {}  # PGQUEUE_* of the API process
        self.ledger = Ledger()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    @contextlib.contextmanager
    def running(self) -> Iterator[FailoverLoad]:
        migrate(self.url)
        create_deliveries(self.url)
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            api = self._start_api()
            for n in range(WORKERS):
                self._spawn_worker(n)
            for target in (self._sync_producer, self._async_producer, self._watcher):
                self._thread(target)
            self._thread(lambda: self._http_producer(api))
            yield self
        finally:
            self._stop.set()
            for thread in self._threads:
                thread.join(60)
            self._codes = [stop_worker(proc) for proc in self._procs]

    def _thread(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _spawn_worker(self, n: int) -> None:
        with open(self.logs / f"worker{n}.log", "wb") as log:
            proc = spawn_worker(
                self.url,
                concurrency=CONCURRENCY,
                log=log,
                delivery_url=self.url,
                **WORKER_SETTINGS,
                log_format="json",
            )
        self._procs.append(proc)

    def _start_api(self) -> str:
        port = _free_port()
        with open(self.logs / "api.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgqueue", "api", "--port", str(port)],
                cwd=Path(__file__).resolve().parent.parent,
                env=worker_env(self.url, **self.api_settings),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", headers={"Host": "localhost"}).status_code == 200:
                    return base
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgqueue api did not start: {self.logs / 'api.log'}")
            time.sleep(0.1)

    def _paced(self) -> Iterator[None]:
        """Yield ``rate`` times a second until stopped."""
        interval, next_at = 1.0 / self.rate, time.monotonic()
        while not self._stop.is_set():
            yield
            next_at += interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic() - 1)  # no burst after a stall

    def _sync_producer(self) -> None:
        with Queue(settings=Settings(database_url=self.url)) as queue:
            for _ in self._paced():
                call = uuid.uuid4().hex
                try:
                    self.ledger.ack(queue.enqueue(**JOB, metadata={"call": call}).id)
                except PgQueueError as exc:
                    self.ledger.refuse(exc, call)

    def _async_producer(self) -> None:
        async def produce() -> None:
            async with AsyncQueue(settings=Settings(database_url=self.url)) as queue:
                for _ in self._paced():
                    call = uuid.uuid4().hex
                    try:
                        job = await queue.enqueue(**JOB, metadata={"call": call})
                        self.ledger.ack(job.id)
                    except PgQueueError as exc:
                        self.ledger.refuse(exc, call)
                    await asyncio.sleep(0)

        asyncio.run(produce())

    def _http_producer(self, base: str) -> None:
        with httpx.Client(base_url=base, headers={"Host": "localhost"}, timeout=60) as http:
            for _ in self._paced():
                response = http.post("/jobs", json=JOB)
                self.ledger.answer(response)
                if response.status_code == 201:
                    self.ledger.ack(response.json()["id"])

    def _watcher(self) -> None:
        """Read, on the primary, the jobs that succeeded since the last look
        (with an overlap: finish times are the database's, not ours)."""
        since = 0.0
        while not self._stop.wait(0.25):
            with (
                contextlib.suppress(psycopg.Error),
                psycopg.connect(self.url, autocommit=True, connect_timeout=3) as conn,
            ):
                while not self._stop.wait(0.25):
                    rows = conn.execute(
                        "SELECT id, lease_token, extract(epoch FROM finished_at)::float8"
                        " FROM pgqueue_jobs WHERE state = 'succeeded'"
                        " AND finished_at >= to_timestamp(%s)",
                        (since - 5,),
                    ).fetchall()
                    now = time.time()
                    with self.ledger.lock:
                        self.ledger.completed.update((r[0], r[1]) for r in rows)
                        for job_id, *_ in rows:
                            self.ledger.seen_at.setdefault(job_id, now)
                    since = max([since, *(r[2] for r in rows)])
                    self._sample_lag(conn)

    def _sample_lag(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint,"
            " extract(epoch FROM flush_lag)::float8 * 1000 FROM pg_stat_replication"
        ).fetchone()
        if row is not None and row[0] is not None:
            with self.ledger.lock:
                self.ledger.lag_bytes.append(row[0])
                if row[1] is not None:
                    self.ledger.lag_ms.append(row[1])

    def warm(self, baseline: float = BASELINE_SECONDS, timeout: float = 120.0) -> None:
        """Wait until the workers keep up (they take seconds to start on a
        busy machine, and the jobs enqueued meanwhile wait for them), then
        ``baseline`` seconds more: the rate before the fault."""
        backlog = "SELECT count(*) FROM pgqueue_jobs WHERE state = 'queued'"
        deadline = time.monotonic() + timeout
        while not self.ledger.completed or _scalar(self.url, backlog) > 3 * self.rate:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers did not catch up: {self.logs}")
            time.sleep(0.2)
        time.sleep(baseline)

    def worker_codes(self) -> list[int]:
        return self._codes

    # -- after the run ------------------------------------------------------

    def settle(self, timeout: float = 180) -> None:
        """Wait (producers stopped) until no job is left queued or running."""
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        deadline = time.monotonic() + timeout
        while _scalar(self.url, "SELECT count(*) FROM pgqueue_jobs WHERE state <> 'succeeded'"):
            if time.monotonic() > deadline:
                return
            time.sleep(0.5)

    def verdict(self, fault_at: float, until: float = math.inf) -> Verdict:
        """The ledger against the database; the outage and the recovery of
        the fault at ``fault_at`` (wall clock), counted until ``until`` (the
        next fault's time)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT id, state, lease_token, extract(epoch FROM finished_at)::float8,"
                " metadata->>'call' FROM pgqueue_jobs"
            ).fetchall()
        held = {r[0]: (r[1], r[2]) for r in rows}
        finished = sorted(r[3] for r in rows if r[1] == "succeeded" and r[3] is not None)
        acked = self.ledger.acked
        return Verdict(
            enqueued=len(acked),
            missing=sorted(set(acked) - set(held)),
            reverted=sorted(
                job_id
                for job_id, token in self.ledger.completed.items()
                if held.get(job_id) != ("succeeded", token)
            ),
            unfinished=sum(1 for state, _ in held.values() if state != "succeeded"),
            write_outage_s=_longest_gap(sorted(acked.values()), fault_at, until),
            recovery_s=_recovery(finished, fault_at),
            http=dict(self.ledger.http),
            refused=dict(self.ledger.refused),
            written_though_refused=sorted(
                r[0] for r in rows if self.ledger.refused_calls.get(r[4]) in NOTHING_WRITTEN
            ),
        )


def _scalar(url: str, sql: str) -> Any:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(sql).fetchone()
        return row[0] if row else None


def _longest_gap(times: list[float], fault_at: float, until: float) -> float:
    """The longest time between two acknowledgements, from just before the
    fault until ``until`` (a gap that spans the fault is the outage)."""
    around = [t for t in times if fault_at - 1.0 <= t < until]
    return max((b - a for a, b in itertools.pairwise(around)), default=0.0)


def _recovery(finished: list[float], fault_at: float, window: float = 2.0) -> float | None:
    """Seconds from the fault until completions over ``window`` seconds are
    back to 90 % of their rate just before it."""
    since = fault_at - BASELINE_SECONDS
    before = sum(1 for t in finished if since <= t < fault_at) / BASELINE_SECONDS
    if before == 0:
        return None
    start = fault_at
    while start < (finished[-1] if finished else fault_at):
        count = sum(1 for t in finished if start <= t < start + window)
        if count / window >= 0.9 * before:
            return start + window - fault_at
        start += 0.25
    return None
