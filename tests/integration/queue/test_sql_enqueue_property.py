"""Property: the SQL functions of migration 0030 and the library apply the same
rules. The same random job goes to Queue.enqueue and to pgqueue_enqueue (and
the same random batch, as JSON, to Queue.enqueue_many and
pgqueue_enqueue_many), in one transaction (so one now() for both, rolled
back after): both take it or both refuse it, and what they store is equal
(a job with a key: the SQL call finds the library's job under it, which
says the two made the same key).

And the same debounce: a job whose on_conflict meets a waiting holder
changes it alike through both.

Dependencies name two parents made in the same transaction, one queued
and one dead ("queued" and "dead" in the drawn lists stand for their ids),
so that a dependent is waiting, queued or cancelled at once alike.

Left out on purpose: NUL and lone surrogates (jsonb and text cannot hold
them, so the SQL function cannot be handed them), and floats of 1e16 or more and -0.0 in payloads
(jsonb keeps 1e+16 as the integer 10000000000000000 and -0.0 as 0.0, so a
key made of such a payload differs from the library's;
docs/howto/enqueue-from-sql.md says so)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from psycopg import errors
from psycopg.types.json import Jsonb

from pgqueue import InvalidJob, Queue
from pgqueue.core.enqueue import _in_period
from pgqueue.core.job_spec import JobSpec
from pgqueue.core.jobs import QUEUE_NAME, TASK_NAME

# Columns compared (all but the id and the library's own call key).
COLUMNS = (
    "queue, task, payload, priority, state, run_at, max_attempts, timeout_seconds,"
    " idempotency_key, unique_scope, concurrency_key, metadata, enqueued_at, depends_on,"
    " waiting_on, on_dependency_failure, finished_at, last_error"
)
TEN_YEARS = timedelta(days=3650)

chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
texts = st.text(chars, max_size=12)
numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(-1e15, 1e15),
    st.floats(-1e-3, 1e-3),
).filter(lambda n: n != 0 or str(n) != "-0.0")
leaves = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12,
)


def nested(depth: int) -> dict[str, Any]:
    """An object nested ``depth`` levels deep (itself one)."""
    value: Any = []
    for _ in range(depth - 2):
        value = [value]
    return {"a": value}


objects = st.one_of(
    st.dictionaries(texts, json_values, max_size=5),
    st.integers(62, 66).map(nested),
)
# Metadata around its limit, 16,384 bytes of JSON text: {"k":"..."} is 8 more.
metadata = st.one_of(
    objects, st.integers(16370, 16380).map(lambda n: {"k": "x" * n}), st.just({"k": "é" * 8190})
)


def mostly(valid: st.SearchStrategy[Any], *invalid: st.SearchStrategy[Any]) -> Any:
    """``valid`` nine times in ten, else one of ``invalid``."""
    if not invalid:
        return valid
    return st.integers(0, 9).flatmap(lambda n: valid if n else st.one_of(*invalid))


keys = mostly(
    st.text(chars, min_size=1, max_size=8), st.text(chars, min_size=250, max_size=260), st.just("")
)
task_names = mostly(st.from_regex(TASK_NAME, fullmatch=True), texts)
queue_names = mostly(st.from_regex(QUEUE_NAME, fullmatch=True), texts)
# Not within a day of the limit (ten years from now): the library reads
# its clock, the SQL the database's.
moments = st.datetimes(
    min_value=datetime(1960, 1, 1), max_value=datetime(2045, 1, 1), timezones=st.just(UTC)
).filter(lambda t: abs(t - (datetime.now(UTC) + TEN_YEARS)) > timedelta(days=1))
seconds = st.one_of(st.integers(-2, 10), st.floats(-1.0, 4e8), st.just(315360000.0))

FIELDS = {
    "payload": objects,
    "queue": mostly(queue_names, st.none()),
    "priority": mostly(st.integers(-32767, 32767), st.integers(-40000, 40000), st.none()),
    "delay_seconds": mostly(st.floats(0, 1e6), seconds),
    "run_at": moments,
    "max_attempts": mostly(st.integers(1, 1000), st.integers(-2, 1002)),
    "timeout_seconds": mostly(st.floats(1, 1e5), seconds, st.just(604800.0), st.just(604800.5)),
    "idempotency_key": keys,
    "unique_scope": mostly(st.sampled_from(["queued", "active", "always"]), st.just("never")),
    "unique_period_seconds": mostly(st.floats(1.0, 1e6), st.just(0.5), st.just(1)),
    "concurrency_key": keys,
    "metadata": metadata,
    "on_conflict": mostly(st.sampled_from(["ignore", "replace", "extend"]), st.just("merge")),
    "depends_on": st.sampled_from(
        [
            ["queued"],
            ["queued", "queued"],
            ["dead"],
            ["queued", "dead"],
            ["queued", 10**15],
            [0],
            [],
        ]
    ),
    "on_dependency_failure": st.sampled_from(["cancel", "run", "skip"]),
}
jobs = st.fixed_dictionaries(
    {"task": mostly(task_names, st.none())},
    optional={
        name: strategy if name in ("queue", "priority") else mostly(strategy, st.none())
        for name, strategy in FIELDS.items()
    },
)

PROPERTY = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def rows(conn: psycopg.Connection[Any], ids: list[int]) -> list[tuple[Any, ...]]:
    found = {
        r[0]: r[1:]
        for r in conn.execute(f"SELECT id, {COLUMNS} FROM pgqueue_jobs WHERE id = ANY(%s)", [ids])
    }
    return [found[i] for i in ids]


PARENTS = (
    "INSERT INTO pgqueue_jobs (task, state, finished_at) VALUES ('p', 'queued', NULL),"
    " ('p', 'dead', now()) RETURNING id, state"
)


def with_parents(conn: psycopg.Connection[Any], jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs with their depends_on's "queued" and "dead" made ids of
    parents in those states, inserted now in the example's transaction."""
    ids = {state: job_id for job_id, state in conn.execute(PARENTS).fetchall()}
    return [
        {
            name: [ids.get(i, i) if isinstance(i, str) else i for i in value]
            if name == "depends_on" and isinstance(value, list)
            else value
            for name, value in job.items()
        }
        for job in jobs
    ]


def sql_enqueue(conn: psycopg.Connection[Any], job: dict[str, Any]) -> int:
    casts = {"depends_on": "::bigint[]"}
    args = [
        "%(task)s",
        *(f"{name} => %({name})s{casts.get(name, '')}" for name in job if name != "task"),
    ]
    params = {
        name: Jsonb(value) if name in ("payload", "metadata") and value is not None else value
        for name, value in job.items()
    }
    row = conn.execute(f"SELECT pgqueue_enqueue({', '.join(args)})", params).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """One connection for every example, each in a transaction rolled back after."""
    with psycopg.connect(db_url) as connection:
        yield connection


@PROPERTY
@given(job=jobs)
def test_pgqueue_enqueue_takes_and_stores_what_the_library_does(
    queue: Queue, conn: psycopg.Connection[Any], job: dict[str, Any]
) -> None:
    [job] = with_parents(conn, [job])
    fields = dict(job)
    task = fields.pop("task")
    payload = fields.pop("payload", None)
    try:
        try:
            made = queue.enqueue(task, payload, connection=conn, **fields)
        except InvalidJob:
            made = None
        try:
            with conn.transaction():
                sql_id: int | None = sql_enqueue(conn, job)
        except errors.InvalidParameterValue:
            sql_id = None
        assert (made is None) == (sql_id is None), (made, sql_id)
        event("refused" if made is None else "keyed" if made.idempotency_key else "taken")
        if made is not None and sql_id is not None:
            if made.idempotency_key is not None:
                assert sql_id == made.id  # the same key, held by the library's job
            else:
                [ours, theirs] = rows(conn, [made.id, sql_id])
                assert ours == theirs
    finally:
        conn.rollback()


def library_enqueue(queue: Queue, conn: psycopg.Connection[Any], job: dict[str, Any]) -> int | None:
    fields = dict(job)
    try:
        return queue.enqueue(
            fields.pop("task"), fields.pop("payload", None), connection=conn, **fields
        ).id
    except InvalidJob:
        return None


def sql_enqueue_or_none(conn: psycopg.Connection[Any], job: dict[str, Any]) -> int | None:
    try:
        with conn.transaction():
            return sql_enqueue(conn, job)
    except errors.InvalidParameterValue:
        return None


# A holder and the job that meets it: no uniqueness fields of their own
# (each side gets its own key), any other field.
# A delay is nearly always given, so that extend has a run_at to move.
keyless = st.fixed_dictionaries(
    {
        "task": st.from_regex(TASK_NAME, fullmatch=True),
        "delay_seconds": mostly(st.floats(0, 1000), st.none()),
    },
    optional={
        name: mostly(FIELDS[name], st.none())
        for name in ("payload", "priority", "run_at", "metadata")
    },
)


@PROPERTY
@given(holder=keyless, later=keyless, how=FIELDS["on_conflict"])
def test_on_conflict_changes_the_holder_as_the_library_does(
    queue: Queue,
    conn: psycopg.Connection[Any],
    holder: dict[str, Any],
    later: dict[str, Any],
    how: str,
) -> None:
    # The same two enqueues, the library's under one key and the SQL's under
    # another, in one transaction (one now()): the holders end up equal.
    try:
        made = {}
        for key, enqueue in (
            ("library", lambda job: library_enqueue(queue, conn, job)),
            ("sql", lambda job: sql_enqueue_or_none(conn, job)),
        ):
            first = enqueue({**holder, "idempotency_key": key})
            second = enqueue({**later, "idempotency_key": key, "on_conflict": how})
            made[key] = (first, second)
        assert [a is None for a in made["library"]] == [a is None for a in made["sql"]], made
        (lib_first, lib_second), (sql_first, sql_second) = made["library"], made["sql"]
        event("refused" if lib_second is None else how)
        if lib_first is not None and sql_first is not None:
            assert (lib_second is None) or (lib_second == lib_first and sql_second == sql_first)
            [ours, theirs] = rows(conn, [lib_first, sql_first])
            key_at = COLUMNS.split(", ").index("idempotency_key")
            assert ours[:key_at] + ours[key_at + 1 :] == theirs[:key_at] + theirs[key_at + 1 :]
    finally:
        conn.rollback()


# A job with dependencies and any fields a dependent may have.
dependent = st.fixed_dictionaries(
    {
        "task": st.from_regex(TASK_NAME, fullmatch=True),
        "depends_on": FIELDS["depends_on"],
    },
    optional={
        name: mostly(FIELDS[name], st.none())
        for name in (
            "payload", "priority", "delay_seconds", "max_attempts", "metadata",
            "on_dependency_failure", "concurrency_key",
        )
    },
)  # fmt: skip


@PROPERTY
@given(job=dependent)
def test_a_dependent_is_planned_as_the_library_plans_it(
    queue: Queue, conn: psycopg.Connection[Any], job: dict[str, Any]
) -> None:
    # Waiting on the queued parent, cancelled or queued by its policy when
    # the dead one is among its parents, refused for an unknown one: alike.
    try:
        [job] = with_parents(conn, [job])
        made = library_enqueue(queue, conn, job)
        sql_id = sql_enqueue_or_none(conn, job)
        assert (made is None) == (sql_id is None), (made, sql_id, job)
        if made is not None and sql_id is not None:
            [ours, theirs] = rows(conn, [made, sql_id])
            event(str(ours[4]))
            assert ours == theirs
            edges = (
                "SELECT array_agg(parent ORDER BY parent) FROM pgqueue_job_deps WHERE child = %s"
            )
            assert (
                conn.execute(edges, [made]).fetchone() == conn.execute(edges, [sql_id]).fetchone()
            )
        else:
            event("refused")
    finally:
        conn.rollback()


def as_json(value: Any) -> Any:
    """A job's field as JSON carries it (a time as RFC 3339 text, with a
    zone or without, or not a time at all)."""
    if isinstance(value, datetime):
        return value.isoformat()
    return value


batch_fields = st.one_of(
    st.sampled_from(["delay", "timeout", "prio"]), st.sampled_from(list(FIELDS))
)
# Dependencies: none given, or refused by both (the SQL takes none).
dependencies = st.fixed_dictionaries(
    {},
    optional={
        "depends_on": st.sampled_from([None, "x", [], [0], [True], ["queued"], ["dead", "queued"]]),
        "on_dependency_failure": st.sampled_from(["cancel", "run", None, "skip", 1]),
    },
)
batch_jobs = st.lists(
    st.tuples(
        jobs,
        st.tuples(
            st.dictionaries(batch_fields, st.one_of(json_values, moments), max_size=2),
            dependencies,
        ).map(lambda both: {**both[0], **both[1]}),
        st.sampled_from([None, "Z", "naive", "+05:30", "junk"]),
    ),
    min_size=1,
    max_size=3,
)


def moment_text(value: Any, form: str | None) -> Any:
    if not isinstance(value, datetime) or form is None:
        return as_json(value)
    if form == "Z":
        return value.isoformat().replace("+00:00", "Z")
    if form == "naive":
        return value.replace(tzinfo=None).isoformat()
    if form == "+05:30":
        return value.astimezone(timezone(timedelta(hours=5, minutes=30))).isoformat()
    return value.isoformat()[:13]


@PROPERTY
@given(batch=batch_jobs)
def test_pgqueue_enqueue_many_takes_and_stores_what_the_library_does(
    queue: Queue,
    conn: psycopg.Connection[Any],
    batch: list[tuple[dict[str, Any], dict[str, Any], str | None]],
) -> None:
    # Any JSON in any field (wrong types too), aliases, unknown fields.
    given_jobs = with_parents(
        conn,
        [
            {name: moment_text(value, form) for name, value in {**job, **extra}.items()}
            for job, extra, form in batch
        ],
    )
    text = json.dumps(given_jobs)
    why = ""
    try:
        try:
            made = queue.enqueue_many(json.loads(text), connection=conn)
        except InvalidJob:
            made = None
        try:
            with conn.transaction():
                row = conn.execute("SELECT pgqueue_enqueue_many(%s::jsonb)", [text]).fetchone()
                sql_ids: list[int] | None = row[0] if row else None
        except errors.InvalidParameterValue as exc:
            sql_ids, why = None, str(exc)
        assert (made is None) == (sql_ids is None), (made, sql_ids, why, text)
        event("refused" if made is None else "taken")
        if made is not None and sql_ids is not None:
            ids = [r.id for r in made]
            keyed = [r[8] is not None for r in rows(conn, ids)]
            for lib_id, sql_id, has_key in zip(ids, sql_ids, keyed, strict=True):
                if has_key:
                    assert sql_id == lib_id
                else:
                    assert rows(conn, [lib_id]) == rows(conn, [sql_id])
    finally:
        conn.rollback()


def boundaries() -> list[tuple[dict[str, Any], bool]]:
    """Jobs at each limit of core/jobs.py and json_text.py, and one past it:
    a limit changed in Python and not in migration 0030 fails here."""
    from pgqueue.core.jobs import (
        MAX_ATTEMPTS,
        MAX_DELAY_SECONDS,
        MAX_KEY_LENGTH,
        MAX_METADATA_BYTES,
        MAX_PRIORITY,
        MAX_TIMEOUT_SECONDS,
    )
    from pgqueue.core.json_text import MAX_JSON_BYTES, MAX_JSON_DEPTH

    cases: list[tuple[dict[str, Any], bool]] = []
    for step in (0, 1):
        cases += [
            (job, not step)
            for job in [
                {"task": "t" * (200 + step)},
                {"task": "t", "queue": "q" * (63 + step)},
                {"task": "t", "priority": MAX_PRIORITY + step},
                {"task": "t", "priority": -MAX_PRIORITY - step},
                {"task": "t", "max_attempts": MAX_ATTEMPTS + step},
                {"task": "t", "max_attempts": 1 - step},
                {"task": "t", "delay_seconds": MAX_DELAY_SECONDS + step},
                {"task": "t", "timeout_seconds": MAX_TIMEOUT_SECONDS + step},
                {"task": "t", "unique_period_seconds": 1 - step / 2},
                {"task": "t", "idempotency_key": "k" * (MAX_KEY_LENGTH + step)},
                {"task": "t", "concurrency_key": "k" * (MAX_KEY_LENGTH + step)},
                {"task": "t", "metadata": {"k": "x" * (MAX_METADATA_BYTES - 8 + step)}},
                {"task": "t", "payload": {"k": "x" * (MAX_JSON_BYTES - 8 + step)}},
                {"task": "t", "payload": nested(MAX_JSON_DEPTH + step)},
            ]
        ]
    return cases


def test_the_limits_are_the_library_limits(queue: Queue, conn: psycopg.Connection[Any]) -> None:
    for job, taken in boundaries():
        fields = dict(job)
        task = fields.pop("task")
        try:
            queue.enqueue(task, fields.pop("payload", None), connection=conn, **fields)
            library_takes = True
        except InvalidJob:
            library_takes = False
        try:
            with conn.transaction():
                sql_enqueue(conn, job)
            sql_takes = True
        except errors.InvalidParameterValue:
            sql_takes = False
        conn.rollback()
        shown = {k: (v if len(repr(v)) < 80 else f"{repr(v)[:40]}...") for k, v in job.items()}
        assert library_takes == sql_takes == taken, shown


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pairs=st.lists(
        st.tuples(
            st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2040, 1, 1)),
            st.one_of(st.floats(1.0, 315360000.0), st.integers(1, 86400)),
        ),
        min_size=1,
        max_size=100,
    )
)
def test_a_period_starts_where_the_library_says(
    conn: psycopg.Connection[Any], pairs: list[tuple[datetime, float]]
) -> None:
    moments = [moment.replace(tzinfo=UTC) for moment, _ in pairs]
    periods = [float(period) for _, period in pairs]
    row = conn.execute(
        "SELECT array_agg(pgqueue_period_start(a, p) ORDER BY n)"
        " FROM unnest(%s::timestamptz[], %s::float8[]) WITH ORDINALITY AS t(a, p, n)",
        [moments, periods],
    ).fetchone()
    assert row is not None
    library = [
        str(_in_period(JobSpec.build("t", unique_period_seconds=p), a.timestamp()).idempotency_key)
        for a, p in zip(moments, periods, strict=True)
    ]
    assert [key.split("@")[1] for key in library] == row[0]
