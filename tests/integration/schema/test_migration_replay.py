"""Every way to today's schema ends at the same schema.

A database is migrated from empty by today's files, or was migrated by an
earlier version of pgqueue and is then brought up to date by ``migrate()``.
pgqueue has no release tags, so every set of migration files the git
history ever held counts as a version someone may have migrated with: each
is replayed into a database of its own, upgraded by today's code, and its
schema, read from the catalogs, compared with a fresh database's. Among
those versions is migration 0009, which landed and was deleted later: a
database that applied it must end where a fresh one does too.

The sets are read from ``released_migrations.json``, a snapshot of the
history, so that the replay runs in a clone of any depth. Where the whole
history is at hand, a test checks the snapshot against it; after a commit
that adds or changes a migration, refresh it from a full clone with::

    .venv/bin/python -m tests.integration.schema.released_migrations --refresh
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg
import pytest

from pgqueue import migrate
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.db.migrate import NO_TRANSACTION, statements
from pgqueue.sql import QUERIES, migration_files
from tests.integration.schema.released_migrations import (
    REFRESH,
    SNAPSHOT,
    HistoryUnavailable,
    Version,
    digest,
    read_snapshot,
    released_from_history,
)

WITHDRAWN = "0009_enqueue_retry"

# What the schema is made of, one catalog query per kind of object: each row
# is (name, definition). Objects in PostgreSQL's own schemas are left out;
# dropped columns too (a column dropped by an upgrade stays in pg_attribute).
# A column's position is left out: migrations that landed on branches apply
# in another order on an upgraded database, and pgqueue names every column
# it reads or writes.
CATALOG = {
    "relations": """
        SELECT n.nspname || '.' || c.relname,
               concat_ws(' ', c.relkind, c.relpersistence, c.reloptions::text)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')""",
    "columns": """
        SELECT n.nspname || '.' || c.relname || '.' || a.attname,
               concat_ws(' ', format_type(a.atttypid, a.atttypmod),
                         CASE WHEN a.attnotnull THEN 'NOT NULL' END,
                         'DEFAULT ' || pg_get_expr(d.adbin, d.adrelid),
                         a.attidentity, a.attgenerated, a.attstattarget,
                         a.attcollation::regcollation, a.attoptions::text)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND a.attnum > 0 AND NOT a.attisdropped""",
    "indexes": """
        SELECT n.nspname || '.' || c.relname,
               concat_ws(' ', pg_get_indexdef(c.oid), c.reloptions::text)
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace""",
    "constraints": """
        SELECT n.nspname || '.' || r.relname || '.' || k.conname,
               concat_ws(' ', pg_get_constraintdef(k.oid), k.condeferrable, k.condeferred)
        FROM pg_constraint k JOIN pg_class r ON r.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = r.relnamespace""",
    "functions": """
        SELECT n.nspname || '.' || p.proname || '(' || pg_get_function_identity_arguments(p.oid)
               || ')',
               concat_ws(' ', pg_get_functiondef(p.oid), p.proconfig::text)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE p.prokind IN ('f', 'p')""",
    "triggers": """
        SELECT n.nspname || '.' || c.relname || '.' || t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE NOT t.tgisinternal""",
    "sequences": """
        SELECT schemaname || '.' || sequencename,
               concat_ws(' ', data_type, start_value, min_value, max_value, increment_by,
                         cycle, cache_size)
        FROM pg_sequences""",
    "views": """
        SELECT schemaname || '.' || viewname, definition FROM pg_views""",
    "types": """
        SELECT n.nspname || '.' || t.typname,
               concat_ws(' ', t.typtype,
                         (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                          FROM pg_enum e WHERE e.enumtypid = t.oid))
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE t.typtype IN ('e', 'd', 'r')
           OR (t.typtype = 'c' AND (SELECT c.relkind FROM pg_class c
                                    WHERE c.oid = t.typrelid) = 'c')""",
    "extensions": "SELECT extname, extversion FROM pg_extension",
}
SYSTEM_SCHEMAS = ("pg_catalog.", "information_schema.", "pg_toast.")

# Versions that do not reach today's schema: a migration file they applied
# was edited afterwards, and migrate() applies each file once. None of them
# lasted an hour: the first day's, and feature branches' before their merge.
# Their drift is asserted exactly, so that editing a landed migration again
# fails the test, and so does repairing one of these without taking it off
# the list. Each is named by the first commit that held its files.
# (Their pick function, which counted one start a row, is made again whole
# by 0032_fair_queues: no longer a drift.)
STARTS_WITHOUT_JOBS = frozenset(
    {
        "columns public.pgqueue_starts.jobs",
        "constraints public.pgqueue_starts.pgqueue_starts_jobs_not_null",
    }
)
KNOWN_DRIFT: dict[str, frozenset[str]] = {
    # 0001_jobs then had the id GENERATED ALWAYS (COPY with reserved ids,
    # 63e15f98, needs BY DEFAULT) and pgqueue_jobs_reap on lease_expires_at
    # (on id since 27bd48e5, so that heartbeats are HOT updates).
    "fe7a91ed": frozenset({"columns public.pgqueue_jobs.id", "indexes public.pgqueue_jobs_reap"}),
    "63e15f98": frozenset({"indexes public.pgqueue_jobs_reap"}),
    # 0005_queue_controls before 5080d907 (branch limits): pgqueue_starts
    # without its jobs column, the pick function counting one start a row.
    "6e64f66e": STARTS_WITHOUT_JOBS,
    "e63cc19e": STARTS_WITHOUT_JOBS,
    # 0027_batches before its prune index (branch batches): no
    # pgqueue_batches_finished.
    "b41fb0d2": frozenset({"indexes public.pgqueue_batches_finished"}),
    # 0041_archive_list_indexes as first committed (30f915fd, for minutes):
    # an index on (task, id) too, withdrawn for what it cost the moves.
    "30f915fd": frozenset({"indexes public.pgqueue_jobs_archive_task"}),
    # 0034_archive before its functions set lock_timeout (branch archive).
    "11511920": frozenset(
        {
            "functions public.pgqueue_archive_drop(before timestamp with time zone)",
            "functions public.pgqueue_archive_partitions(since timestamp with time zone,"
            " until timestamp with time zone)",
        }
    ),
    # 0010_history before 461b27b3 (branch history): no pgqueue_enqueued,
    # the totals view without it.
    "e90c4d97": frozenset(
        {
            "relations public.pgqueue_enqueued",
            "columns public.pgqueue_enqueued.n",
            "columns public.pgqueue_enqueued.queue",
            "constraints public.pgqueue_enqueued.pgqueue_enqueued_n_not_null",
            "constraints public.pgqueue_enqueued.pgqueue_enqueued_queue_not_null",
            "views public.pgqueue_queue_totals",
        }
    ),
}

Schema = dict[str, dict[str, str]]


def apply_as_released(url: str, files: Iterable[tuple[str, str]]) -> None:
    """What ``migrate()`` of that version did: each file in its own
    transaction, recorded under its name in pgqueue_migrations (a record
    whose table and rows have kept their shape since the first migration)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(QUERIES["migration_table"])
        for version, text in files:
            if text.startswith(NO_TRANSACTION):  # CREATE INDEX CONCURRENTLY: one by one
                for statement in statements(text):
                    conn.execute(statement)
                conn.execute(QUERIES["migration_record"], {"version": version})
                continue
            with conn.transaction():
                conn.execute(text)
                conn.execute(QUERIES["migration_record"], {"version": version})


def schema_of(url: str) -> Schema:
    with psycopg.connect(url) as conn:
        return {
            kind: {
                name: definition
                for name, definition in conn.execute(query)
                if not name.startswith(SYSTEM_SCHEMAS)
            }
            for kind, query in CATALOG.items()
        }


def differences(expected: Schema, found: Schema) -> dict[str, str]:
    """Each object ``found`` lacks, has in excess or defines otherwise, as
    "kind name": what differs."""
    drift = {}
    for kind, objects in expected.items():
        for name in objects.keys() | found[kind].keys():
            want, got = objects.get(name), found[kind].get(name)
            if want != got:
                drift[f"{kind} {name}"] = f"expected {want!r}, found {got!r}"
    return drift


@contextlib.contextmanager
def database(server: EmbeddedPostgres) -> Iterator[str]:
    name = f"replay_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield server.url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def upgraded(server: EmbeddedPostgres, version: Version) -> Schema:
    """The schema of a database migrated by ``version``, then by today's code."""
    with database(server) as url:
        apply_as_released(url, version.files)
        migrate(url)
        return schema_of(url)


@pytest.fixture(scope="module")
def fresh(pg_server: EmbeddedPostgres) -> Schema:
    """The schema ``migrate()`` gives an empty database today."""
    with database(pg_server) as url:
        migrate(url)
        return schema_of(url)


@pytest.fixture(scope="module")
def versions() -> list[Version]:
    return read_snapshot()


def test_every_migration_applied_from_empty_gives_the_schema_migrate_gives(
    pg_server: EmbeddedPostgres, fresh: Schema
) -> None:
    assert fresh["relations"] and fresh["functions"], "the catalog queries read nothing"
    with database(pg_server) as url:
        apply_as_released(url, migration_files())
        assert differences(fresh, schema_of(url)) == {}


def test_every_earlier_version_upgrades_to_the_fresh_schema_but_the_known_drift(
    pg_server: EmbeddedPostgres, fresh: Schema, versions: list[Version]
) -> None:
    assert len(versions) > len(KNOWN_DRIFT), "the snapshot holds too few migration sets"
    drift = {version.name: differences(fresh, upgraded(pg_server, version)) for version in versions}
    unexpected = [
        f"{name}: {what}: {how}"
        for name, found in drift.items()
        for what, how in sorted(found.items())
        if what not in KNOWN_DRIFT.get(name, frozenset())
    ]
    assert not unexpected, "\n".join(unexpected)
    assert {name: set(found) for name, found in drift.items() if found} == KNOWN_DRIFT


def test_a_database_that_applied_the_withdrawn_0009_upgrades_to_the_fresh_schema(
    pg_server: EmbeddedPostgres, fresh: Schema, versions: list[Version]
) -> None:
    with_0009 = [version for version in versions if WITHDRAWN in dict(version.files)]
    assert with_0009, f"no version in the snapshot holds {WITHDRAWN}"
    for version in with_0009:
        assert differences(fresh, upgraded(pg_server, version)) == {}, version.name


def test_the_snapshot_is_whole_and_agrees_with_the_git_history_where_it_is_whole() -> None:
    """The snapshot's own integrity, in any clone: each file text under its
    own hash and referenced, each version named once by a commit, its files
    unique and in the order they apply, today's set left out, the withdrawn
    0009 and every version of KNOWN_DRIFT in. The comparison with the git
    history (every set of the history but today's, under the same names, in
    the same order) needs a full clone: in a shallow one, or without git,
    the integrity is all this test asserts."""
    snapshot = json.loads(SNAPSHOT.read_text("utf-8"))
    texts: dict[str, str] = snapshot["texts"]
    entries: list[dict[str, Any]] = snapshot["versions"]
    assert [key for key, text in texts.items() if digest(text) != key] == [], "texts changed"
    referenced = {key for entry in entries for _, key in entry["files"]}
    assert referenced - texts.keys() == set(), "files without their text"
    assert texts.keys() - referenced == set(), "texts no version holds"
    names = [entry["name"] for entry in entries]
    assert [name for name in names if not re.fullmatch("[0-9a-f]{8}", name)] == []
    assert len(set(names)) == len(names), "two versions under one name"
    for entry in entries:
        order = [version for version, _ in entry["files"]]
        assert order == sorted(set(order)), entry["name"]
    versions = read_snapshot()
    today = tuple(migration_files())
    releases_like_today = [version.name for version in versions if version.files == today]
    assert releases_like_today == [], "today's set is the fresh path, not a release"
    assert any(WITHDRAWN in dict(version.files) for version in versions)
    assert KNOWN_DRIFT.keys() <= set(names)
    try:
        history = released_from_history()
    except HistoryUnavailable:
        return
    assert digests(versions) == digests(history), f"a stale snapshot: {REFRESH}"


def digests(versions: list[Version]) -> list[tuple[str, list[str]]]:
    """Each version as its name and its files' "version hash", to compare
    without printing whole files."""
    return [
        (version.name, [f"{name} {digest(text)[:12]}" for name, text in version.files])
        for version in versions
    ]
