"""pgqueue in a Django project (tests/integration/integrations/django_project): enqueue
inside Django's transaction.atomic, the management commands that migrate
and run the worker, settings from Django's settings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

PROJECT = Path(__file__).resolve().parent / "django_project"
ROOT = PROJECT.parents[3]

SCENARIO = """
from django.db import connection, transaction
from pgqueue.integrations.django import enqueue, settings

with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE orders (id integer PRIMARY KEY)")
try:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO orders VALUES (1)")
        enqueue("receipt", {"order": 1})
        raise RuntimeError("the order fails after its job was enqueued")
except RuntimeError:
    pass
with transaction.atomic():
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO orders VALUES (2)")
    enqueue("receipt", {"order": 2})
print("poll", settings().poll_interval_seconds)
"""


def _manage(url: str, *args: str, **options: Any) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env |= {"SHOP_DATABASE_URL": url, "PYTHONPATH": os.pathsep.join([str(PROJECT), str(ROOT)])}
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **options,
    )


def _done(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out


def test_a_django_project_enqueues_in_its_transactions_and_runs_the_worker(
    empty_db: str,
) -> None:
    assert "applied: 0001_jobs" in _done(_manage(empty_db, "pgqueue_migrate"))
    assert "poll 0.2" in _done(_manage(empty_db, "shell", "-c", SCENARIO))
    with psycopg.connect(empty_db, autocommit=True) as sql:
        assert sql.execute("SELECT id FROM orders").fetchall() == [(2,)]
        [(job_id, payload)] = sql.execute("SELECT id, payload FROM pgqueue_jobs").fetchall()
        assert payload == {"order": 2}  # the rolled-back order left no job
        worker = _manage(empty_db, "pgqueue_worker")
        try:
            deadline = time.monotonic() + 60
            while sql.execute(
                "SELECT state FROM pgqueue_jobs WHERE id = %s", (job_id,)
            ).fetchone() != ("succeeded",):
                assert worker.poll() is None and time.monotonic() < deadline, worker.stdout
                time.sleep(0.1)
        finally:
            worker.send_signal(signal.SIGTERM)
        _done(worker)
        row = sql.execute("SELECT result FROM pgqueue_jobs WHERE id = %s", (job_id,)).fetchone()
        assert row == ({"sent_for": 2},)
