"""One settings loader for every entry point: flags > PGQUEUE_* environment >
[tool.pgqueue] of ./pyproject.toml > defaults, the same for the library, the
API and the worker as for the command line (tests/integration/cli/test_cli_config.py)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from pgqueue import AsyncQueue, InvalidSettings, Queue, Settings
from pgqueue.api import create_app
from pgqueue.worker import AsyncWorker


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_url: str) -> Path:
    """A folder whose pyproject.toml names the test's database and two settings."""
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("PGQUEUE_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.pgqueue]\ndatabase_url = "{db_url}"\ndefault-max-attempts = 3\nconcurrency = 7\n'
    )
    return tmp_path


def test_queue_with_no_settings_reads_the_project_file(project: Path) -> None:
    with Queue() as q:
        job = q.enqueue("t")
    assert (q.settings.concurrency, job.max_attempts) == (7, 3)


async def test_async_queue_with_no_settings_reads_the_project_file(project: Path) -> None:
    async with AsyncQueue() as q:
        job = await q.enqueue("t")
    assert job.max_attempts == 3


async def test_api_with_no_settings_reads_the_project_file(project: Path) -> None:
    app = create_app()
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as api,
    ):
        created = await api.post("/jobs", json={"task": "t"})
    assert created.status_code == 201, created.text
    assert created.json()["max_attempts"] == 3


def test_worker_with_no_settings_reads_the_project_file(project: Path) -> None:
    assert AsyncWorker({}).concurrency == 7


def test_the_environment_beats_the_file_and_flags_beat_both(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_CONCURRENCY", "9")
    monkeypatch.setenv("PGQUEUE_NOTIFY_FINISHED", "off")
    monkeypatch.setenv("PGQUEUE_LATENCY_BUCKETS", "0.5,2")
    loaded = Settings.load(default_max_attempts=4, api_port=None)
    assert (loaded.concurrency, loaded.default_max_attempts, loaded.api_port) == (9, 4, 8000)
    assert loaded.notify_finished is False and loaded.latency_buckets == (0.5, 2.0)
    with Queue() as q:
        assert q.settings.concurrency == 9


@pytest.mark.parametrize(
    ("variable", "raw", "needle"),
    [
        ("PGQUEUE_NOTIFY_FINISHED", "maybe", "PGQUEUE_NOTIFY_FINISHED: expected bool"),
        ("PGQUEUE_LEASE_SECONDS", "long", "PGQUEUE_LEASE_SECONDS: expected float"),
        ("PGQUEUE_LATENCY_BUCKETS", "1,x", "PGQUEUE_LATENCY_BUCKETS: expected tuple[float, ...]"),
    ],
)
def test_a_bad_environment_variable_names_itself(
    project: Path, variable: str, raw: str, needle: str
) -> None:
    with pytest.raises(InvalidSettings) as raised:
        Settings.load(environ={variable: raw})
    assert str(raised.value).startswith(needle), raised.value


def test_skip_locked_is_no_longer_a_setting(project: Path) -> None:
    (project / "pyproject.toml").write_text("[tool.pgqueue]\nskip_locked = false\n")
    with pytest.raises(InvalidSettings, match="unknown setting 'skip_locked'"):
        Settings.load()
    with pytest.raises(TypeError):
        Settings(skip_locked=False)  # type: ignore[call-arg]
