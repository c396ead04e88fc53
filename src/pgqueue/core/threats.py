"""The doctor's threat checks: what keeps the queue from its capacity or
its guarantees, each a pure function of the rows ``doctor.py`` read
(see health.py for the capacity checks and the report)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .flows import Row
from .health import NOT_VISIBLE, HealthCheck, ago
from .workers import WorkerRow

__all__ = [
    "CLAIM_INDEXES",
    "SMALL_TABLE_ROWS",
    "VACUUM_LAG_SECONDS",
    "claim_plan",
    "durability",
    "long_transactions",
    "replication_slots",
    "schema",
    "statistics",
    "stuck_jobs",
    "synchronous_standby",
    "vacuum",
    "workers",
]

# The claim's intended ways to pgqueue_jobs (tests/integration/schema/
# test_plans_statistics.py holds it to them under any statistics).
CLAIM_INDEXES = frozenset({"pgqueue_jobs_claim_queue", "pgqueue_jobs_pkey"})
# A table this small may be read whole: the planner is right to.
SMALL_TABLE_ROWS = 1_000
# Autovacuum that has not run for this long while its threshold is passed
# twice over is behind.
VACUUM_LAG_SECONDS = 600.0


def long_transactions(
    sessions: Sequence[Row], threshold_seconds: float, read_all_stats: bool
) -> HealthCheck:
    """Transactions open longer than ``threshold_seconds``, sessions' or
    prepared ones (``gid`` set): until they end, vacuum keeps every row
    version they might still see, the jobs table and its indexes grow with
    two dead versions per job, and each claim reads past them."""
    source = "pg_stat_activity (xact_start, backend_xmin), pg_prepared_xacts"
    long = [s for s in sessions if s["seconds"] is not None and s["seconds"] > threshold_seconds]
    hidden = [s for s in sessions if s["seconds"] is None]
    note = ""
    if hidden and not read_all_stats:
        held = max((s["xmin_age"] or s["xid_age"] or 0) for s in hidden)
        note = (
            f"; {len(hidden)} session(s) of other roles hold back vacuum by up to "
            f"{held:,} transactions, how long is {NOT_VISIBLE}"
        )
    if not long:
        return HealthCheck(
            "long_transactions",
            "ok",
            f"no {'visible ' if note else ''}transaction open longer than "
            f"{threshold_seconds:g} s{note}",
            "grant pg_read_all_stats to see every role's sessions" if note else "",
            source,
            0,
            "transactions",
        )
    oldest = max(long, key=lambda s: s["seconds"])
    held = oldest["xmin_age"] or oldest["xid_age"]
    holding = f", holding back vacuum by {held:,} transactions" if held else ""
    if oldest["gid"] is not None:
        gid = "'" + oldest["gid"].replace("'", "''") + "'"
        who = f"prepared transaction {gid}, {oldest['role']}"
        advice = (
            f"finish it as its coordinator meant to (COMMIT PREPARED {gid}, or ROLLBACK "
            f"PREPARED {gid}): no session holds it, and no timeout ends it"
        )
    else:
        who = ", ".join(
            part
            for part in (
                f"pid {oldest['pid']}",
                oldest["role"],
                oldest["state"],
                oldest["application_name"] or "",
            )
            if part
        )
        advice = (
            f"end it (pg_terminate_backend({oldest['pid']})) and fix what leaves it open; "
            "idle_in_transaction_session_timeout ends idle ones"
        )
    return HealthCheck(
        "long_transactions",
        "warn",
        f"{len(long)} transaction(s) open longer than {threshold_seconds:g} s; the oldest "
        f"({who}) for {oldest['seconds']:,.0f} s{holding}{note}",
        advice,
        source,
        len(long),
        "transactions",
    )


def replication_slots(slots: Sequence[Row]) -> HealthCheck:
    """A slot no consumer reads keeps every WAL segment since its restart
    point (the disk fills at the queue's WAL rate), and with an xmin it
    holds back vacuum too."""
    source = "pg_replication_slots"
    idle = [slot for slot in slots if not slot["active"]]
    if not idle:
        return HealthCheck(
            "replication_slots",
            "ok",
            f"no inactive replication slot ({len(slots)} active)",
            source=source,
            value=0,
            unit="slots",
        )
    worst = max(idle, key=lambda slot: slot["retained_bytes"] or 0)
    kept = worst["retained_bytes"]
    held = f", holds back vacuum by {worst['xmin_age']:,} transactions" if worst["xmin_age"] else ""
    return HealthCheck(
        "replication_slots",
        "warn",
        f"{len(idle)} inactive replication slot(s); {worst['name']!r} ({worst['type']}) keeps "
        f"{'an unknown amount of' if kept is None else f'{kept:,} bytes of'} WAL{held}",
        f"if its consumer is gone, drop it: pg_drop_replication_slot({worst['name']!r}); "
        "max_slot_wal_keep_size bounds the WAL a slot may keep",
        source,
        len(idle),
        "slots",
    )


def _trigger(threshold: float, scale: float, planned: float) -> float:
    """The changes after which autovacuum acts on a table of ``planned`` rows."""
    return threshold + scale * max(planned, 0.0)


def vacuum(tables: Sequence[Row], server: Mapping[str, Any]) -> HealthCheck:
    """Dead row versions past twice autovacuum's threshold, on a table not
    vacuumed for VACUUM_LAG_SECONDS (or ever), or with autovacuum off."""
    source = "pg_stat_user_tables (n_dead_tup, last_vacuum, last_autovacuum)"
    behind: list[tuple[Row, float, str]] = []
    for row in tables:
        trigger = _trigger(
            server["vacuum_threshold"], server["vacuum_scale_factor"], row["planned"]
        )
        if row["dead"] <= trigger:
            continue
        off = server["autovacuum"] != "on" or row["autovacuum_off"]
        vacuumed = row["vacuumed_seconds_ago"]
        late = row["dead"] > 2 * trigger and (vacuumed is None or vacuumed > VACUUM_LAG_SECONDS)
        if off or late:
            why = f"last vacuumed {ago(vacuumed)}"
            if off:
                where = "on the server" if server["autovacuum"] != "on" else "for this table"
                why = f"autovacuum is off {where}, {why}"
            behind.append((row, trigger, why))
    if not behind:
        most = max((int(row["dead"]) for row in tables), default=0)
        return HealthCheck(
            "vacuum",
            "ok",
            f"{len(tables)} pgqueue tables, at most {most:,} dead row versions: "
            "autovacuum keeps up",
            source=source,
            value=most,
            unit="dead rows",
        )
    row, trigger, why = max(behind, key=lambda item: item[0]["dead"])
    return HealthCheck(
        "vacuum",
        "warn",
        f"{row['name']}: {row['dead']:,} dead row versions (autovacuum acts at {trigger:,.0f}), "
        f"{why}",
        f"VACUUM {row['name']}; if autovacuum cannot keep up, lower its "
        "autovacuum_vacuum_scale_factor or raise autovacuum_max_workers, and end long "
        "transactions (their snapshots keep dead rows)",
        source,
        int(row["dead"]),
        "dead rows",
    )


def statistics(tables: Sequence[Row], server: Mapping[str, Any]) -> HealthCheck:
    """Whether the planner's idea of pgqueue_jobs (its rows at the last
    ANALYZE) is more than twice off from the rows it has now."""
    source = "pg_stat_user_tables (n_live_tup, n_mod_since_analyze) and pg_class.reltuples"
    row = next((r for r in tables if r["name"] == "pgqueue_jobs"), None)
    if row is None:
        return HealthCheck("statistics", "ok", f"pgqueue_jobs is {NOT_VISIBLE}", source=source)
    planned, live = max(row["planned"], 0.0), int(row["live"])
    analyzed = ago(row["analyzed_seconds_ago"])
    trigger = _trigger(server["analyze_threshold"], server["analyze_scale_factor"], row["planned"])
    off = abs(live - planned) > max(SMALL_TABLE_ROWS, planned) and row["changed"] > trigger
    finding = (
        f"pgqueue_jobs: the planner counts {planned:,.0f} rows, the table has {live:,} live "
        f"(analyzed {analyzed}; {row['changed']:,} changes since)"
    )
    if not off:
        return HealthCheck("statistics", "ok", finding, source=source, value=live, unit="rows")
    return HealthCheck(
        "statistics",
        "warn",
        finding,
        "ANALYZE pgqueue_jobs (autovacuum analyzes after "
        f"{trigger:,.0f} changes); the claim's plan does not depend on them (see claim_plan), "
        "the listings and counts do",
        source,
        live,
        "rows",
    )


def claim_plan(plan: Any, queue: str, live_rows: int | None) -> HealthCheck:
    """How the planner would reach pgqueue_jobs for a claim of ``queue``
    now (EXPLAIN, nothing run): by the claim index and the primary key, or
    by reading the table whole, which is fine only for a small table."""
    source = f"EXPLAIN of job_claim (queue {queue!r}), without ANALYZE"
    if plan is None:
        return HealthCheck(
            "claim_plan",
            "ok",
            f"not checked: explaining a claim needs the claim's privileges, {NOT_VISIBLE}",
            "run the doctor as the workers' role to check the claim's plan",
            source,
        )
    ways = sorted(_ways(plan))
    other = [way for way in ways if way not in CLAIM_INDEXES]
    if not other:
        return HealthCheck(
            "claim_plan",
            "ok",
            f"the claim reaches pgqueue_jobs by {', '.join(ways)}",
            source=source,
        )
    finding = f"the claim reaches pgqueue_jobs by {', '.join(ways)}"
    if live_rows is not None and live_rows < SMALL_TABLE_ROWS:
        return HealthCheck(
            "claim_plan",
            "ok",
            f"{finding}: fine while the table holds {live_rows:,} rows",
            source=source,
        )
    return HealthCheck(
        "claim_plan",
        "warn",
        finding + ", not only by its indexes " + ", ".join(sorted(CLAIM_INDEXES)),
        "ANALYZE pgqueue_jobs, and check that migrations are applied "
        "(pgqueue migrate): the claim is written to use its indexes whatever the statistics",
        source,
    )


def _ways(plan: Any) -> set[str]:
    """How each node of an EXPLAIN (FORMAT JSON) document reads pgqueue_jobs:
    the index's name, or the node type (Seq Scan...)."""
    ways: set[str] = set()
    nodes = [entry["Plan"] for entry in plan]
    while nodes:
        node = nodes.pop()
        children = node.get("Plans", [])
        nodes += children
        if node.get("Relation Name") != "pgqueue_jobs" or node["Node Type"] == "ModifyTable":
            continue
        if "Index Name" in node:
            ways.add(node["Index Name"])
        elif node["Node Type"] == "Bitmap Heap Scan":
            ways |= {c["Index Name"] for c in children if "Index Name" in c} or {"Bitmap Heap Scan"}
        else:
            ways.add(node["Node Type"])
    return ways


def synchronous_standby(server: Mapping[str, Any]) -> HealthCheck:
    """A synchronous_standby_names that no connected standby answers makes
    every commit that writes wait: enqueues and acks hang."""
    source = "synchronous_standby_names and pg_stat_replication"
    names = server["synchronous_standby_names"]
    standbys = int(server["standbys"])
    if not names:
        return HealthCheck(
            "synchronous_standby",
            "ok",
            f"no synchronous standby configured ({standbys} standby(s) connected)",
            "a failover to an asynchronous standby may lose the last acknowledged jobs "
            "(docs/failover.md)",
            source,
            standbys,
            "standbys",
        )
    if int(server["synchronous_standbys"]) > 0:
        return HealthCheck(
            "synchronous_standby",
            "ok",
            f"{server['synchronous_standbys']} synchronous standby(s) connected "
            f"(synchronous_standby_names = {names!r})",
            source=source,
            value=int(server["synchronous_standbys"]),
            unit="standbys",
        )
    if standbys == 0:
        finding = f"synchronous_standby_names = {names!r}, and no standby is connected"
    elif int(server["hidden_standbys"]) > 0 and not server["read_all_stats"]:
        return HealthCheck(
            "synchronous_standby",
            "warn",
            f"synchronous_standby_names = {names!r}; {standbys} standby(s) connected, whether "
            f"one is synchronous is {NOT_VISIBLE}",
            "grant pg_read_all_stats to this role to check it",
            source,
        )
    else:
        finding = (
            f"synchronous_standby_names = {names!r}, and none of the {standbys} connected "
            "standby(s) is synchronous"
        )
    return HealthCheck(
        "synchronous_standby",
        "fail",
        finding + ": every commit that writes waits, enqueues and acks hang",
        "start or reconnect the standby, or clear synchronous_standby_names "
        "(ALTER SYSTEM RESET synchronous_standby_names, then pg_reload_conf())",
        source,
        0,
        "standbys",
    )


def durability(server: Mapping[str, Any]) -> HealthCheck:
    """fsync and full_page_writes off can corrupt the database in a crash;
    synchronous_commit off can lose the last acknowledged jobs."""
    source = "pg_settings (fsync, full_page_writes, synchronous_commit)"
    corrupting = [name for name in ("fsync", "full_page_writes") if server[name] == "off"]
    if corrupting:
        return HealthCheck(
            "durability",
            "fail",
            f"{' and '.join(corrupting)} off: a crash of the server can corrupt the database",
            f"turn {' and '.join(corrupting)} back on (only a throw-away test server runs so)",
            source,
        )
    if server["synchronous_commit"] == "off":
        return HealthCheck(
            "durability",
            "warn",
            "synchronous_commit off: a crash can lose jobs whose enqueue or ack was "
            "acknowledged in the last moments",
            "set synchronous_commit = on (docs/guarantees.md)",
            source,
        )
    return HealthCheck(
        "durability",
        "ok",
        f"fsync and full_page_writes on, synchronous_commit {server['synchronous_commit']}",
        source=source,
    )


def schema(applied: Sequence[str], expected: Sequence[str]) -> HealthCheck:
    """The database's migrations against this library's."""
    source = "pgqueue_migrations against this library's migrations"
    pending = [v for v in expected if v not in set(applied)]
    unknown = sorted(set(applied) - set(expected))
    if pending:
        return HealthCheck(
            "schema",
            "fail",
            f"{len(pending)} migration(s) pending: {', '.join(pending[:3])}"
            + ("..." if len(pending) > 3 else ""),
            "run pgqueue migrate",
            source,
            len(pending),
            "migrations",
        )
    if unknown:
        return HealthCheck(
            "schema",
            "warn",
            f"the database has {len(unknown)} migration(s) this library does not know: "
            f"{', '.join(unknown[:3])} (a newer pgqueue migrated it)",
            "upgrade this pgqueue to the version that migrated the database",
            source,
            len(unknown),
            "migrations",
        )
    return HealthCheck(
        "schema",
        "ok",
        f"up to date: {len(expected)} migrations, the latest {expected[-1] if expected else '-'}",
        source=source,
        value=0,
        unit="migrations",
    )


def stuck_jobs(row: Mapping[str, Any], grace_seconds: float) -> HealthCheck:
    """Running jobs whose lease expired more than ``grace_seconds`` ago."""
    source = "pgqueue_jobs (running, lease_expires_at)"
    jobs = int(row["jobs"])
    if not jobs:
        return HealthCheck(
            "stuck_jobs",
            "ok",
            f"no running job's lease expired more than {grace_seconds:g} s ago",
            source=source,
            value=0,
            unit="jobs",
        )
    return HealthCheck(
        "stuck_jobs",
        "warn",
        f"{jobs:,} running job(s) whose lease expired more than {grace_seconds:g} s ago "
        f"(the oldest {ago(row['oldest_seconds'])}): no worker is reaping them",
        "start a worker (every worker reaps expired leases every reap_interval_seconds "
        "and puts the jobs back to queued, or dead when out of attempts)",
        source,
        jobs,
        "jobs",
    )


def workers(rows: Sequence[WorkerRow], runnable: int) -> HealthCheck:
    """Workers alive, stalled, gone; a warning when runnable jobs have no
    worker alive to run them."""
    source = "pgqueue_workers (the workers registry)"
    alive = [w for w in rows if w.alive]
    stalled = [w.name for w in alive if w.stalled]
    gone = len(rows) - len(alive)
    slots = sum(w.concurrency for w in alive)
    finding = f"{len(alive)} worker(s) alive ({slots} slots), {gone} gone; {runnable:,} jobs queued"
    if stalled:
        return HealthCheck(
            "workers",
            "warn",
            f"{finding}; stalled: {', '.join(stalled[:3])}",
            "a stalled worker has free slots and does not claim: read its logs, restart it",
            source,
            len(alive),
            "workers",
        )
    if not alive and runnable:
        return HealthCheck(
            "workers",
            "warn",
            finding + ": nothing runs them",
            "start workers (pgqueue worker --handlers ...)",
            source,
            0,
            "workers",
        )
    return HealthCheck("workers", "ok", finding, source=source, value=len(alive), unit="workers")
