"""The workers registry against a real PostgreSQL: a worker registers when it
starts, reports what it holds at each heartbeat, leaves when it stops; a
killed worker's row goes stale and is pruned; a worker that stopped claiming
while work waits is flagged. Seen through the API, the CLI and /metrics."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from harness import fault_tasks
from pgqueue import AsyncQueue, Job, Queue, Settings
from pgqueue.cli import app
from pgqueue.core import workers
from pgqueue.worker import AsyncWorker
from pgqueue.worker.producer import Producer
from tests.support import api_client, running, until

FAST = {"heartbeat_seconds": 0.2, "lease_seconds": 2.0, "poll_interval_seconds": 0.1}


async def test_a_worker_registers_reports_what_it_holds_and_leaves(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    settings = settings.replace(**FAST)
    release = asyncio.Event()

    async def wait(job: Job) -> None:
        await release.wait()

    worker = AsyncWorker({"wait": wait}, settings=settings, queues=["mail"], concurrency=4)
    async with running(worker), api_client(settings) as http:
        await aqueue.enqueue("wait", queue="mail")
        await aqueue.enqueue("wait", queue="mail")

        async def listed() -> list[dict[str, Any]]:
            response = await http.get("/workers")
            assert response.status_code == 200, response.text
            return list(response.json()["workers"])

        await until(lambda: worker.held_count == 2)
        rows: list[dict[str, Any]] = []
        for _ in range(100):  # the next heartbeat reports them
            rows = await listed()
            if rows and rows[0]["held"] == 2:
                break
            await asyncio.sleep(0.05)
        [row] = rows
        assert row["name"] == worker.name and row["alive"] and not row["stalled"]
        assert (row["host"], row["pid"]) == (socket.gethostname(), os.getpid())
        assert (row["queues"], row["concurrency"], row["running"]) == (["mail"], 4, 2)
        metrics = (await http.get("/metrics")).text
        families = {f.name: f for f in text_string_to_metric_families(metrics)}
        [live] = [s for s in families["pgqueue_workers"].samples if s.labels["queue"] == "mail"]
        assert live.value == 1
        cli = CliRunner().invoke(
            app, ["--database-url", settings.database_url, "workers", "--json"]
        )
        assert cli.exit_code == 0, cli.output
        assert json.loads(cli.stdout)["workers"][0]["name"] == worker.name
        release.set()
    async with api_client(settings) as http:
        assert (await http.get("/workers")).json()["workers"] == []


def test_a_killed_workers_row_goes_stale_and_is_pruned(
    db_url: str, queue: Queue, tmp_path: Path
) -> None:
    proc = fault_tasks.spawn_worker(db_url, **FAST)
    try:
        fault_tasks.wait_for(lambda: len(queue.run(workers.list_workers())) == 1, timeout=30)
        [row] = queue.run(workers.list_workers())
        assert row.alive and row.pid == proc.pid
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # Three missed heartbeats later it is listed as gone, not alive.
        fault_tasks.wait_for(lambda: not queue.run(workers.list_workers())[0].alive, timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Any other worker's maintenance prunes it once past the retention.
    pruner_settings = Settings(
        database_url=db_url, worker_retention_seconds=0.1, prune_interval_seconds=0.2, **FAST
    )

    async def prune_with_another_worker() -> None:
        async with running(AsyncWorker({}, settings=pruner_settings, name="pruner")):
            await until(lambda: [r.name for r in queue.run(workers.list_workers())] == ["pruner"])

    asyncio.run(prune_with_another_worker())


async def test_a_worker_that_stopped_claiming_while_work_waits_is_flagged(
    settings: Settings, aqueue: AsyncQueue, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def claims_nothing(self: Producer) -> None:
        await asyncio.Event().wait()  # a claim loop that went quiet

    monkeypatch.setattr(Producer, "claim_loop", claims_nothing)
    # (Its stop waits for the quiet loop until the shutdown timeout.)
    quiet = settings.replace(shutdown_timeout_seconds=0.5, **FAST)
    worker = AsyncWorker({"t": lambda job: None}, settings=quiet, name="quiet")
    async with running(worker):
        await until(lambda: len(queue.run(workers.list_workers())) == 1)
        [row] = queue.run(workers.list_workers(stall_seconds=0.3))
        assert row.alive and not row.stalled  # nothing waits
        await aqueue.enqueue("t")
        await asyncio.sleep(0.5)
        [row] = queue.run(workers.list_workers(stall_seconds=0.3))
        assert row.alive and row.stalled
