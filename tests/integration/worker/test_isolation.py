"""Isolated sync handlers (``@task(isolated=True)``) against a real PostgreSQL:
each runs in a child process, so a timeout kills it and frees its slot at
once, and a handler that kills its own process fails only its attempt.

The handlers are module-level functions: the children import them by name.
They record their process id in a file named by the payload, so that the
tests can see which process ran them and whether it is gone."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, Job, JobState, Settings
from pgqueue.worker import AsyncWorker, TaskRegistry
from tests.support import past_first_heartbeat, running, until


def _record_pid(job: Job) -> None:
    Path(job.payload["pid_file"]).write_text(str(os.getpid()))


def square(job: Job) -> dict[str, Any]:
    _record_pid(job)
    return {"square": job.payload["n"] ** 2}


def hang(job: Job) -> None:
    _record_pid(job)
    time.sleep(3600)


def die(job: Job) -> None:
    _record_pid(job)
    os.kill(os.getpid(), signal.SIGKILL)


def fail(job: Job) -> None:
    raise ValueError("bad input " + str(job.payload["n"]))


def _registry() -> TaskRegistry:
    registry = TaskRegistry()
    for fn in (square, hang, die, fail):
        registry.add(fn.__name__, fn, timeout=1.0, isolated=True)
    return registry


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone too: only its parent has not collected it yet.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def _pid(path: Path) -> int:
    return int(path.read_text())


async def _ended(aqueue: AsyncQueue, job_id: int) -> Job:
    job = await aqueue.get(job_id)
    assert job is not None
    return job


async def test_an_isolated_handler_runs_in_a_child_and_its_result_is_kept(
    settings: Settings, aqueue: AsyncQueue, tmp_path: Path
) -> None:
    pid_file = tmp_path / "square.pid"
    job = await aqueue.enqueue("square", {"n": 7, "pid_file": str(pid_file)})
    failing = await aqueue.enqueue("fail", {"n": 3}, max_attempts=1)
    async with running(AsyncWorker(_registry(), settings=settings, concurrency=2)):
        await until(lambda: pid_file.exists())
        done = await aqueue.wait(job.id, timeout=30)
        failed = await aqueue.wait(failing.id, timeout=30)
    assert done.state is JobState.SUCCEEDED and done.result == {"square": 49}
    assert _pid(pid_file) != os.getpid()
    assert failed.state is JobState.DEAD
    assert failed.last_error is not None and "ValueError: bad input 3" in failed.last_error


async def test_a_timeout_kills_the_child_and_frees_the_slot_at_once(
    settings: Settings, aqueue: AsyncQueue, tmp_path: Path
) -> None:
    """One slot: the job after the hung one runs only if the slot came back."""
    hung_pid = tmp_path / "hang.pid"
    hung = await aqueue.enqueue("hang", {"pid_file": str(hung_pid)}, max_attempts=1)
    after = await aqueue.enqueue("square", {"n": 2, "pid_file": str(tmp_path / "after.pid")})
    worker = AsyncWorker(_registry(), settings=settings, concurrency=1)
    async with running(worker):
        await until(lambda: hung_pid.exists(), timeout=30)
        child = _pid(hung_pid)
        done = await aqueue.wait(after.id, timeout=30)
        assert worker.stats["hung_handlers"] == 0
    ended = await _ended(aqueue, hung.id)
    assert ended.state is JobState.DEAD
    assert ended.last_error == "timed out after 1 s; handler process killed"
    assert done.state is JobState.SUCCEEDED
    await until(lambda: not _alive(child))


async def test_a_handler_that_kills_its_process_fails_its_attempt_and_the_worker_goes_on(
    settings: Settings, aqueue: AsyncQueue, tmp_path: Path
) -> None:
    died_pid = tmp_path / "die.pid"
    died = await aqueue.enqueue("die", {"pid_file": str(died_pid)}, max_attempts=1)
    after = await aqueue.enqueue("square", {"n": 3, "pid_file": str(tmp_path / "after.pid")})
    async with running(AsyncWorker(_registry(), settings=settings, concurrency=1)):
        done = await aqueue.wait(after.id, timeout=30)
    ended = await _ended(aqueue, died.id)
    assert ended.state is JobState.DEAD
    assert ended.last_error is not None
    died_of = f"ProcessDied: handler process died (exit code {-signal.SIGKILL})\n"
    assert ended.last_error.startswith(died_of)
    assert done.state is JobState.SUCCEEDED and done.result == {"square": 9}
    assert _pid(tmp_path / "after.pid") != _pid(died_pid)  # a new child


async def test_stopping_the_worker_kills_an_isolated_handler_past_the_shutdown_timeout(
    settings: Settings, aqueue: AsyncQueue, tmp_path: Path
) -> None:
    hung_pid = tmp_path / "hang.pid"
    registry = TaskRegistry()
    registry.add("hang", hang, isolated=True)  # no timeout of its own
    await aqueue.enqueue("hang", {"pid_file": str(hung_pid)})
    worker = AsyncWorker(
        registry, settings=settings.replace(shutdown_timeout_seconds=0.5), concurrency=1
    )
    async with running(worker):
        await until(lambda: hung_pid.exists(), timeout=30)
    await until(lambda: not _alive(_pid(hung_pid)))


async def test_a_cancel_kills_a_running_isolated_handler_at_once(
    settings: Settings, aqueue: AsyncQueue, sql: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """No timeout, and a heartbeat a minute away: the cancel's notice is what
    kills the child; its slot (the only one) runs the next job."""
    hung_pid = tmp_path / "hang.pid"
    registry = TaskRegistry()
    registry.add("hang", hang, isolated=True)  # no timeout of its own
    registry.add("square", square, isolated=True)
    quiet = settings.replace(heartbeat_seconds=60.0, lease_seconds=300.0)
    worker = AsyncWorker(registry, settings=quiet, concurrency=1)
    async with running(worker):
        await past_first_heartbeat(worker, sql)
        hung = await aqueue.enqueue("hang", {"pid_file": str(hung_pid)})
        await until(lambda: hung_pid.exists(), timeout=30)
        child = _pid(hung_pid)
        await aqueue.cancel(hung.id)
        await until(lambda: not _alive(child), timeout=5)
        after = await aqueue.enqueue("square", {"n": 4, "pid_file": str(tmp_path / "after.pid")})
        done = await aqueue.wait(after.id, timeout=30)
    assert done.state is JobState.SUCCEEDED and done.result == {"square": 16}
    ended = await _ended(aqueue, hung.id)
    assert (ended.state, ended.attempts, ended.errors) == (JobState.CANCELLED, 1, ())


def test_an_isolated_handler_must_be_a_plain_function_importable_by_name(
    settings: Settings,
) -> None:
    async def coroutine(job: Job) -> None: ...

    registry = TaskRegistry()
    with pytest.raises(ValueError, match="isolated=True is for plain functions"):
        registry.add("coroutine", coroutine, isolated=True)
    registry.add("local", lambda job: None, isolated=True)
    with pytest.raises(ValueError, match="must be importable by name"):
        AsyncWorker(registry, settings=settings)
