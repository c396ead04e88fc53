"""pgqueue jobs watch: one job followed until it ends, its progress
reports shown as they come (percentage and info), exit 1 unless it
succeeded."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg
from typer.testing import CliRunner, Result

from pgqueue import Job, Queue
from pgqueue.cli import app
from pgqueue.core.transitions import Report, report_progress

runner = CliRunner()


def watch(db_url: str, *args: str) -> Result:
    return runner.invoke(app, ["--database-url", db_url, "jobs", "watch", *args])


def running_with_progress(queue: Queue, fraction: float, info: Any) -> Job:
    queue.enqueue("import_files", {"files": 5})
    [job] = queue.claim(1, worker="w")
    assert job.lease_token is not None
    queue.run(report_progress([Report(job.id, job.lease_token, fraction, json.dumps(info))]))
    return job


def once_watched(db_url: str, job: Job, end: Any) -> threading.Thread:
    """End the job once the watch waits for it (its wait registered)."""

    def wait_then_end() -> None:
        with psycopg.connect(db_url, autocommit=True) as sql:
            deadline = time.monotonic() + 10
            query = "SELECT 1 FROM pgqueue_waits WHERE job_id = %s"
            while sql.execute(query, (job.id,)).fetchone() is None:
                assert time.monotonic() < deadline, "the watch never waited for the job"
                time.sleep(0.01)
        end()

    thread = threading.Thread(target=wait_then_end)
    thread.start()
    return thread


def test_watch_shows_the_progress_then_the_result(db_url: str, queue: Queue) -> None:
    job = running_with_progress(queue, 0.4, {"last": "b.csv"})
    ender = once_watched(db_url, job, lambda: queue.ack(job, {"imported": 5}))
    result = watch(db_url, str(job.id))
    ender.join()
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"job {job.id} (import_files): running",
        '   40%  {"last": "b.csv"}',
        f'job {job.id} succeeded: {{"imported": 5}}',
    ]


def test_watch_of_a_job_that_dies_exits_1_with_its_error(db_url: str, queue: Queue) -> None:
    job = running_with_progress(queue, 0.25, None)
    ender = once_watched(db_url, job, lambda: queue.fail(job, "disk full", retryable=False))
    result = watch(db_url, str(job.id))
    ender.join()
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[1:] == ["   25%", f"job {job.id} dead: disk full"]


def test_watch_json_is_one_line_per_report_then_the_job_as_it_ended(
    db_url: str, queue: Queue
) -> None:
    job = running_with_progress(queue, 0.5, {"step": 2})
    ender = once_watched(db_url, job, lambda: queue.ack(job, 7))
    result = watch(db_url, str(job.id), "--json")
    ender.join()
    assert result.exit_code == 0, result.output
    report, ended = (json.loads(line) for line in result.stdout.splitlines())
    assert (report["state"], report["progress_fraction"], report["progress_info"]) == (
        "running",
        0.5,
        {"step": 2},
    )
    assert (ended["state"], ended["result"]) == ("succeeded", 7)


def test_watch_of_an_unknown_job_or_past_its_timeout_is_a_one_line_error(
    db_url: str, queue: Queue
) -> None:
    job = queue.enqueue("import_files")
    for args, needle in (
        (["999999"], "999999"),
        ([str(job.id), "--timeout", "0.2"], "did not finish within 0.2 s"),
    ):
        result = watch(db_url, *args)
        assert result.exit_code == 1 and "Traceback" not in result.output
        [line] = result.stderr.strip().splitlines()
        assert line.startswith("error: ") and needle in line, line
