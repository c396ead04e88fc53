"""``pgqueue jobs signal ID NAME [--payload JSON]`` against a real database:
the signal stored with its payload, the job printed (or as JSON), and bad
input as one line on stderr with nothing stored (exit 2 for usage, 1 at
run time)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from typer.testing import CliRunner, Result

from pgqueue import Queue
from pgqueue.cli import app

runner = CliRunner()


def run(db_url: str, *args: str) -> Result:
    return runner.invoke(app, ["--database-url", db_url, "jobs", "signal", *args])


def stored(sql: psycopg.Connection[Any]) -> list[tuple[int, str, Any]]:
    rows = sql.execute("SELECT job_id, name, payload FROM pgqueue_job_signals ORDER BY id")
    return [(row[0], row[1], row[2]) for row in rows.fetchall()]


def assert_one_line_error(result: Result, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_a_signal_is_sent_with_its_payload(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    job = queue.enqueue("approval")
    said = run(db_url, str(job.id), "approved", "--payload", '{"by": "ann"}')
    assert said.exit_code == 0, said.output
    assert f"sent signal approved to job {job.id} (approval, queued)" in said.stdout
    out = run(db_url, str(job.id), "ping", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["id"] == job.id
    assert stored(sql) == [(job.id, "approved", {"by": "ann"}), (job.id, "ping", None)]


BAD = [
    (["424242", "go"], 1, ["job 424242 does not exist"]),
    (["JOB", "bad name"], 1, ["invalid job: name"]),
    (["JOB", "x" * 201], 1, ["invalid job: name"]),
    (["JOB", ""], 1, ["invalid job: name"]),
    (["JOB", "go", "--payload", "{not json"], 2, ["--payload", "not valid JSON"]),
    (["JOB", "go", "--payload", "[" * 100 + "]" * 100], 1, ["invalid job: payload"]),
    (["JOB", "go", "--payload", "[" * 5000 + "]" * 5000], 2, ["--payload", "deeply"]),
    (["FINISHED", "go"], 1, ["cannot signal job", "succeeded"]),
    (["abc", "go"], 2, ["ID"]),
    (["JOB"], 2, ["NAME"]),
]


def test_bad_signals_are_one_line_errors_and_store_nothing(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    finished = queue.enqueue("done")
    [claimed] = queue.claim(1)
    queue.ack(claimed, None)
    job = queue.enqueue("t")
    ids = {"JOB": str(job.id), "FINISHED": str(finished.id)}
    for args, code, needles in BAD:
        assert_one_line_error(run(db_url, *[ids.get(a, a) for a in args]), code, *needles)
    assert stored(sql) == []
