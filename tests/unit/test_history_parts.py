"""History's pure parts: the shape of the statements that write a job's
failed attempts, and the per-minute points made from counter snapshots."""

from __future__ import annotations

import re

from pgqueue.sql import QUERIES


def _update_of(name: str) -> str:
    match = re.search(r"UPDATE pgqueue_jobs j\s+SET(.*?)RETURNING", QUERIES[name], re.DOTALL)
    assert match, name
    return match.group(1)


def test_every_statement_that_records_a_failure_appends_its_history_in_the_same_update() -> None:
    """A failure whose history was not written cannot exist: each statement
    that sets last_error for a failed attempt appends to errors in the same
    UPDATE (the only other writer of last_error is a handler's cancel)."""
    writers = {name for name, text in QUERIES.items() if re.search(r"\blast_error\s*=", text)}
    assert writers == {"job_finish", "job_reap", "job_cancel_held"}
    for name in ("job_finish", "job_reap"):
        assert re.search(r"\berrors\s*=.*pgqueue_errors_append\(", _update_of(name), re.DOTALL)
    assert "errors" not in _update_of("job_cancel_held").replace("last_error", "")
