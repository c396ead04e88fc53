"""The embedded server lets in only who holds its password.

Another OS user on the machine (``nobody``, when the tests run as root) can
reach 127.0.0.1:PORT but has no password: it must be refused, and with it
the ``COPY ... TO PROGRAM`` that trust authentication used to allow.
"""

from __future__ import annotations

import os
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgqueue import migrate
from pgqueue.db.embedded import EmbeddedPostgres

pytestmark = pytest.mark.timeout(120)

LEGACY_HBA = """\
local   all  all                 trust
host    all  all  127.0.0.1/32   trust
host    all  all  ::1/128        trust
"""


def as_another_user(command: list[str]) -> list[str]:
    """``command`` as ``nobody`` when we are root; otherwise as ourselves,
    who equally lack the password (nothing passes it to the command)."""
    return ["runuser", "-u", "nobody", "--", *command] if os.geteuid() == 0 else command


def without_password_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    root = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    server = EmbeddedPostgres(os.path.join(root, f"pgqueue-auth-{uuid.uuid4().hex[:8]}"))
    try:
        yield server
    finally:
        server.destroy()


def test_the_password_file_is_private_and_the_url_carries_it(pg_server: EmbeddedPostgres) -> None:
    info = pg_server.password_file.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.geteuid()  # the user who runs pgqueue, not the server's
    password = pg_server.password_file.read_text().strip()
    assert len(password) >= 32
    assert urlsplit(pg_server.url).password == password
    with psycopg.connect(pg_server.url) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)


def test_a_connection_without_the_password_is_refused(pg_server: EmbeddedPostgres) -> None:
    for password in ("", "wrong-password"):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(make_conninfo(pg_server.url, password=password)).close()


def test_another_os_user_cannot_run_commands_through_the_server(
    pg_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    evidence = Path("/tmp") / f"pgqueue-pwned-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        as_another_user(
            [
                str(EmbeddedPostgres.binary("psql")),
                "-h", "127.0.0.1", "-p", str(pg_server.port), "-U", "postgres", "-w",
                "-c", f"COPY (SELECT 1) TO PROGRAM 'id > {evidence}'",
                "postgres",
            ]
        ),
        capture_output=True, text=True, env=without_password_env(), cwd="/", timeout=30,
    )  # fmt: skip
    assert done.returncode != 0
    assert "password" in done.stderr, done.stderr
    assert not evidence.exists()
    if os.geteuid() == 0:  # nor can that user read the password
        peek = subprocess.run(
            as_another_user(["cat", str(pg_server.password_file)]),
            capture_output=True, text=True, cwd="/", timeout=30,
        )  # fmt: skip
        assert peek.returncode != 0 and "Permission denied" in peek.stderr


def pg_ctl(server: EmbeddedPostgres, *args: str) -> None:
    """pg_ctl as the data folder's owner, bypassing EmbeddedPostgres: to
    set up the state that an older pgqueue left behind."""
    owner = server.pgdata.stat().st_uid
    subprocess.run(
        [str(server.binary("pg_ctl")), *args, "-D", str(server.pgdata), "-w"],
        user=owner if os.geteuid() == 0 else None,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        cwd="/", check=True, timeout=60,
    )  # fmt: skip


def make_legacy(server: EmbeddedPostgres) -> str:
    """Turn a server into what `initdb --auth=trust` made before passwords:
    pg_hba.conf trusting everyone, no password set, no password file.
    Returns the URL that worked then (no password), with the server stopped."""
    server.stop()
    hba = server.pgdata / "pg_hba.conf"
    with hba.open("w") as handle:  # in place: the owner (the server's user) stays
        handle.write(LEGACY_HBA)
    server.password_file.unlink()
    pg_ctl(server, "start", "-l", str(server.log_file))
    legacy_url = server.url
    assert urlsplit(legacy_url).password is None
    with psycopg.connect(legacy_url, autocommit=True) as conn:
        conn.execute("ALTER ROLE postgres PASSWORD NULL")
    pg_ctl(server, "stop", "-m", "fast")
    return legacy_url


def test_an_old_trust_folder_gets_a_password_on_start(own_server: EmbeddedPostgres) -> None:
    migrate(own_server.ensure_running())
    with psycopg.connect(own_server.url, autocommit=True) as conn:
        conn.execute("INSERT INTO pgqueue_jobs (task) VALUES ('kept')")
    legacy_url = make_legacy(own_server)

    url = own_server.ensure_running()

    assert stat.S_IMODE(own_server.password_file.stat().st_mode) == 0o600
    assert urlsplit(url).password == own_server.password_file.read_text().strip()
    with psycopg.connect(url) as conn:  # the data is still there
        assert conn.execute("SELECT task FROM pgqueue_jobs").fetchall() == [("kept",)]
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(legacy_url).close()
    hba = (own_server.pgdata / "pg_hba.conf").read_text()
    assert "trust" not in hba and "scram-sha-256" in hba
    assert (own_server.pgdata / "pg_hba.conf").stat().st_uid == own_server.pgdata.stat().st_uid
    # The next start finds the folder as it should be, and keeps the password.
    own_server.stop()
    assert own_server.ensure_running() == url
