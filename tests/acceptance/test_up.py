"""``pgqueue up`` as a user runs it: one command starts the embedded server,
the API and the workers; a job sent over HTTP succeeds; one SIGINT (what
Ctrl-C sends to the terminal's foreground group) stops every process it
started, the server included."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pgqueue.db.embedded import EmbeddedPostgres

pytestmark = pytest.mark.acceptance
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stat(pid: int) -> list[str] | None:
    """state, ppid, pgrp, ... of a process; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


class Output:
    """Lines of the process's stdout, read on a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(needle in line for line in self.lines):
            assert time.monotonic() < deadline, f"no {needle!r} in:\n" + self.text()
            time.sleep(0.05)

    def text(self) -> str:
        return "\n".join(self.lines)


def _env(server_dir: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_") and k != "DATABASE_URL"
    }
    env.update(
        PGQUEUE_DATA_DIR=str(server_dir / "data"),
        PGQUEUE_SHUTDOWN_TIMEOUT_SECONDS="5",
        COLUMNS="200",
    )
    return env


def _up(cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgqueue", "up", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own foreground group, as in a terminal
    )


def _echo_job_succeeds(port: int) -> None:
    """A job sent over HTTP runs the demo task "echo"."""
    job = _http(
        "POST", f"http://127.0.0.1:{port}/jobs", {"task": "echo", "payload": {"hello": "up"}}
    )
    deadline = time.monotonic() + 15
    while (seen := _http("GET", f"http://127.0.0.1:{port}/jobs/{job['id']}"))[
        "state"
    ] != "succeeded":
        assert seen["state"] in ("queued", "running"), seen
        assert time.monotonic() < deadline, seen
        time.sleep(0.1)
    assert seen["result"] == {"hello": "up"}


def test_up_runs_a_job_and_one_sigint_stops_everything(server_dir: Path) -> None:
    port = _free_port()
    up = _up(ROOT, _env(server_dir), "--port", str(port), "--workers", "2", "--concurrency", "4")
    out = Output(up)
    server = EmbeddedPostgres(server_dir / "data")
    try:
        out.wait_for("ready: API on", timeout=45)
        _echo_job_succeeds(port)

        children = _descendants(up.pid)
        postmaster = server.pid()
        assert postmaster is not None and _alive(postmaster)
        # The api and two workers, each leading its own process group.
        leaders = {pid for pid in children if _stat(pid)[2] == str(pid)}  # type: ignore[index]
        assert len(leaders) >= 3, out.text()
        assert all(_stat(pid)[1] == str(up.pid) for pid in leaders)  # type: ignore[index]

        os.killpg(up.pid, signal.SIGINT)  # Ctrl-C: the signal goes to the foreground group
        assert up.wait(timeout=30) == 0, out.text()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        server.destroy()

    time.sleep(0.2)
    stray = sorted(pid for pid in children | {postmaster} if _alive(pid))
    assert stray == [], f"still running: {stray}\n{out.text()}"
    text = out.text()
    for name in ("api", "worker-1", "worker-2"):
        assert f"{name} |" in text and f"{name} exited with code" in text, text
    assert "got SIGINT; stopping 3 processes" in text
    assert "stopped the embedded PostgreSQL" in text
    assert "killing" not in text  # nothing needed a SIGKILL


def test_up_runs_the_demo_tasks_from_a_folder_outside_the_repository(
    tmp_path: Path, server_dir: Path
) -> None:
    """The default handlers are part of the package: nothing needs the repository."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _env(server_dir)
    env.pop("PYTHONPATH", None)
    port = _free_port()
    up = _up(elsewhere, env, "--port", str(port), "--workers", "1")
    out = Output(up)
    try:
        out.wait_for("ready: API on", timeout=45)
        assert "1 worker(s) on pgqueue.demo:HANDLERS" in out.text()
        _echo_job_succeeds(port)
        os.killpg(up.pid, signal.SIGINT)
        assert up.wait(timeout=30) == 0, out.text()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        EmbeddedPostgres(server_dir / "data").destroy()


def test_up_stops_everything_when_a_process_dies(server_dir: Path) -> None:
    """The API cannot bind (the port is taken): up says so, stops the workers
    and the server it started, and exits 1."""
    server = EmbeddedPostgres(server_dir / "data")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = _up(ROOT, _env(server_dir), "--port", str(port), "--workers", "1")
        out = Output(up)
        try:
            code = up.wait(timeout=45)
        finally:
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
            postmaster = server.pid()
            server.destroy()
    out._thread.join(timeout=5)
    text = out.text()
    assert code == 1, text
    assert "api exited with code" in text and "stopping everything" in text, text
    assert "worker-1 exited with code" in text
    assert "stopped the embedded PostgreSQL" in text
    assert postmaster is None, "the server was left running"
