"""``pgqueue enqueue-file`` stopped by Ctrl-C mid-file, as a user does it: a
real process reading a pipe gets SIGINT, prints what it read, wrote, rejected
and where it stopped, and exits 130."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"),
        reason="reads the blocked system call from /proc",
    ),
]

# The number of read(2) on the machines this test knows.
READ_SYSCALL = {"x86_64": "0", "aarch64": "63"}.get(platform.machine(), "")

LINES = [
    '{"task": "echo", "payload": {"n": 1}}',
    '{"task": "echo", "payload": {"n": 2}}',  # a chunk of two: written
    "{not json",  # rejected
    '{"task": "echo", "payload": {"n": 4}}',
    '{"task": "echo", "payload": {"n": 5}}',  # a chunk of two: written
    '{"task": "echo", "payload": {"n": 6}}',  # read, waiting for its chunk
]


def _wait_for(predicate: Callable[[], Any], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _reading_stdin(pid: int) -> bool:
    """Whether the process's main thread is blocked in read(0, ...)."""
    try:
        call = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return call[:2] == [READ_SYSCALL, "0x0"]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "human"])
def test_ctrl_c_mid_file_prints_the_summary_and_exits_130(db_url: str, as_json: bool) -> None:
    command = ["--database-url", db_url, "enqueue-file", "-", "--chunk-size", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgqueue", *command, *(["--json"] if as_json else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
        # As a terminal's Ctrl-C finds it, even when this suite runs as a
        # background job (whose children inherit SIGINT ignored).
        preexec_fn=_default_sigint,
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(("\n".join(LINES) + "\n").encode())
        proc.stdin.flush()  # the pipe stays open: the file is not over
        with psycopg.connect(db_url, autocommit=True) as sql:
            _wait_for(lambda: sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone() == (4,))
        _wait_for(lambda: _reading_stdin(proc.pid))  # every line so far taken in
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err.decode()
    assert err.decode().strip().splitlines()[-1] == "error: interrupted (Ctrl-C)"
    if as_json:
        report = json.loads(out)
        assert (report["lines"], report["written_lines"], report["created"]) == (6, 4, 4)
        assert [r["line"] for r in report["rejected"]] == [3]
        assert report["not_written"] == {"first_line": 6, "last_line": 6}
        assert report["unread_after_line"] == 6 and report["interrupted"] is True
    else:
        text = out.decode()
        assert "read 6 line(s): 4 created, 0 already existed (idempotency key), 1 rejected" in text
        assert (
            "interrupted after line 6: lines 6-6 were not written; lines after 6 were not "
            "read; 4 job(s) from earlier lines were written"
        ) in text
