"""Helpers shared by several test modules."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import psycopg

from pgqueue import Job, JobState, Queue, Settings
from pgqueue.api import create_app
from pgqueue.api.server import Server, uvicorn_config
from pgqueue.core.transitions import reap
from pgqueue.db.migrate import NO_TRANSACTION, statements
from pgqueue.sql import QUERIES, migration_files
from pgqueue.worker import AsyncWorker


@contextlib.asynccontextmanager
async def running(worker: AsyncWorker) -> AsyncIterator[AsyncWorker]:
    """The worker runs on the test's loop for the block; stopped after it."""
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        await worker.stop()
        await task


async def until(predicate: Callable[[], Any], timeout: float = 10.0) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def past_first_heartbeat(worker: AsyncWorker, sql: psycopg.Connection[Any]) -> None:
    """The worker's first heartbeat, at its start, registers it: once its
    row is there, the next heartbeat is a heartbeat interval away. (A job
    enqueued before could be cancelled before that first heartbeat, which
    would then find its lease gone.)"""
    registered = "SELECT 1 FROM pgqueue_workers WHERE name = %s"
    await until(lambda: sql.execute(registered, (worker.name,)).fetchone() is not None)


def take_over(queue: Queue, job_id: int, worker: str = "other") -> Job:
    """Expire a running job's lease, reap it and claim it again as ``worker``:
    whoever held it before now holds a stale token. The lease expires and is
    reaped in one transaction, so that a running worker's own reaper never
    sees it expired (and takes the reap from this one)."""
    with psycopg.connect(queue.url) as conn:
        conn.execute(
            "UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 s', "
            "run_at = now() WHERE id = %s",
            (job_id,),
        )
        assert queue.run(reap(queue.settings), connection=conn) == {job_id: JobState.QUEUED}
        conn.execute("UPDATE pgqueue_jobs SET run_at = now() WHERE id = %s", (job_id,))
    [taken] = queue.claim(1, worker=worker)
    return taken


@contextlib.asynccontextmanager
async def api_client(
    settings: Settings, base_url: str = "http://localhost", **client: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The app over ``settings``, started as uvicorn would (its lifespan),
    called through httpx's ASGI transport. localhost is a name the API
    answers to without tokens."""
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=base_url, **client
        ) as http,
    ):
        yield http


class LiveServer:
    """uvicorn serving an app in a thread, on a socket bound beforehand,
    configured as ``pgqueue api`` runs it (``options`` change that)."""

    def __init__(self, app: object, **options: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn_config(app, log_level="warning", access_log=False, **options)
        self.server = Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def executed_plan(
    sql: psycopg.Connection[Any], name: str, params: dict[str, Any]
) -> tuple[str, int]:
    """EXPLAIN (ANALYZE, BUFFERS) of a named query, run for real (the caller
    rolls back what it writes): the plan, and the shared buffers it touched
    (its first total, before planning's)."""
    rows = sql.execute("EXPLAIN (ANALYZE, BUFFERS) " + QUERIES[name], params).fetchall()
    plan = "\n".join(row[0] for row in rows)
    return plan, int(re.findall(r"shared hit=(\d+)", plan.split("Planning")[0])[0])


@dataclasses.dataclass
class PlanReads:
    """What an executed plan read: shared buffers touched, rows every scan
    node produced or filtered out (times its loops: a scan repeated inside a
    nested loop counts each time), and how it reached pgqueue_jobs (node
    type, and index when there is one)."""

    buffers: int
    rows: float
    scans: set[str]


# auto_explain, told to send every plan it makes to the client as a notice,
# the plans of the statements that functions run included (plan_reads sets
# them for the caller's transaction, or in autocommit for the session until
# it resets them).
NESTED_PLANS = {
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_nested_statements": "on",
    "auto_explain.log_format": "json",
    "auto_explain.log_level": "notice",
}


@contextlib.contextmanager
def _nested_plans(sql: psycopg.Connection[Any]) -> Iterator[list[str]]:
    """The plans (auto_explain, JSON) of the statements that pgqueue's
    functions run while in the block, which EXPLAIN does not show."""
    plans: list[str] = []

    def heard(notice: psycopg.errors.Diagnostic) -> None:
        plans.append(notice.message_primary or "")

    sql.execute("LOAD 'auto_explain'")
    for setting, value in NESTED_PLANS.items():
        # For the transaction, or (autocommit) for the session until reset below.
        sql.execute("SELECT set_config(%s, %s, %s)", [setting, value, not sql.autocommit])
    sql.add_notice_handler(heard)
    try:
        yield plans
    finally:
        sql.remove_notice_handler(heard)
        if sql.autocommit:
            for setting in NESTED_PLANS:
                sql.execute(f"RESET {setting}")


def nested_plan_text(sql: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> str:
    """Run a named query (the caller rolls back what it writes) and return
    the plans of the statements run inside pgqueue's functions, as text."""
    with _nested_plans(sql) as plans:
        sql.execute(QUERIES[name], params)
    return "\n".join(plans)


def plan_reads(
    sql: psycopg.Connection[Any], name: str, params: dict[str, Any], *, nested: bool = False
) -> PlanReads:
    """EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of a named query, run for real
    (the caller rolls back what it writes). ``nested``: the scans of the
    statements that pgqueue's functions run, which EXPLAIN does not show,
    count too (auto_explain); their buffers are the statement's already."""
    seen: contextlib.AbstractContextManager[list[str]] = (
        _nested_plans(sql) if nested else contextlib.nullcontext([])
    )
    with seen as plans:
        [[document]] = sql.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES[name], params
        ).fetchall()
    top = document[0]["Plan"]
    reads = PlanReads(top["Shared Hit Blocks"] + top["Shared Read Blocks"], 0.0, set())
    _count_scans(top, reads)
    for plan in plans:
        if "{" in plan:  # "duration: ... plan:" and the JSON document
            nested_plan = json.loads(plan[plan.index("{") :])["Plan"]
            _count_scans(nested_plan, PlanReads(0, 0.0, reads.scans), executed_only=True)
    return reads


def _count_scans(top: dict[str, Any], reads: PlanReads, *, executed_only: bool = False) -> None:
    """Add the scans of an executed plan to ``reads``: the rows each scan
    node produced or filtered out, and how it reached pgqueue_jobs.
    ``executed_only``: leave out the nodes that never ran (a function's
    plan holds the branches of every case)."""
    nodes = [top]
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        if not node["Node Type"].endswith("Scan"):
            continue
        if executed_only and node.get("Actual Loops", 1) == 0:
            continue
        seen = sum(
            node.get(key, 0)
            for key in ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Join Filter")
        )
        reads.rows += seen * node.get("Actual Loops", 1)
        if node.get("Relation Name") == "pgqueue_jobs":
            reads.scans.add(" ".join(filter(None, [node["Node Type"], node.get("Index Name")])))


def query_plan(sql: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> str:
    """EXPLAIN of a named query, with sequential scans off: on a test's tiny
    tables, this asks which index the planner can use, not which it prefers."""
    sql.execute("SET enable_seqscan = off")
    try:
        rows = sql.execute("EXPLAIN " + QUERIES[name], params).fetchall()
    finally:
        sql.execute("RESET enable_seqscan")
    return "\n".join(row[0] for row in rows)


def migrated_before(url: str, version: str) -> None:
    """Apply (and record) every migration older than ``version`` to an empty
    database, as a server upgraded from an older release has them."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(QUERIES["migration_table"])
        for name, text in migration_files():
            if name < version:
                parts = statements(text) if text.startswith(NO_TRANSACTION) else [text]
                for part in parts:
                    conn.execute(part)
                conn.execute(QUERIES["migration_record"], {"version": name})
