"""PostgreSQL restarted under load: every job succeeds (bench.faults.restart,
small). Fast mode ends every session and aborts open transactions; immediate
mode is a crash (no checkpoint, recovery from the WAL at start), so it also
proves that what was committed survives. The server is this test's own
(tmpfs, fsync on): the session's shared server must not be restarted under
other tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from bench.faults import restart
from pgqueue import migrate
from pgqueue.db.embedded import EmbeddedPostgres, StopMode

pytestmark = pytest.mark.acceptance


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    root = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    server = EmbeddedPostgres(os.path.join(root, f"pgqueue-restart-{uuid.uuid4().hex[:8]}"))
    try:
        server.ensure_running()
        yield server
    finally:
        server.destroy()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_every_job_succeeds_across_a_restart(own_server: EmbeddedPostgres, mode: StopMode) -> None:
    url = own_server.url
    migrate(url)
    pid_before = own_server.pid()
    result = restart.run(url, lambda: own_server.restart(mode), jobs=150, workers=3, at=0.3)
    summary = {k: v for k, v in result.items() if k not in ("invariants", "parameters")}
    assert own_server.pid() != pid_before, "the server was not restarted"
    assert result["invariants"]["ok"], result["invariants"]["violations"]
    assert result["jobs_succeeded"] == 150, summary
    # What was committed before the restart (or crash) came through as it was.
    assert result["committed_before_restart_changed"] == [], summary
    # The restart came mid-run, not before or after the work.
    assert 0 < result["at_restart"]["succeeded"] < 150, summary
    assert result["workers_alive_throughout"], summary
    assert result["worker_exit_codes"] == [0, 0, 0], summary
