"""``pgqueue doctor``: the report as a table or JSON, exit code 1 when a
check fails (--strict: when one warns), options checked. The failing case
(a synchronous standby named but absent) is in
tests/integration/queue/test_doctor_own_server.py, on a server of its own."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from typer.testing import CliRunner, Result

from pgqueue import Queue
from pgqueue.cli import app

runner = CliRunner()


def doctor(db_url: str, *args: str) -> Result:
    return runner.invoke(app, ["--database-url", db_url, "doctor", "--window", "0.1s", *args])


def test_a_healthy_database_exits_0_with_a_table_of_every_check(db_url: str) -> None:
    result = doctor(db_url)
    assert result.exit_code == 0, result.output
    for name in ("rate", "cost", "headroom", "long_transactions", "claim_plan", "workers"):
        assert name in result.output
    assert "ok as role" in result.output


def test_a_warning_exits_0_unless_strict_and_json_carries_the_report(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    queue.enqueue("a")
    [job] = queue.claim(worker="gone")
    sql.execute(
        "UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 hour' WHERE id = %s",
        [job.id],
    )
    result = doctor(db_url, "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["status"] == "warn"
    [stuck] = [c for c in body["checks"] if c["name"] == "stuck_jobs"]
    assert stuck["status"] == "warn" and stuck["value"] == 1 and stuck["advice"]
    strict = doctor(db_url, "--strict")
    assert strict.exit_code == 1
    assert "stuck_jobs" in strict.output and "start a worker" in strict.output


def test_bad_options_are_usage_errors(db_url: str) -> None:
    for args, name in (
        (["--window", "0s"], "--window"),
        (["--window", "2m"], "--window"),
        (["--long-transaction", "soon"], "--long-transaction"),
        (["--cores", "0"], "--cores"),
    ):
        result = doctor(db_url, *args)
        assert result.exit_code == 2, args
        assert name in result.output
