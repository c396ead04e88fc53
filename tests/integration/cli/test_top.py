"""``pgqueue top`` through the CLI runner: throughput between refreshes, the
workers alive, and a narrow terminal that drops columns, not queue names."""

from __future__ import annotations

import json

from typer.testing import CliRunner, Result

from pgqueue import Queue
from pgqueue.cli import app
from pgqueue.core.workers import WorkerInfo, register

QUEUES = ("emails-transactional", "reports.nightly-export")


def top(db_url: str, columns: int, *args: str) -> Result:
    return CliRunner().invoke(
        app,
        ["--database-url", db_url, "top", "--iterations", "2", "--interval", "0.2", *args],
        env={"COLUMNS": str(columns)},
    )


def busy(queue: Queue) -> None:
    for name in QUEUES:
        queue.enqueue_many([{"task": "t", "queue": name} for _ in range(3)])
        for job in queue.claim(2, worker="w", queues=[name]):
            queue.ack(job)
    for n in (1, 2):
        queue.run(
            register(WorkerInfo(f"worker-{n}", "host", n, "1", None, 10), 10.0, session=False)
        )


def last_frame(output: str) -> list[str]:
    """The lines of the last refresh (each starts with the title)."""
    return output[output.rindex("pgqueue top") :].splitlines()


def test_top_at_120_columns_shows_every_column_workers_and_rates(db_url: str, queue: Queue) -> None:
    busy(queue)
    result = top(db_url, 120)
    assert result.exit_code == 0, result.output
    frame = last_frame(result.output)
    assert "2 workers" in frame[0] and "jobs/s" in frame[0]
    header = frame[1].split()
    assert header == ["queue", "queued", "sched", "running", "wait", "ok", "failed", "dead",
                      "cancel", "oldest", "1m", "done/s"]  # fmt: skip
    for name in QUEUES:
        [row] = [line.split() for line in frame if line.startswith(name)]
        assert row[1] == "1" and row[header.index("ok")] == "2" and row[-1] == "0.0"
    assert max(len(line) for line in frame) <= 120


def test_top_at_50_columns_drops_columns_and_keeps_queue_names_whole(
    db_url: str, queue: Queue
) -> None:
    busy(queue)
    result = top(db_url, 50)
    assert result.exit_code == 0, result.output
    frame = last_frame(result.output)
    [header] = [line.split() for line in frame if line.startswith("queue ")]
    assert header[:3] == ["queue", "queued", "running"]
    assert "cancel" not in header and "sched" not in header
    for name in QUEUES:
        [row] = [line.split() for line in frame if line.startswith(name)]
        assert row[0] == name and row[1:3] == ["1", "0"]
    wide = last_frame(top(db_url, 200).output)
    [every] = [line.split() for line in wide if line.startswith("queue ")]
    assert len(every) > len(header)
    assert f"{len(every) - len(header)} more columns on a wider terminal" in result.output
    assert max(len(line) for line in frame) <= 50


def test_top_json_carries_rates_and_workers(db_url: str, queue: Queue) -> None:
    busy(queue)
    result = top(db_url, 80, "--json")
    frames = [json.loads(line) for line in result.stdout.splitlines()]
    assert frames[0]["done_per_second"] is None and frames[0]["done_per_second_by_queue"] is None
    assert frames[1]["done_per_second_by_queue"] == {name: 0.0 for name in QUEUES}
    assert frames[1]["workers"] == {"alive": 2, "stalled": 0}
