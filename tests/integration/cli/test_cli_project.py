"""One database per project: the command line finds the project by walking up
from the current folder (as git finds .git) and uses its database; commands
that only act on a database never start or create an embedded server; with no
database to be found they say what they looked for and how to name one.

Every command runs as a user runs it: ``python -m pgqueue`` in a folder of its
own, with no DATABASE_URL or PGQUEUE_* in its environment unless the test
sets one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgqueue import Queue, Settings
from pgqueue.db.embedded import EmbeddedPostgres

# Commands that act on an existing database (read, or write jobs and
# controls): none of them may start or create an embedded server.
ACTING = [
    ["jobs", "show", "6"],
    ["jobs", "list"],
    ["jobs", "cancel", "6"],
    ["jobs", "retry", "--all-dead"],
    ["jobs", "bulk", "cancel", "--queue", "q", "--yes"],
    ["enqueue", "echo"],
    ["queues"],
    ["queues", "pause", "q"],
    ["queues", "history", "q"],
    ["top", "--iterations", "1"],
    ["workers"],
    ["schedules"],
    ["workflows", "show", "6"],
    ["batches", "show", "6"],
    ["prune"],
]


@pytest.fixture
def home(server_dir: Path) -> Iterator[Path]:
    """A folder for the test's projects; every embedded server made under it
    (by the test, or wrongly by a command) is destroyed after."""
    yield server_dir
    for folder in folders(server_dir):
        if (folder / "pgdata").is_dir():
            EmbeddedPostgres(folder).destroy()


def pgqueue(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_") and k != "DATABASE_URL"
    }
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", *args],
        cwd=cwd,
        env={**clean, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def ok_json(cwd: Path, *args: str, **env: str) -> Any:
    done = pgqueue(cwd, *args, "--json", **env)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def folders(under: Path) -> list[Path]:
    """Every folder under ``under`` that we may read (a server's pgdata is
    its own user's alone)."""
    return [Path(top) / name for top, names, _ in os.walk(under) for name in names]


def data_folders(under: Path) -> list[Path]:
    return sorted(path for path in folders(under) if path.name == ".pgqueue")


def migrated_project(home: Path) -> tuple[Path, Path]:
    """A project with a running, migrated embedded server, and a folder deep inside it."""
    project = home / "project"
    inside = project / "src" / "app"
    inside.mkdir(parents=True)
    ok_json(project, "migrate")
    return project, inside


def test_jobs_show_from_a_subfolder_reads_the_projects_database(home: Path) -> None:
    project, inside = migrated_project(home)
    job = ok_json(project, "enqueue", "echo", "--payload", '{"from": "the project"}')

    shown = ok_json(inside, "jobs", "show", str(job["id"]))

    assert (shown["id"], shown["payload"]) == (job["id"], {"from": "the project"})
    assert data_folders(home) == [project / ".pgqueue"]  # nothing started in the subfolder


def test_the_advice_to_migrate_reaches_the_database_that_needed_it(home: Path) -> None:
    project = home / "project"
    inside = project / "docs"
    inside.mkdir(parents=True)
    ok_json(project, "db", "start")  # a server, never migrated

    line = one_line_error(pgqueue(inside, "jobs", "list"))
    assert "not migrated: run `pgqueue migrate`" in line
    ok_json(inside, "migrate")  # the advice, followed where it was given

    assert ok_json(project, "jobs", "list") == []
    assert data_folders(home) == [project / ".pgqueue"]


@pytest.mark.parametrize("command", ACTING, ids=" ".join)
def test_a_command_outside_any_project_names_no_database_and_starts_none(
    home: Path, command: list[str]
) -> None:
    elsewhere = home / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)

    line = one_line_error(pgqueue(elsewhere, *command))

    assert line.startswith("error: no database:"), line
    assert f"no pgqueue project in {elsewhere} or any folder above it" in line
    assert ".pgqueue/" in line and "[tool.pgqueue]" in line  # what it looked for
    assert "DATABASE_URL" in line and "--database-url" in line  # how to name one
    assert "pgqueue up" in line
    assert data_folders(home) == []


def test_a_stopped_project_server_is_reported_not_started(home: Path) -> None:
    project, inside = migrated_project(home)
    assert pgqueue(project, "db", "stop").returncode == 0
    server = EmbeddedPostgres(project / ".pgqueue")

    line = one_line_error(pgqueue(inside, "jobs", "show", "6"))

    assert f"the embedded server of the project in {project} is stopped" in line
    assert "`pgqueue db start`" in line
    assert not server.is_running()
    assert data_folders(home) == [project / ".pgqueue"]


def test_a_project_named_by_its_pyproject_keeps_its_server_where_it_says(home: Path) -> None:
    project = home / "project"
    inside = project / "src"
    inside.mkdir(parents=True)
    (project / "pyproject.toml").write_text('[tool.pgqueue]\ndata_dir = "var/pg"\n')

    started = ok_json(inside, "db", "start")  # a command that starts things, from a subfolder

    assert started["data_dir"] == str(project / "var" / "pg")
    assert ok_json(inside, "migrate")["applied"]
    assert ok_json(project, "db", "status")["running"] is True
    assert data_folders(home) == []  # not the default folder, anywhere
    assert not (inside / "var").exists()


def test_a_url_wins_over_the_project_and_starts_nothing(home: Path, db_url: str) -> None:
    project, inside = migrated_project(home)
    ok_json(project, "enqueue", "in_the_project")
    with Queue(db_url) as elsewhere_db:
        named = elsewhere_db.enqueue("in_the_named_database")
    outside = home / "outside"
    outside.mkdir()

    for cwd in (inside, outside):
        by_flag = ok_json(cwd, "--url", db_url, "jobs", "list")
        by_env = ok_json(cwd, "jobs", "list", DATABASE_URL=db_url)
        assert [job["id"] for job in by_flag] == [job["id"] for job in by_env] == [named.id]
    assert data_folders(home) == [project / ".pgqueue"]


def test_a_relative_data_dir_is_the_projects_unless_a_flag_or_the_environment_says_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    inside = project / "src"
    inside.mkdir(parents=True)
    monkeypatch.chdir(inside)
    (project / "pyproject.toml").write_text('[tool.pgqueue]\ndata_dir = "var/pg"\n')

    assert Settings.load(root=project, environ={}).data_dir == str(project / "var" / "pg")
    (project / "pyproject.toml").write_text("[tool.pgqueue]\n")
    assert Settings.load(root=project, environ={}).data_dir == str(project / ".pgqueue")
    from_env = Settings.load(root=project, environ={"PGQUEUE_DATA_DIR": "here"})
    assert from_env.data_dir == "here"  # relative to the current folder, as typed
    assert Settings.load(root=project, environ={}, data_dir="flag").data_dir == "flag"
