"""``--log-format json``: every line a worker writes is one JSON object, and
every line about a job names the job, its task, queue, attempt and worker."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pgqueue import JobState, Queue, Settings
from pgqueue.logs import JsonFormatter

ROOT = Path(__file__).resolve().parents[3]


def _record(**extra: Any) -> logging.LogRecord:
    return logging.makeLogRecord(
        {"name": "pgqueue.worker", "levelno": logging.WARNING, "levelname": "WARNING"} | extra
    )


def test_a_json_line_carries_the_message_the_fields_and_the_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    record = _record(
        msg="job %d failed",
        args=(7,),
        exc_info=exc_info,
        action="retry",
        job_id=7,
        queue="mail",
        task="send",
        attempt=2,
        worker_id="w1",
    )
    text = JsonFormatter().format(record)
    assert "\n" not in text
    line = json.loads(text)
    assert line["message"] == "job 7 failed"
    assert line["level"] == "WARNING" and line["logger"] == "pgqueue.worker"
    assert {k: line[k] for k in ("action", "job_id", "queue", "task", "attempt", "worker_id")} == {
        "action": "retry",
        "job_id": 7,
        "queue": "mail",
        "task": "send",
        "attempt": 2,
        "worker_id": "w1",
    }
    assert line["traceback"].startswith("Traceback") and "ValueError: boom" in line["traceback"]
    assert line["time"].endswith("+00:00")


@pytest.mark.parametrize("processes", [1, 2])
def test_the_worker_command_logs_json_lines_naming_each_job(
    db_url: str, settings: Settings, queue: Queue, processes: int
) -> None:
    """With 2 processes, the lines come from the supervisor's children. The
    lines name jobs, never carry their payloads."""
    secret = "4242-card-number-4242"
    failing = queue.enqueue("fail", {"message": "no", "card": secret}, queue="mail", max_attempts=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.update(
        PGQUEUE_DATABASE_URL=db_url, PGQUEUE_BACKOFF_BASE_SECONDS="0.01", PYTHONPATH=str(ROOT)
    )
    command = ["--log-format", "json", "worker", "--handlers", "pgqueue.demo:HANDLERS"]
    command += ["--processes", str(processes)]
    worker = subprocess.Popen(
        [sys.executable, "-m", "pgqueue", *command, "--queues", "mail", "--concurrency", "2"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while queue.get(failing.id).state is not JobState.DEAD:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the job did not end"
            time.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    assert secret not in stderr
    lines = [json.loads(text) for text in stderr.splitlines()]  # every line is JSON
    assert {line["action"] for line in lines} >= {"start", "retry", "dead", "stopped"}
    about_the_job = [line for line in lines if line.get("job_id") == failing.id]
    assert [line["action"] for line in about_the_job] == ["retry", "dead"]
    started = {
        line["worker_id"] for line in lines if line["action"] == "start" and "worker_id" in line
    }
    assert len(started) == processes
    for attempt, line in enumerate(about_the_job, start=1):
        assert (line["task"], line["queue"], line["attempt"]) == ("fail", "mail", attempt)
        assert line["worker_id"] in started
        assert line["level"] == "WARNING" if line["action"] == "dead" else "INFO"


def test_the_api_command_logs_json_lines_uvicorns_included(db_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.update(PGQUEUE_DATABASE_URL=db_url, PGQUEUE_LOG_FORMAT="json", PYTHONPATH=str(ROOT))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api = subprocess.Popen(
        [sys.executable, "-m", "pgqueue", "api", "--port", str(port)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert api.stderr is not None
    try:
        lines = []
        for text in api.stderr:  # until uvicorn says it serves
            lines.append(json.loads(text))
            if "Application startup complete" in lines[-1]["message"]:
                break
    finally:
        api.send_signal(signal.SIGINT)
        _, rest = api.communicate(timeout=30)
    lines += [json.loads(text) for text in rest.splitlines()]
    assert {line["logger"] for line in lines} >= {"pgqueue.api", "uvicorn.error"}
    assert not any("color_message" in line for line in lines)
    assert api.returncode == 0
