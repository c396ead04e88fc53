"""Where the command line's settings come from: flags > PGQUEUE_* environment >
[tool.pgqueue] in ./pyproject.toml > defaults, one Settings object; and the
commands that only touch configuration or the embedded server."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pgqueue import Settings
from pgqueue.cli import app
from pgqueue.db.embedded import EmbeddedPostgres

runner = CliRunner()

PYPROJECT = """
[project]
name = "someone-else"

[tool.pgqueue]
concurrency = 7
retention-seconds = 120
api_port = 9100
api_tokens = ["a", "b"]
data_dir = "from-file"
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("PGQUEUE_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    return tmp_path


def test_file_then_environment_then_flags(project: Path) -> None:
    s = Settings.load()
    assert (s.concurrency, s.retention_seconds, s.api_port) == (7, 120.0, 9100)
    assert s.api_tokens == ("a", "b") and s.data_dir == "from-file"
    assert s.lease_seconds == 30.0  # a default

    env = {"PGQUEUE_CONCURRENCY": "9", "PGQUEUE_API_TOKENS": "x", "DATABASE_URL": "postgresql://e"}
    s = Settings.load(environ=env)
    assert (s.concurrency, s.api_tokens, s.api_port) == (9, ("x",), 9100)
    assert s.database_url == "postgresql://e"

    s = Settings.load(concurrency=11, api_port=None, environ=env)
    assert (s.concurrency, s.api_port) == (11, 9100)


def test_database_url_from_the_file_loses_to_the_environment(project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.pgqueue]\ndatabase_url = "postgresql://file"\n')
    assert Settings.load(environ={}).database_url == "postgresql://file"
    assert Settings.load(environ={"DATABASE_URL": "postgresql://env"}).database_url == (
        "postgresql://env"
    )


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ("colour = 1", "unknown setting 'colour'"),
        ('concurrency = "ten"', "concurrency: expected int"),
        ("concurrency = 0", "concurrency must be >= 1"),
        ("notify_finished = 1", "notify_finished: expected bool"),
    ],
)
def test_a_bad_file_is_a_usage_error(project: Path, table: str, needle: str) -> None:
    (project / "pyproject.toml").write_text(f"[tool.pgqueue]\n{table}\n")
    result = runner.invoke(app, ["db", "status"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: configuration:") and needle in result.stderr
    assert "Traceback" not in result.output


def test_a_bad_environment_variable_is_a_usage_error(project: Path) -> None:
    result = runner.invoke(app, ["db", "status"], env={"PGQUEUE_CONCURRENCY": "lots"})
    assert result.exit_code == 2
    assert "PGQUEUE_CONCURRENCY" in result.stderr and "Traceback" not in result.output


def test_db_start_status_url_stop(project: Path, server_dir: Path) -> None:
    data = server_dir / "pg"
    status = json.loads(
        runner.invoke(app, ["--data-dir", str(data), "db", "status", "--json"]).stdout
    )
    assert status["running"] is False and status["initialised"] is False
    result = runner.invoke(app, ["db", "url"], env={"PGQUEUE_DATA_DIR": str(data)})
    assert result.exit_code == 1 and "no embedded server" in result.stderr
    try:
        started = runner.invoke(app, ["--data-dir", str(data), "db", "start"])
        assert started.exit_code == 0, started.output
        server = EmbeddedPostgres(data)
        assert server.is_running()
        status = json.loads(
            runner.invoke(app, ["--json", "--data-dir", str(data), "db", "status"]).stdout
        )
        assert status["running"] is True and status["pid"] == server.pid()
        assert status["port"] == server.port
        human = runner.invoke(app, ["--data-dir", str(data), "db", "status"]).stdout
        assert human.startswith("running") and f"pid {server.pid()}" in human
        url = runner.invoke(app, ["--data-dir", str(data), "db", "url"]).stdout.strip()
        assert url == server.url
        stopped = runner.invoke(app, ["--data-dir", str(data), "db", "stop"])
        assert stopped.exit_code == 0 and "stopped" in stopped.stdout
        assert not server.is_running()
        assert runner.invoke(app, ["--data-dir", str(data), "db", "status"]).stdout.startswith(
            "stopped"
        )
    finally:
        EmbeddedPostgres(data).destroy()


def test_worker_and_api_refuse_bad_options_before_starting(project: Path) -> None:
    result = runner.invoke(app, ["worker", "--handlers", "no_such_module:HANDLERS"])
    assert result.exit_code == 2 and "--handlers" in result.stderr
    assert "No module named 'no_such_module'" in result.stderr
    result = runner.invoke(app, ["worker", "--handlers", "nocolon"])
    assert result.exit_code == 2 and "package.module:ATTR" in result.stderr
    # Several processes: what needs no import of the module is checked first.
    for bad, said in (("no_such_module:HANDLERS", "No module named"), ("nocolon", "ATTR")):
        result = runner.invoke(app, ["worker", "--processes", "2", "--handlers", bad])
        assert result.exit_code == 2 and said in result.stderr, result.stderr
    assert not (project / ".pgqueue").exists()  # no embedded server was made
    result = runner.invoke(app, ["worker", "--handlers", "x:Y", "--concurrency", "0"])
    assert result.exit_code == 2
    (project / "pyproject.toml").write_text("")
    result = runner.invoke(app, ["api", "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "without authentication" in result.stderr


def test_several_workers_with_handlers_that_do_not_load_stop_with_a_usage_error(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    # The module exists, so the worker processes start before it is imported
    # here; it has no such mapping: they are stopped, and the error said.
    args = ["--database-url", db_url, "worker", "--processes", "2"]
    result = runner.invoke(app, [*args, "--handlers", "examples.tasks:NO_SUCH_MAPPING"])
    assert result.exit_code == 2, result.output
    assert "--handlers" in result.stderr and "NO_SUCH_MAPPING" in result.stderr
    assert "started 2 processes" in caplog.text  # they had started
    assert caplog.text.count("exited with code") == 2  # and were stopped
    assert not _worker_children()


def _worker_children() -> list[int]:
    """This process's children that run a worker (the supervisor's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == os.getpid() and b"child_main" in command and state != "Z":
            found.append(int(entry.name))
    return found
