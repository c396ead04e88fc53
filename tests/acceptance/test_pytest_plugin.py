"""pgqueue's pytest plugin, as a user's own test suite loads it: a separate
pytest session on a small project (tests/acceptance/user_project), which
finds the fixtures through the entry point, runs jobs with
``pgqueue.testing``'s drain and eager mode, and checks a handler with the
``pgqueue_assert_idempotent`` fixture."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pgqueue.db.embedded import EmbeddedPostgres

pytestmark = pytest.mark.acceptance

PROJECT = Path(__file__).resolve().parent / "user_project"


def _run_user_suite(folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    shutil.copytree(PROJECT, folder)
    (folder / "check_user_project.py").rename(folder / "test_user_project.py")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user_project.py"],
        cwd=folder,
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize("server", ["given", "embedded"])
def test_a_users_suite_gets_a_database_and_runs_jobs_inline(
    server: str, pg_server: EmbeddedPostgres, server_dir: Path
) -> None:
    """``given``: PGQUEUE_TEST_ADMIN_URL names a server; ``embedded``: the
    plugin starts one of its own for the session."""
    env = {"PGQUEUE_TEST_ADMIN_URL": pg_server.url} if server == "given" else {}
    done = _run_user_suite(server_dir / "project", **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 passed" in done.stdout, done.stdout
