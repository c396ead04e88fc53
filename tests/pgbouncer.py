"""A real PgBouncer in transaction mode, in front of the test session's server.

Needs Debian's ``pgbouncer`` package (``make test`` installs it). PgBouncer
refuses to run as root: when the tests run as root it runs as the embedded
server's own system user. It listens on 127.0.0.1 only, authenticates with
SCRAM against the server's own password, and is stopped when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgqueue.db.embedded import EmbeddedPostgres, _server_user

__all__ = ["Bouncer", "pgbouncer"]


@dataclass(frozen=True)
class Bouncer:
    port: int
    server_url: str  # the server's own URL (a database of its own to be named)

    def url(self, direct_url: str) -> str:
        """``direct_url``'s database, through the pooler."""
        return make_conninfo(direct_url, host="127.0.0.1", port=self.port)

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW <what>`` on the admin console (simple protocol only)."""
        with psycopg.connect(
            make_conninfo(self.server_url, port=self.port, dbname="pgbouncer"), autocommit=True
        ) as conn:
            result = conn.pgconn.exec_(f"SHOW {what}".encode())
            names = [result.fname(i).decode() for i in range(result.nfields)]  # type: ignore[union-attr]
            return [
                {
                    name: (value.decode() if value is not None else None)
                    for name, value in zip(
                        names,
                        (result.get_value(row, col) for col in range(result.nfields)),
                        strict=True,
                    )
                }
                for row in range(result.ntuples)
            ]


def _binary() -> str:
    path = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(path):
        raise RuntimeError(
            "pgbouncer is not installed: these tests need the real pooler. "
            "Install Debian's package: apt-get install -y pgbouncer"
        )
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def pgbouncer(server: EmbeddedPostgres, pool_size: int = 20) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode with ``pool_size`` server connections
    per database, for as long as the block runs."""
    params = conninfo_to_dict(server.url)
    user, password = str(params["user"]), str(params["password"])
    folder = Path(tempfile.mkdtemp(prefix="pgqueue-bouncer-", dir="/dev/shm"))
    port = _free_port()
    (folder / "users.txt").write_text(f'"{user}" "{password}"\n')
    (folder / "pgbouncer.ini").write_text(
        f"""[databases]
* = host=127.0.0.1 port={server.port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {folder}/users.txt
admin_users = {user}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits,options
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
"""
    )
    owner = _server_user()
    if owner is not None:
        for path in (folder, *folder.iterdir()):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    os.chmod(folder / "users.txt", 0o600)
    proc = subprocess.Popen(
        [_binary(), str(folder / "pgbouncer.ini")],
        user=owner.pw_uid if owner else None,
        group=owner.pw_gid if owner else None,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        bouncer = Bouncer(port, server.url)
        deadline = time.monotonic() + 15
        while True:
            try:
                bouncer.show("VERSION")
                break
            except psycopg.Error:
                log = folder / "pgbouncer.log"
                assert proc.poll() is None, log.read_text() if log.exists() else "no log"
                assert time.monotonic() < deadline, "pgbouncer did not start"
                time.sleep(0.1)
        yield bouncer
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
