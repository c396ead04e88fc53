"""Every command that reads or writes jobs, run against a real database that
was never migrated: one line saying to run `pgqueue migrate`, exit code 1."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    "command",
    [
        ["jobs", "list"],
        ["jobs", "show", "1"],
        ["jobs", "cancel", "1"],
        ["jobs", "retry", "1"],
        ["jobs", "retry", "--all-dead"],
        ["enqueue", "send_mail"],
        ["enqueue-file", "JOBS"],
        ["queues"],
        ["top", "--iterations", "1"],
        ["prune"],
    ],
)
def test_a_command_on_an_unmigrated_database_says_to_migrate(
    empty_db: str, tmp_path: Path, command: list[str]
) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"task": "send_mail"}\n')
    command = [str(jobs) if arg == "JOBS" else arg for arg in command]
    result = runner.invoke(app, ["--database-url", empty_db, *command])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [
        "error: the database schema is not migrated: run `pgqueue migrate`"
    ]
    with psycopg.connect(empty_db) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        assert tables.fetchone() == (0,)  # nothing was created on the way
