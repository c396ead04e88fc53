"""PostgreSQL failover under load, with a real HA engine (tests/ha.py:
Patroni and etcd, two nodes in network namespaces, synchronous replication).

The clients get only the cluster's multi-host URL
(``target_session_attrs=read-write``) and ordinary settings; the primary's
postmaster is SIGKILLed mid-run, Patroni promotes the synchronous standby,
and the ledger (harness/failover.py) checks what every client was told
against what the new primary holds. This is bench/faults/failover.py at its
smallest; the full run adds partitions, several failovers and asynchronous
replication.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.faults.failover import run_cluster
from pgqueue import Queue, Settings, migrate
from pgqueue.core.errors import DatabaseUnavailable
from tests.netns import network, postgres_on

pytestmark = pytest.mark.acceptance

# The API gives up on a write after 1 s (the library's producers keep the
# default 5 s and ride the failover out): its answers during the outage show
# what a client of the API sees.
API_SETTINGS = {"enqueue_retry_seconds": 1.0}
REASONS = {
    "503 database_unavailable",
    "503 database_read_only",
    "503 enqueue_outcome_unknown",  # a commit went out unanswered: the job may exist
}


@pytest.mark.timeout(240)
def test_a_killed_primary_fails_over_to_the_synchronous_standby_and_no_acknowledged_job_is_lost(
    server_dir: Path,
) -> None:
    """bench/faults/failover.py at its smallest: one cluster, one SIGKILL."""
    run = run_cluster(True, ["kill"], 1, server_dir / "logs", api_settings=API_SETTINGS)
    assert run["exit_codes"] == [0] * 5  # the API and the 4 workers stopped cleanly
    assert (run["missing"], run["reverted"], run["unfinished"]) == (0, 0, 0)
    # A library call refused with "nothing was written" wrote nothing.
    assert run["written_though_refused"] == 0
    assert run["enqueued"] > 0 and run["completions_seen"] > 0
    assert run["invariants"]["ok"], run["invariants"]
    # The API answered every request: 201, or 503 with its reason; never a 500.
    assert set(run["http"]) <= {"201", *REASONS}, run["http"]
    assert run["http"]["201"] > 0 and run["http_503_without_retry_after"] == 0
    # The writes did stop, for a few seconds, and came back on their own.
    [fault] = run["faults"]
    assert 0 < fault["write_outage_s"] < 60
    assert fault["recovery_to_90pct_s"] is not None


@pytest.mark.timeout(120)
def test_a_producer_whose_server_vanishes_gives_up_at_its_deadline_instead_of_hanging(
    server_dir: Path,
) -> None:
    """A primary cut off by a partition sends nothing back, not even a reset:
    a pooled connection's statement would wait for the kernel's ~15 minutes
    of retransmissions. tcp_user_timeout (driver.LIVENESS) ends it."""
    with network(["db"]) as net, postgres_on(net, "db", server_dir) as url:
        migrate(url)
        with Queue(settings=Settings(database_url=url, enqueue_retry_seconds=2)) as queue:
            queue.enqueue("work")  # the pool's connection is open, and idle
            net.partition("db")
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable):
                queue.enqueue("work")
            waited = time.monotonic() - started
            net.heal("db")
    # The statement's 10 s of unacknowledged packets, then the call's deadline.
    assert waited < 60
