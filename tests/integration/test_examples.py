"""The README's quick start runs as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_runs_and_its_job_succeeds(db_url: str, sql: psycopg.Connection) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        env={"DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "{'sent': True}"
    counts = dict(sql.execute("SELECT task, count(*) FROM pgqueue_jobs GROUP BY task").fetchall())
    assert counts == {"send_email": 1, "resize": 1000, "send_receipt": 1}
    assert sql.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
