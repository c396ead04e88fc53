"""The doctor's verdicts (core/health.py, core/threats.py) from crafted rows:
what each check says for the rows the database would give, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pgqueue import InvalidSettings
from pgqueue.core import threats
from pgqueue.core.doctor import DoctorOptions
from pgqueue.core.health import NOT_VISIBLE, HealthCheck, HealthReport, Sample, capacity
from pgqueue.core.workers import WorkerRow

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def samples(
    jobs: int | None,
    *,
    seconds: float = 2.0,
    wal: int = 0,
    active_ms: float = 0.0,
    statements_ms: float | None = None,
) -> tuple[Sample, Sample]:
    first = Sample(
        T0, 1_000, 10, 100.0, None if jobs is None else 50, 0.0 if statements_ms else None
    )
    second = Sample(
        T0 + timedelta(seconds=seconds),
        1_000 + wal,
        20,
        100.0 + active_ms,
        None if jobs is None else 50 + jobs,
        statements_ms,
    )
    return first, second


def by_name(checks: list[HealthCheck]) -> dict[str, HealthCheck]:
    return {check.name: check for check in checks}


def test_the_cost_comes_from_pg_stat_statements_when_it_shows_pgqueues_statements() -> None:
    checks = by_name(capacity(*samples(1_000, wal=1_100_000, active_ms=90, statements_ms=40), None))
    assert checks["rate"].value == 500.0
    assert checks["cost"].value == 40.0  # 40 ms over 1,000 jobs
    assert "pg_stat_statements" in checks["cost"].source
    assert checks["wal"].value == 1_100.0
    assert "pg_current_wal_lsn" in checks["wal"].source


def test_without_pg_stat_statements_the_cost_is_the_databases_active_time() -> None:
    checks = by_name(capacity(*samples(1_000, wal=500_000, active_ms=90), None))
    assert checks["cost"].value == 90.0
    assert "pg_stat_database.active_time" in checks["cost"].source


def test_an_idle_queue_has_a_rate_of_zero_and_no_cost_per_job() -> None:
    checks = by_name(capacity(*samples(0, wal=8_000, active_ms=5), 8))
    assert checks["rate"].value == 0.0
    for name in ("cost", "wal", "headroom"):
        assert checks[name].value is None
        assert checks[name].finding.startswith("not measured: no job ended")


def test_counters_that_did_not_move_leave_the_cost_unmeasured() -> None:
    checks = by_name(capacity(*samples(100, wal=100_000), 4))
    assert checks["cost"].value is None and "not measured" in checks["cost"].finding
    assert checks["headroom"].value is None
    assert checks["wal"].value == 1_000.0


def test_an_unmigrated_database_has_no_rate() -> None:
    checks = by_name(capacity(*samples(None), None))
    assert checks["rate"].status == "warn" and checks["rate"].value is None


@pytest.mark.parametrize(
    ("rate_jobs", "status"),
    [(1_000, "ok"), (15_000, "warn"), (25_000, "fail")],
)
def test_headroom_is_the_models_rate_on_the_cores_minus_the_current_rate(
    rate_jobs: int, status: str
) -> None:
    # 100 µs a job: 10,000 jobs/s a core, 20,000 on 2 cores.
    checks = by_name(
        capacity(*samples(rate_jobs, seconds=1.0, active_ms=rate_jobs * 0.1, wal=1), 2)
    )
    headroom = checks["headroom"]
    assert headroom.status == status
    assert headroom.value == pytest.approx(20_000 - rate_jobs)
    assert headroom.unit == "jobs/s"


def test_without_cores_the_headroom_is_given_per_core() -> None:
    checks = by_name(capacity(*samples(1_000, seconds=1.0, active_ms=100, wal=1), None))
    headroom = checks["headroom"]
    assert headroom.unit == "jobs/s per core" and headroom.value == pytest.approx(10_000)
    assert "0.10 of a core" in headroom.finding and "--cores" in headroom.advice


def session(seconds: float | None, **fields: Any) -> dict[str, Any]:
    row = {
        "pid": 42,
        "role": "app",
        "application_name": "billing",
        "state": "idle in transaction",
        "backend_type": "client backend",
        "seconds": seconds,
        "xmin_age": 1_234,
        "xid_age": None,
        "gid": None,
    }
    return row | fields


def test_a_transaction_older_than_the_threshold_is_a_warning_naming_it() -> None:
    check = threats.long_transactions([session(5.0), session(600.0, pid=7)], 60, True)
    assert check.status == "warn" and check.value == 1
    assert "pid 7" in check.finding and "600 s" in check.finding and "1,234" in check.finding
    assert "pg_terminate_backend(7)" in check.advice


def test_a_forgotten_prepared_transaction_is_a_warning_saying_how_to_finish_it() -> None:
    prepared = session(
        900.0, pid=None, state="prepared", gid="pay'42", xmin_age=None, xid_age=5_000
    )
    check = threats.long_transactions([session(5.0), prepared], 60, True)
    assert check.status == "warn" and check.value == 1
    assert "prepared transaction 'pay''42'" in check.finding and "900 s" in check.finding
    assert "5,000 transactions" in check.finding
    assert "ROLLBACK PREPARED 'pay''42'" in check.advice and "pg_terminate" not in check.advice


def test_sessions_of_other_roles_are_said_to_be_not_visible() -> None:
    check = threats.long_transactions([session(None, xmin_age=None, xid_age=99)], 60, False)
    assert check.status == "ok"
    assert NOT_VISIBLE in check.finding and "99" in check.finding
    assert "pg_read_all_stats" in check.advice


def test_an_inactive_replication_slot_keeping_wal_warns() -> None:
    active = {
        "name": "s1",
        "type": "physical",
        "active": True,
        "retained_bytes": 10,
        "xmin_age": None,
    }
    assert threats.replication_slots([active]).status == "ok"
    gone = {"name": "old", "type": "physical", "active": False, "retained_bytes": 5_000_000}
    check = threats.replication_slots([active, gone | {"xmin_age": 77}])
    assert check.status == "warn" and check.value == 1
    assert "'old'" in check.finding and "5,000,000 bytes" in check.finding and "77" in check.finding
    assert "pg_drop_replication_slot('old')" in check.advice


SERVER: dict[str, Any] = {
    "role": "app",
    "standby": False,
    "read_all_stats": True,
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_commit": "on",
    "synchronous_standby_names": "",
    "autovacuum": "on",
    "vacuum_threshold": 50.0,
    "vacuum_scale_factor": 0.2,
    "analyze_threshold": 50.0,
    "analyze_scale_factor": 0.1,
    "standbys": 0,
    "synchronous_standbys": 0,
    "hidden_standbys": 0,
    "may_claim": True,
}


def table(**fields: Any) -> dict[str, Any]:
    row = {
        "name": "pgqueue_jobs",
        "live": 1_000,
        "dead": 0,
        "changed": 0,
        "planned": 1_000.0,
        "vacuumed_seconds_ago": 30.0,
        "analyzed_seconds_ago": 30.0,
        "autovacuum_off": False,
    }
    return row | fields


def test_dead_rows_past_autovacuums_reach_on_a_table_not_vacuumed_lately_warn() -> None:
    # Threshold 50 + 0.2 x 1,000 = 250: 5,000 dead rows, never vacuumed.
    check = threats.vacuum([table(dead=5_000, vacuumed_seconds_ago=None)], SERVER)
    assert check.status == "warn" and check.value == 5_000
    assert "pgqueue_jobs" in check.finding and "never" in check.finding
    assert check.advice.startswith("VACUUM pgqueue_jobs")


def test_dead_rows_that_autovacuum_is_about_to_take_are_fine() -> None:
    busy = table(dead=5_000, vacuumed_seconds_ago=20.0)  # vacuumed lately: it keeps up
    assert threats.vacuum([busy, table(name="pgqueue_counters")], SERVER).status == "ok"


def test_dead_rows_with_autovacuum_off_for_the_table_warn_at_once() -> None:
    check = threats.vacuum([table(dead=300, autovacuum_off=True)], SERVER)
    assert check.status == "warn" and "autovacuum is off" in check.finding


def test_statistics_that_counted_an_empty_table_mislead_once_it_fills() -> None:
    check = threats.statistics([table(live=5_000, planned=0.0, changed=5_000)], SERVER)
    assert check.status == "warn"
    assert "counts 0 rows" in check.finding and "5,000 live" in check.finding
    assert check.advice.startswith("ANALYZE pgqueue_jobs")


@pytest.mark.parametrize(
    ("live", "planned", "changed"),
    [(1_500, 1_000.0, 5_000), (900, -1.0, 900), (200_000, 150_000.0, 90_000)],
)
def test_statistics_near_the_truth_are_fine(live: int, planned: float, changed: int) -> None:
    check = threats.statistics([table(live=live, planned=planned, changed=changed)], SERVER)
    assert check.status == "ok"


def plan(*scans: tuple[str, str | None]) -> list[dict[str, Any]]:
    nodes = [
        {"Node Type": node, "Relation Name": "pgqueue_jobs", **({"Index Name": i} if i else {})}
        for node, i in scans
    ]
    return [{"Plan": {"Node Type": "ModifyTable", "Relation Name": "pgqueue_jobs", "Plans": nodes}}]


def test_a_claim_by_its_indexes_is_fine() -> None:
    claim = plan(("Index Scan", "pgqueue_jobs_claim_queue"), ("Index Scan", "pgqueue_jobs_pkey"))
    check = threats.claim_plan(claim, "default", 50_000)
    assert check.status == "ok" and "pgqueue_jobs_claim_queue" in check.finding


def test_a_claim_that_reads_a_large_table_whole_warns() -> None:
    claim = plan(("Index Scan", "pgqueue_jobs_claim_queue"), ("Seq Scan", None))
    assert threats.claim_plan(claim, "default", 50_000).status == "warn"
    assert threats.claim_plan(claim, "default", 10).status == "ok"  # a small table may be


def test_a_claim_this_role_may_not_run_is_not_checked() -> None:
    check = threats.claim_plan(None, "default", 10)
    assert check.status == "ok" and NOT_VISIBLE in check.finding


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({}, "ok"),
        ({"synchronous_standby_names": "absent"}, "fail"),
        ({"synchronous_standby_names": "s1", "standbys": 1}, "fail"),
        ({"synchronous_standby_names": "s1", "standbys": 1, "synchronous_standbys": 1}, "ok"),
        (
            {
                "synchronous_standby_names": "s1",
                "standbys": 1,
                "hidden_standbys": 1,
                "read_all_stats": False,
            },
            "warn",
        ),
    ],
)
def test_a_synchronous_standby_named_but_not_connected_fails(
    fields: dict[str, Any], status: str
) -> None:
    check = threats.synchronous_standby(SERVER | fields)
    assert check.status == status
    if status == "fail":
        assert "commit" in check.finding and "synchronous_standby_names" in check.advice


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({}, "ok"),
        ({"fsync": "off"}, "fail"),
        ({"full_page_writes": "off"}, "fail"),
        ({"synchronous_commit": "off"}, "warn"),
        ({"synchronous_commit": "local"}, "ok"),
    ],
)
def test_settings_that_lose_or_corrupt_data(fields: dict[str, Any], status: str) -> None:
    assert threats.durability(SERVER | fields).status == status


def test_the_schema_against_the_librarys_migrations() -> None:
    assert threats.schema(["0001", "0002"], ["0001", "0002"]).status == "ok"
    pending = threats.schema(["0001"], ["0001", "0002"])
    assert pending.status == "fail" and "0002" in pending.finding and pending.value == 1
    newer = threats.schema(["0001", "0002", "0099_future"], ["0001", "0002"])
    assert newer.status == "warn" and "0099_future" in newer.finding


def test_expired_leases_long_past_are_stuck_jobs() -> None:
    assert threats.stuck_jobs({"jobs": 0, "oldest_seconds": 0.0}, 15).status == "ok"
    check = threats.stuck_jobs({"jobs": 3, "oldest_seconds": 3_600.0}, 15)
    assert check.status == "warn" and check.value == 3 and "60 min ago" in check.finding


def worker(alive: bool = True, stalled: bool = False) -> WorkerRow:
    return WorkerRow(
        name="w1", host="h", pid=1, version="0", queues=None, concurrency=10, started_at=T0,
        last_seen_at=T0, expires_at=T0, held=0, running=0, hung=0, claimed=0,
        last_claim_at=None, alive=alive, last_seen_seconds=1.0, stalled=stalled,
    )  # fmt: skip


def test_workers_alive_stalled_and_none_for_queued_jobs() -> None:
    assert threats.workers([worker()], 100).status == "ok"
    assert threats.workers([], 0).status == "ok"  # nothing to run, nothing running
    none = threats.workers([worker(alive=False)], 100)
    assert none.status == "warn" and "1 gone" in none.finding and "100 jobs" in none.finding
    assert threats.workers([worker(stalled=True)], 1).status == "warn"


def test_the_report_is_as_bad_as_its_worst_check() -> None:
    def report(*statuses: Any) -> HealthReport:
        checks = tuple(HealthCheck(f"c{i}", s, "x") for i, s in enumerate(statuses))
        return HealthReport(checks, 1.0, "app", T0)

    assert report("ok", "ok").status == "ok"
    assert report("ok", "warn").status == "warn" and not report("warn").failed
    assert report("warn", "fail", "ok").failed
    assert report("ok", "fail").to_dict()["checks"][1]["status"] == "fail"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"window_seconds": 0}, "window_seconds"),
        ({"window_seconds": 61}, "window_seconds"),
        ({"long_transaction_seconds": 0}, "long_transaction_seconds"),
        ({"cores": 0}, "cores"),
        ({"cores": True}, "cores"),
        ({"cores": 2.5}, "cores"),
        ({"window_seconds": "5"}, "window_seconds"),
    ],
)
def test_bad_options_are_refused_naming_them(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSettings, match=field):
        DoctorOptions(**fields)
