"""A streaming replica of a bench server, for what a standby costs
(bench.perf.capacity --standby): pg_basebackup of the primary into a folder
of its own, started as a hot standby on another port, stopped and deleted
afterwards. The primary's synchronous_standby_names decides whether its
commits wait for the standby ("*") or not ("")."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

from pgqueue.db.embedded import EmbeddedPostgres

__all__ = ["set_synchronous", "streaming_standby"]

REPLICATION_HBA = "host replication all 127.0.0.1/32 scram-sha-256\n"


def _as_server_user(server: EmbeddedPostgres, command: Sequence[str]) -> None:
    """Run a PostgreSQL program as the owner of the server's data folder."""
    owner = server.pgdata.stat()
    done = subprocess.run(
        command,
        user=owner.st_uid,
        group=owner.st_gid,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} failed: {done.stderr}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def streaming_standby(server: EmbeddedPostgres) -> Iterator[int]:
    """A hot standby streaming from ``server`` (asynchronous until
    set_synchronous): yields its postmaster's pid once it streams."""
    # The embedded server's pg_hba.conf allows no replication connection.
    with open(server.pgdata / "pg_hba.conf", "a") as hba:
        hba.write(REPLICATION_HBA)
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")
    folder = Path(tempfile.mkdtemp(prefix="standby-", dir=server.data_dir))
    owner = server.pgdata.stat()
    os.chown(folder, owner.st_uid, owner.st_gid)
    folder.chmod(0o700)
    pg_ctl = str(EmbeddedPostgres.binary("pg_ctl"))
    try:
        backup = [str(EmbeddedPostgres.binary("pg_basebackup")), "-D", str(folder / "pgdata")]
        _as_server_user(server, [*backup, "-R", "-X", "stream", "-c", "fast", "-d", server.url])
        data = str(folder / "pgdata")
        log = str(folder / "standby.log")
        port = f"-c port={_free_port()}"
        _as_server_user(server, [pg_ctl, "start", "-D", data, "-w", "-l", log, "-o", port])
        _wait_streaming(server.url)
        yield int((folder / "pgdata" / "postmaster.pid").read_text().split("\n", 1)[0])
    finally:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            _as_server_user(server, [pg_ctl, "stop", "-D", str(folder / "pgdata"), "-m", "fast"])
        shutil.rmtree(folder, ignore_errors=True)


def _wait_streaming(url: str, timeout: float = 60.0) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(int(timeout / 0.1)):
            if conn.execute(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
            ).fetchone()[0]:  # type: ignore[index]
                return
            conn.execute("SELECT pg_sleep(0.1)")
    raise RuntimeError("the standby did not start streaming")


def set_synchronous(admin: psycopg.Connection[Any], on: bool) -> None:
    """Commits wait for the standby's flush (on), or not (off)."""
    admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{'*' if on else ''}'")
    admin.execute("SELECT pg_reload_conf()")
    admin.execute("SELECT pg_sleep(0.2)")  # every backend has read it
    state = "sync" if on else "async"
    row = admin.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
    if row is None or row[0] != state:
        raise RuntimeError(f"the standby is {row and row[0]}, not {state}")
