"""Test hosts in network namespaces, all inside this machine.

``network(["db", "w1", ...])`` makes one namespace per host, each with one
interface (``eth0``) on a bridge in the root namespace, which is the test's
own seat on that network (the ``.254`` address). ``partition(host)`` takes
the host's link down on the bridge side: its packets go nowhere, its TCP
connections stay open and hang, as across a real partition, until
``heal(host)``. Everything is removed when the block ends. Needs root (as CI
runs) and iproute2.

``postgres_on(net, host, folder)`` runs a PostgreSQL of its own on a host,
listening on the host's address only, with a password (SCRAM).
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pgqueue.db.embedded import EmbeddedPostgres, _server_user

__all__ = ["Network", "network", "postgres_on"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class Network:
    tag: str  # a prefix of every name made, unique to this network
    subnet: str  # "10.a.b"
    hosts: dict[str, int] = field(default_factory=dict)  # name -> last octet

    def address(self, host: str) -> str:
        return f"{self.subnet}.{self.hosts[host]}"

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def on(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run on ``host`` (in its namespace)."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def partition(self, host: str) -> None:
        _ip("link", "set", self._link(host), "down")

    def heal(self, host: str) -> None:
        _ip("link", "set", self._link(host), "up")

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def _link(self, host: str) -> str:
        return f"{self.tag}{self.hosts[host]}"


@contextlib.contextmanager
def network(hosts: Sequence[str]) -> Iterator[Network]:
    net = Network(
        tag=f"pq{secrets.token_hex(2)}",
        subnet=f"10.{random.randint(100, 250)}.{random.randint(0, 250)}",
    )
    try:
        _ip("link", "add", net.bridge, "type", "bridge")
        _ip("addr", "add", f"{net.subnet}.254/24", "dev", net.bridge)
        _ip("link", "set", net.bridge, "up")
        for number, host in enumerate(hosts, start=1):
            net.hosts[host] = number
            _add_host(net, host)
        yield net
    finally:
        for host in net.hosts:
            subprocess.run(["ip", "netns", "del", net.namespace(host)], capture_output=True)
            subprocess.run(["ip", "link", "del", net._link(host)], capture_output=True)
        subprocess.run(["ip", "link", "del", net.bridge], capture_output=True)


def _add_host(net: Network, host: str) -> None:
    namespace, outside = net.namespace(host), net._link(host)
    _ip("netns", "add", namespace)
    _ip("link", "add", outside, "type", "veth", "peer", "name", f"{outside}i")
    _ip("link", "set", f"{outside}i", "netns", namespace)
    _ip("link", "set", outside, "master", net.bridge)
    _ip("link", "set", outside, "up")
    inside = ["ip", "netns", "exec", namespace, "ip"]
    for args in (
        ["link", "set", f"{outside}i", "name", "eth0"],
        ["addr", "add", f"{net.address(host)}/24", "dev", "eth0"],
        ["link", "set", "eth0", "up"],
        ["link", "set", "lo", "up"],
    ):
        subprocess.run([*inside, *args], check=True, capture_output=True)


@contextlib.contextmanager
def postgres_on(net: Network, host: str, folder: Path) -> Iterator[str]:
    """A PostgreSQL server on ``host``, port 5432; yields its URL."""
    owner = _server_user()
    as_owner = ["runuser", "-u", owner.pw_name, "--"] if owner else []
    pgdata, password = folder / "pgdata", secrets.token_urlsafe(24)
    folder.mkdir(parents=True, exist_ok=True)
    pwfile = folder / "password"
    pwfile.write_text(password)
    if owner:
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        os.chown(pwfile, owner.pw_uid, owner.pw_gid)
    initdb = [str(EmbeddedPostgres.binary("initdb")), "-D", str(pgdata), "-U", "postgres"]
    subprocess.run(
        [*as_owner, *initdb, f"--pwfile={pwfile}", "--auth=scram-sha-256", "--no-instructions"],
        check=True,
        capture_output=True,
    )
    with open(pgdata / "pg_hba.conf", "a", encoding="utf-8") as hba:
        hba.write(f"host all all {net.subnet}.0/24 scram-sha-256\n")
    options = f"-c listen_addresses={net.address(host)} -c port=5432 -c unix_socket_directories="
    pg_ctl = [*as_owner, str(EmbeddedPostgres.binary("pg_ctl")), "-D", str(pgdata)]
    log = folder / "server.log"
    subprocess.run(
        net.on(host, [*pg_ctl, "-l", str(log), "-o", options, "-w", "start"]),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres:{password}@{net.address(host)}:5432/postgres"
    finally:
        subprocess.run(net.on(host, [*pg_ctl, "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
