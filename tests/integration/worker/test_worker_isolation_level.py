"""The worker's sessions run at READ COMMITTED whatever the database's
default_transaction_isolation says (its claim relies on it: under
SERIALIZABLE a claim of a row another claim took meanwhile fails instead of
skipping it), except behind a transaction-mode pooler, where a session's
setting would outlive it."""

from __future__ import annotations

import psycopg
import pytest

from pgqueue.db.worker_connection import Connection


@pytest.mark.parametrize(
    ("direct", "expected"), [(True, "read committed"), (False, "serializable")]
)
async def test_a_worker_session_is_read_committed_on_a_serializable_database(
    db_url: str, direct: bool, expected: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(
            f"ALTER DATABASE {admin.info.dbname} SET default_transaction_isolation = 'serializable'"
        )
    connection = Connection(db_url, prepare=direct)
    await connection.open()
    try:
        assert connection._conn is not None
        row = await (await connection._conn.execute("SHOW transaction_isolation")).fetchone()
        assert row == (expected,)
    finally:
        await connection.close()
