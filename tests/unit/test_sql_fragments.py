"""queries.sql's fragments (pgqueue/sql/__init__.py): lines several
statements share, written once and put in place of each ``--> name``."""

from __future__ import annotations

import pytest

from pgqueue.sql import QUERIES, parse

TEXT = """
-- fragment: by_queue
-- Comments of a fragment stay in the file.
      AND queue = %(queue)s

-- name: a_read
-- Its comment.
SELECT id FROM t
WHERE true
    --> by_queue
ORDER BY id;

-- name: another_read
SELECT count(*) FROM t WHERE true
  --> by_queue
"""


def test_a_fragment_stands_in_each_statement_that_names_it() -> None:
    assert parse(TEXT) == {
        "a_read": "SELECT id FROM t\nWHERE true\n      AND queue = %(queue)s\nORDER BY id",
        "another_read": "SELECT count(*) FROM t WHERE true\n      AND queue = %(queue)s",
    }


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (TEXT + "\n-- name: a_read\nSELECT 1;\n", "'a_read' is defined twice"),
        (TEXT + "\n-- name: by_queue\nSELECT 1;\n", "'by_queue' is defined twice"),
        (TEXT + "\n-- name: third\nSELECT 1\n--> by_task\n", "no fragment named 'by_task'"),
        (TEXT + "\n-- fragment: by_task\n  AND task = 't'\n", "no statement uses: by_task"),
    ],
)
def test_a_name_twice_an_unknown_fragment_or_an_unused_one_is_refused(
    text: str, error: str
) -> None:
    with pytest.raises(RuntimeError, match=error):
        parse(text)


def test_no_statement_of_pgqueue_keeps_a_fragments_marker_or_a_comment() -> None:
    for name, query in QUERIES.items():
        assert "-->" not in query and not any(
            line.lstrip().startswith("--") for line in query.splitlines()
        ), name
