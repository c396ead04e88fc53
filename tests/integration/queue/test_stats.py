"""One per-queue stats function (pgqueue.stats), read from one snapshot, behind
both the API's GET /queues and the command line's ``queues`` and ``top``."""

from __future__ import annotations

import dataclasses
import json

from typer.testing import CliRunner

from pgqueue import AsyncQueue, JobState, Queue, Settings
from pgqueue.cli import app
from pgqueue.core.stats import QueueStats, per_queue, total
from tests.support import api_client


def _traffic(queue: Queue) -> None:
    """mail: 2 runnable, 1 succeeded; web: 1 dead after one failed attempt, 1 cancelled."""
    for _ in range(3):
        queue.enqueue("t", queue="mail")
    [done] = queue.claim(1, worker="w", queues=["mail"])
    queue.ack(done, None)
    queue.enqueue("t", queue="web", max_attempts=1)
    [doomed] = queue.claim(1, worker="w", queues=["web"])
    assert queue.fail(doomed, "boom") is JobState.DEAD
    queue.cancel(queue.enqueue("t", queue="web").id)


def test_per_queue_merges_live_jobs_totals_and_the_last_minute(queue: Queue) -> None:
    assert next(per_queue()).name == "snapshot_begin"  # one read-only snapshot
    _traffic(queue)
    rows = queue.run(per_queue(), transaction=True)
    assert list(rows) == ["mail", "web"]
    assert rows["mail"].oldest_runnable_seconds > 0
    assert dataclasses.replace(rows["mail"], oldest_runnable_seconds=0.0) == QueueStats(
        queued=2, succeeded=1, succeeded_last_minute=1
    )
    assert rows["web"] == QueueStats(failed=1, dead=1, cancelled=1, dead_last_minute=1)
    assert rows["web"].finished_last_minute == 1  # a cancel is not work done
    everything = total(rows.values())
    assert (everything.queued, everything.succeeded, everything.dead) == (2, 1, 1)
    assert everything.oldest_runnable_seconds == rows["mail"].oldest_runnable_seconds
    assert total([]) == QueueStats()


async def test_the_api_and_the_cli_report_the_same_numbers(
    queue: Queue, aqueue: AsyncQueue, settings: Settings
) -> None:
    _traffic(queue)
    assert (await aqueue.run(per_queue(), transaction=True)).keys() == {"mail", "web"}
    async with api_client(settings) as c:
        over_http = (await c.get("/queues")).json()["queues"]
    result = CliRunner().invoke(app, ["--database-url", settings.database_url, "queues", "--json"])
    assert result.exit_code == 0, result.output
    on_the_command_line = json.loads(result.stdout)["queues"]
    assert [q["queue"] for q in over_http] == [q["queue"] for q in on_the_command_line]
    for http, cli in zip(over_http, on_the_command_line, strict=True):
        assert http["jobs"] == {k: cli[k] for k in ("queued", "scheduled", "running", "waiting")}
        assert http["totals"] == {
            "succeeded": cli["succeeded"],
            "failed_attempts": cli["failed"],
            "dead": cli["dead"],
            "cancelled": cli["cancelled"],
            "snoozed": cli["snoozed"],
        }
