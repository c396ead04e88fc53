"""The doctor on a server of this module's own, which the tests may
reconfigure (the shared test server must not be): pg_stat_statements
loaded, so the cost per job comes from it, a synchronous standby
named that is not there, which fails the check and the command, and
two-phase commit allowed (max_prepared_transactions), so that a prepared
transaction can be left behind."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import Queue, Settings, migrate
from pgqueue.cli import app
from pgqueue.db.embedded import EmbeddedPostgres
from tests.integration.queue.test_doctor import drain

TEMPLATE = "doctor_template"


@pytest.fixture(scope="module")
def own_server() -> Iterator[EmbeddedPostgres]:
    root = "/dev/shm" if Path("/dev/shm").is_dir() else None
    folder = Path(tempfile.mkdtemp(prefix="pgqueue-doctor-", dir=root))
    server = EmbeddedPostgres(
        folder,
        options={
            "shared_preload_libraries": "pg_stat_statements",
            "max_prepared_transactions": "2",
        },
    )
    try:
        server.ensure_running()
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {TEMPLATE}")
        template = server.url.rsplit("/", 1)[0] + "/" + TEMPLATE
        migrate(template)
        with psycopg.connect(template, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        yield server
    finally:
        server.destroy()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def own_url(own_server: EmbeddedPostgres) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(own_server.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    yield own_server.url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(own_server.url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_with_pg_stat_statements_the_cost_per_job_comes_from_it(own_url: str) -> None:
    settings = Settings(database_url=own_url)
    with Queue(own_url, settings=settings) as queue:
        queue.enqueue_many([{"task": "noop"}] * 5_000)
        stop, busy = threading.Event(), threading.Event()
        thread = threading.Thread(target=drain, args=(settings, stop, busy))
        thread.start()
        try:
            assert busy.wait(30)
            report = queue.doctor(window_seconds=0.5, cores=2)
        finally:
            stop.set()
            thread.join()
    cost, headroom = report.check("cost"), report.check("headroom")
    assert cost.value is not None and cost.value > 0 and cost.unit == "µs/job"
    assert cost.source.startswith("pg_stat_statements")
    # The model: 2 cores at that cost, less the rate measured.
    rate = report.check("rate").value
    assert rate is not None and headroom.value is not None
    assert headroom.value == pytest.approx(2 * 1e6 / cost.value - rate, rel=0.01)


def _reload(url: str, statement: str, wanted: str) -> None:
    """Change the server's configuration and wait until new sessions see it."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(statement)
        admin.execute("SELECT pg_reload_conf()")
    for _ in range(500):
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SHOW synchronous_standby_names").fetchone()
        if row and row[0] == wanted:
            return
    raise AssertionError("the server did not reload its configuration")


def test_a_synchronous_standby_named_but_absent_fails_the_check_and_the_command(
    own_server: EmbeddedPostgres, own_url: str
) -> None:
    _reload(own_server.url, "ALTER SYSTEM SET synchronous_standby_names = 'absent'", "absent")
    try:
        with Queue(own_url, settings=Settings(database_url=own_url)) as queue:
            report = queue.doctor(window_seconds=0.1)
        check = report.check("synchronous_standby")
        assert check.status == "fail" and report.failed
        assert "'absent'" in check.finding and "no standby is connected" in check.finding
        runner = CliRunner()
        result = runner.invoke(app, ["--database-url", own_url, "doctor", "--window", "0.1s"])
        assert result.exit_code == 1, result.output
        assert "synchronous_standby" in result.output and "fail" in result.output
        result = runner.invoke(
            app, ["--database-url", own_url, "doctor", "--window", "0.1s", "--json"]
        )
        assert result.exit_code == 1
        body = json.loads(result.stdout)
        assert body["status"] == "fail"
        [failed] = [c for c in body["checks"] if c["status"] == "fail"]
        assert failed["name"] == "synchronous_standby"
    finally:
        _reload(own_server.url, "ALTER SYSTEM RESET synchronous_standby_names", "")


def test_an_inactive_replication_slot_is_a_warning(
    own_server: EmbeddedPostgres, own_url: str
) -> None:
    with psycopg.connect(own_server.url, autocommit=True) as admin:
        admin.execute("SELECT pg_create_physical_replication_slot('doctor_gone', true)")
    try:
        with Queue(own_url, settings=Settings(database_url=own_url)) as queue:
            check = queue.doctor(window_seconds=0.1).check("replication_slots")
        assert check.status == "warn" and check.value == 1
        assert "'doctor_gone' (physical)" in check.finding and "bytes of WAL" in check.finding
    finally:
        with psycopg.connect(own_server.url, autocommit=True) as admin:
            admin.execute("SELECT pg_drop_replication_slot('doctor_gone')")


def test_a_prepared_transaction_left_behind_is_a_long_transaction(own_url: str) -> None:
    """No session shows it: the doctor finds it in pg_prepared_xacts, names
    it, and is quiet again once it is rolled back."""
    with psycopg.connect(own_url, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT txid_current()")
        conn.execute("PREPARE TRANSACTION 'pgqueue-doctor-test'")
    with Queue(own_url, settings=Settings(database_url=own_url)) as queue:
        try:
            check = queue.doctor(long_transaction_seconds=0.05, window_seconds=0.1).check(
                "long_transactions"
            )
            assert check.status == "warn" and check.value == 1
            assert "prepared transaction 'pgqueue-doctor-test'" in check.finding
            assert "ROLLBACK PREPARED 'pgqueue-doctor-test'" in check.advice
        finally:
            with psycopg.connect(own_url, autocommit=True) as conn:
                conn.execute("ROLLBACK PREPARED 'pgqueue-doctor-test'")
        after = queue.doctor(long_transaction_seconds=0.05, window_seconds=0.1)
        assert after.check("long_transactions").status == "ok"
