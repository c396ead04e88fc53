"""Worker processes as the command line runs them (``run_processes``), stopped
by signals: SIGTERM finishes the running job and exits 0; a second signal
exits at once; the supervisor restarts a child that dies. Linux only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import JobState, Queue, Settings

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and /proc"),
]
ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


@pytest.fixture
def start_worker(db_url: str) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(processes: int = 1, shutdown_timeout: float = 10.0) -> subprocess.Popen[bytes]:
        code = (
            "import sys; from pgqueue import Settings; "
            "from pgqueue.worker.processes import run_processes; "
            f"s = Settings(database_url={db_url!r}, shutdown_timeout_seconds={shutdown_timeout}, "
            "poll_interval_seconds=0.2); "
            "sys.exit(run_processes('examples.tasks:HANDLERS', queues=None, concurrency=4, "
            f"processes={processes}, settings=s))"
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def listeners(url: str) -> list[int]:
    """The workers' LISTEN connections (their last statement: the second LISTEN)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query IN ('LISTEN pgqueue_jobs', 'LISTEN pgqueue_cancelled')"
        ).fetchall()
    return [r[0] for r in rows]


def children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
                found.add(int(entry))
    return found


def test_sigterm_finishes_running_job_and_exits_0(
    start_worker: Callable[..., subprocess.Popen[bytes]], queue: Queue
) -> None:
    proc = start_worker()
    job = queue.enqueue("sleep", {"seconds": 1.0})
    wait_for(lambda: queue.get(job.id).state is JobState.RUNNING)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    done = queue.get(job.id)
    assert (done.state, done.result, done.attempts) == (JobState.SUCCEEDED, {"slept": 1.0}, 1)


def test_second_signal_exits_at_once(
    start_worker: Callable[..., subprocess.Popen[bytes]], queue: Queue
) -> None:
    proc = start_worker(shutdown_timeout=60.0)
    job = queue.enqueue("sleep", {"seconds": 60})
    wait_for(lambda: queue.get(job.id).state is JobState.RUNNING)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert proc.poll() is None  # waiting for the job
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=5) != 0
    assert queue.get(job.id).state is JobState.RUNNING  # left to its lease


def test_supervisor_restarts_a_dead_child_and_stops_cleanly(
    start_worker: Callable[..., subprocess.Popen[bytes]], queue: Queue, settings: Settings
) -> None:
    proc = start_worker(processes=2)
    wait_for(lambda: len(listeners(settings.database_url)) == 2)
    first = wait_for(lambda: children(proc.pid) if len(children(proc.pid)) == 2 else None)
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(children(proc.pid) - {victim}) == 2, timeout=20)
    wait_for(lambda: len(listeners(settings.database_url)) == 2)
    jobs = [queue.enqueue("echo", {"i": i}) for i in range(10)]
    for job in jobs:
        assert queue.wait(job.id, 20).state is JobState.SUCCEEDED
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not children(proc.pid)


# A handlers' module that notes each process that imports it.
NOTING = """
import os
with open(os.environ["NOTED"], "a") as noted:
    noted.write(f"{os.getpid()}\\n")

async def echo(job):
    return job.payload

HANDLERS = {"echo": echo}
"""


def test_the_command_lines_worker_processes_import_the_handlers_themselves(
    db_url: str, queue: Queue, tmp_path: Path
) -> None:
    # They start as forks of the supervisor; the supervisor imports the
    # handlers' module only after them (it checks it), so that nothing the
    # module opens when imported is shared: each child imported it itself.
    (tmp_path / "noting_tasks.py").write_text(NOTING)
    noted = tmp_path / "noted"
    env = dict(os.environ, NOTED=str(noted), PYTHONPATH=str(ROOT / "src"))
    command = [sys.executable, "-m", "pgqueue", "--database-url", db_url, "worker"]
    proc = subprocess.Popen(
        [*command, "--handlers", "noting_tasks:HANDLERS", "--processes", "2"],
        cwd=tmp_path,
        env=env,
    )
    try:
        workers = wait_for(lambda: children(proc.pid) if len(children(proc.pid)) == 2 else None)
        wait_for(lambda: noted.exists() and len(noted.read_text().split()) == 3)
        assert {int(pid) for pid in noted.read_text().split()} == {proc.pid, *workers}
        job = queue.enqueue("echo", {"x": 1})
        assert queue.wait(job.id, 20).state is JobState.SUCCEEDED
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
