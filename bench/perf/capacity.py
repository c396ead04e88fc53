"""What one job costs the database: WAL, CPU, commits, fsyncs and disk, per job.

    python -m bench.perf.capacity [--jobs 20000] [--batch 1000] [--single-jobs 2000]
                                  [--repeats 3] [--out PATH]

On a fresh server on disk (fsync and synchronous_commit on, full_page_writes
on, pg_stat_statements loaded), each round runs these phases, one after the
other (interleaved rounds; medians over the rounds):

* ``enqueue_batch``: JOBS jobs by ``Queue.enqueue_many``, BATCH jobs a call
  (COPY, one transaction each);
* ``drain_worker``: those jobs claimed, run (no-op) and acked by one real
  ``AsyncWorker`` process (concurrency 100), started before the phase;
* ``enqueue_batch`` again, then ``drain_pgbench``: the same claim and ack
  statements sent by pgbench (2 clients, claim 100 then ack 100 in two
  transactions; bench.perf.worker_throughput's reference): the database's
  cost with no Python client at all;
* ``enqueue_single``: SINGLE_JOBS jobs by ``Queue.enqueue``, one
  transaction each (the common producer).

Each phase is measured between two snapshots taken by an idle connection
after every client of the phase has disconnected (so that every backend
flushed its statistics):

* WAL bytes: ``pg_current_wal_lsn()`` difference; WAL records and full-page
  images from ``pg_stat_wal``;
* CPU, two views. ``server_cpu_us``: user + system CPU of every process of
  the server, read from /proc (the postmaster's children alive at either
  snapshot, and, through the postmaster's cutime/cstime, those that ended in
  between): backends, WAL writer, checkpointer, autovacuum; the real cost.
  ``statement_exec_us``: pg_stat_statements' total_exec_time of the phase's
  statements: wall time inside the executor (it includes lock and I/O waits,
  and leaves out parsing, the protocol and the commit's WAL flush), by
  statement; shown to say where the time goes, not to add up;
* commits (``pg_stat_database.xact_commit``) and WAL fsyncs
  (``pg_stat_io``, object ``wal``): commits per fsync is group commit at work;
* table + index bytes per job at rest (``pg_total_relation_size`` of
  pgqueue_jobs): after enqueue (queued rows), after the drain (finished rows,
  before retention prunes them).

Also the worker process's own CPU per job (client side, /proc). Writes
results/capacity.json; docs/scaling.md turns it into a capacity model.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from typing import Any

import psycopg

from bench.common import (
    TICKS,
    bench_database,
    bench_server,
    clear,
    postmaster_pid,
    proc_stat,
    server_cpu_seconds,
    summary,
)
from bench.perf.standby import set_synchronous, streaming_standby
from bench.perf.worker_throughput import BATCH, CLIENTS, pgbench_drain
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import DRAIN_TIMEOUT, async_workers
from pgqueue import Queue, Settings, migrate
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.sql import QUERIES

Admin = psycopg.Connection[tuple[Any, ...]]
PGSS = "pg_stat_statements"
TOP = 6


# -- the server's processes -------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS


# -- snapshots ----------------------------------------------------------------------------


def has_pgss(admin: Admin) -> bool:
    """Whether pg_stat_statements is loaded (not on a DATABASE_URL server without it)."""
    loaded = admin.execute("SHOW shared_preload_libraries").fetchone()[0]  # type: ignore[index]
    if PGSS not in loaded:
        return False
    admin.execute(f"CREATE EXTENSION IF NOT EXISTS {PGSS}")
    return True


def snapshot(admin: Admin, postmaster: int, pgss: bool, standby: int | None) -> dict[str, Any]:
    admin.execute("SELECT pg_stat_clear_snapshot()")
    row = admin.execute(
        "SELECT pg_current_wal_lsn(), w.wal_records, w.wal_fpi, d.xact_commit,"
        " (SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal')"
        " FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()"
    ).fetchone()
    assert row is not None
    taken = {
        "lsn": row[0],
        "wal_records": int(row[1]),
        "wal_fpi": int(row[2]),
        "commits": int(row[3]),
        "wal_fsyncs": int(row[4]),
        "cpu_seconds": server_cpu_seconds(postmaster),
    }
    if pgss:
        taken["statements"] = statement_times(admin)
    if standby is not None:
        taken["standby_cpu_seconds"] = server_cpu_seconds(standby)
    return taken


def _head(sql: str) -> str:
    """A statement's words up to its first parameter or constant: what
    pg_stat_statements keeps of it unchanged (it numbers the constants too)."""
    return " ".join(re.split(r"[$%']", sql, maxsplit=1)[0].split())


HEADS = sorted(((_head(sql), name) for name, sql in QUERIES.items()), key=lambda h: -len(h[0]))


def statement_name(query: str) -> str:
    """The QUERIES name of a statement (the longest head it starts with),
    else its first words (pgbench's claim, our own snapshots)."""
    words = " ".join(query.split())
    found = next((name for head, name in HEADS if words.startswith(head)), None)
    return found or " ".join(query.split()[:4])


def statement_times(admin: Admin) -> dict[str, tuple[float, int]]:
    """Total exec time (ms) and calls so far of each statement, by its name
    in QUERIES (others: their first words, e.g. pgbench's claim and COPY)."""
    found: dict[str, tuple[float, int]] = {}
    for query, ms, calls in admin.execute(
        f"SELECT query, total_exec_time, calls FROM {PGSS} WHERE dbid ="
        " (SELECT oid FROM pg_database WHERE datname = current_database())"
    ):
        name = statement_name(query)
        total, count = found.get(name, (0.0, 0))
        found[name] = (total + float(ms), count + int(calls))
    return found


def per_job(
    admin: Admin, before: dict[str, Any], after: dict[str, Any], jobs: int
) -> dict[str, Any]:
    """The difference of two snapshots, per job."""
    wal = admin.execute("SELECT %s::pg_lsn - %s::pg_lsn", (after["lsn"], before["lsn"])).fetchone()
    assert wal is not None
    cost: dict[str, Any] = {
        "wal_bytes": float(wal[0]) / jobs,
        "wal_records": (after["wal_records"] - before["wal_records"]) / jobs,
        "wal_fpi": (after["wal_fpi"] - before["wal_fpi"]) / jobs,
        "commits": (after["commits"] - before["commits"]) / jobs,
        "wal_fsyncs": (after["wal_fsyncs"] - before["wal_fsyncs"]) / jobs,
        "server_cpu_us": (after["cpu_seconds"] - before["cpu_seconds"]) * 1e6 / jobs,
    }
    if "standby_cpu_seconds" in after:
        spent = after["standby_cpu_seconds"] - before["standby_cpu_seconds"]
        cost["standby_cpu_us"] = spent * 1e6 / jobs
    if "statements" in after:
        cost["statement_exec_us"] = statement_costs(before["statements"], after["statements"], jobs)
    return cost


def statement_costs(
    before: dict[str, tuple[float, int]], after: dict[str, tuple[float, int]], jobs: int
) -> dict[str, float]:
    """Exec µs per job of the statements that ran, the TOP most costly."""
    spent = {
        name: (ms - before.get(name, (0.0, 0))[0]) * 1000 / jobs
        for name, (ms, calls) in after.items()
        if calls > before.get(name, (0.0, 0))[1]
    }
    return dict(sorted(spent.items(), key=lambda item: -item[1])[:TOP])


@contextmanager
def measured(
    admin: Admin, servers: tuple[int, int | None], pgss: bool, jobs: int, into: dict[str, Any]
) -> Iterator[None]:
    """Fill ``into`` with the per-job cost of the block (snapshots around
    it) on ``servers``: the primary's postmaster, the standby's (or None)."""
    before = snapshot(admin, servers[0], pgss, servers[1])
    started = time.perf_counter()
    yield
    seconds = time.perf_counter() - started
    time.sleep(0.5)  # the phase's backends exit, flushing their statistics
    into.update(per_job(admin, before, snapshot(admin, servers[0], pgss, servers[1]), jobs))
    into["seconds"] = seconds
    into["wall_us"] = seconds * 1e6 / jobs


def table_bytes_per_job(admin: Admin, jobs: int) -> float:
    size = admin.execute("SELECT pg_total_relation_size('pgqueue_jobs')").fetchone()[0]  # type: ignore[index]
    return float(size) / jobs


# -- phases --------------------------------------------------------------------------------


def wait_succeeded(admin: Admin, jobs: int, procs: Sequence[BaseProcess]) -> None:
    """Until ``jobs`` jobs succeeded, by the counters: a few rows, so that
    the wait costs the server next to nothing (bench.workers.wait_drained
    counts the jobs table, which would be part of the drain's figures)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    query = "SELECT coalesce(sum(succeeded), 0) FROM pgqueue_counters"
    while admin.execute(query).fetchone()[0] < jobs:  # type: ignore[index]
        if time.monotonic() > deadline or not any(p.is_alive() for p in procs):
            raise RuntimeError("the worker did not finish the jobs")
        time.sleep(0.1)


def enqueue_batches(url: str, jobs: int, batch: int) -> None:
    with Queue(url, settings=Settings(database_url=url, pool_min_size=0, pool_max_size=1)) as q:
        for _ in range(jobs // batch):
            q.enqueue_many([{"task": "noop"}] * batch)


def enqueue_single(url: str, jobs: int) -> None:
    with Queue(url, settings=Settings(database_url=url, pool_min_size=0, pool_max_size=1)) as q:
        for _ in range(jobs):
            q.enqueue("noop")


class Round:
    """One round of every phase on one database; ``costs`` by phase."""

    def __init__(
        self, url: str, admin: Admin, args: argparse.Namespace, standby: int | None = None
    ) -> None:
        self.url, self.admin, self.args = url, admin, args
        self.servers = (postmaster_pid(admin), standby)
        self.pgss = has_pgss(admin)
        self.costs: dict[str, dict[str, Any]] = {}
        self.phase = ""

    def measure(self, phase: str, jobs: int, work: Callable[[], None]) -> dict[str, Any]:
        cost = self.costs.setdefault(phase, {})
        self.phase = phase
        if self.pgss:
            self.admin.execute(f"SELECT {PGSS}_reset()")
        with measured(self.admin, self.servers, self.pgss, jobs, cost):
            work()
        return cost

    def run(self) -> dict[str, dict[str, Any]]:
        jobs = self.args.jobs
        clear(self.url)
        enqueue = self.measure("enqueue_batch", jobs, self._enqueue_batches)
        enqueue["table_bytes_queued"] = table_bytes_per_job(self.admin, jobs)
        for drain in ("worker", "pgbench"):
            if drain != "worker":
                clear(self.url)
                self._enqueue_batches()
            cost = self.measure(f"drain_{drain}", jobs, getattr(self, f"_drain_{drain}"))
            cost["table_bytes_finished"] = table_bytes_per_job(self.admin, jobs)
        clear(self.url)
        self.measure("enqueue_single", self.args.single_jobs, self._enqueue_single)
        return self.costs

    def run_standby(self, mode: str) -> dict[str, dict[str, Any]]:
        """The phases whose commits a synchronous standby slows: single
        enqueues (a commit each) and the worker's drain."""
        set_synchronous(self.admin, mode == "sync")
        clear(self.url)
        self.measure(f"enqueue_single_{mode}_standby", self.args.single_jobs, self._enqueue_single)
        clear(self.url)
        self._enqueue_batches()
        self.measure(f"drain_worker_{mode}_standby", self.args.jobs, self._drain_worker)
        return self.costs

    def _enqueue_batches(self) -> None:
        enqueue_batches(self.url, self.args.jobs, self.args.batch)

    def _enqueue_single(self) -> None:
        enqueue_single(self.url, self.args.single_jobs)

    def _drain_pgbench(self) -> None:
        pgbench_drain(self.url, self.args.jobs, bare=False)

    def _drain_worker(self) -> None:
        settings = Settings(database_url=self.url, concurrency=100)
        with async_workers(1, settings, name="capacity") as procs:
            wait_succeeded(self.admin, self.args.jobs, procs)
            worker_cpu = process_cpu_seconds(procs[0].pid or 0)
        self.costs[self.phase]["worker_process_cpu_us"] = worker_cpu * 1e6 / self.args.jobs


# -- main ------------------------------------------------------------------------------------


def medians(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per phase and figure: median, min and max over the rounds."""
    table: dict[str, dict[str, Any]] = {}
    for phase in rounds[0]:
        runs = [r[phase] for r in rounds]
        row: dict[str, Any] = {}
        for key, value in runs[0].items():
            if isinstance(value, dict):  # by statement: the top ones differ a little by round
                names = dict.fromkeys(name for run in runs for name in run[key])
                row[key] = {k: summary([run[key].get(k, 0.0) for run in runs]) for k in names}
            else:
                row[key] = summary([run[key] for run in runs])
        table[phase] = row
    return table


def derived(table: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The capacity model's inputs: server CPU µs of one job's path
    (enqueue + claim + ack), and what one PostgreSQL core sustains."""
    cpu = {phase: row["server_cpu_us"]["median"] for phase, row in table.items()}
    wal = {phase: row["wal_bytes"]["median"] for phase, row in table.items()}
    model: dict[str, float] = {}
    for enqueue in ("enqueue_batch", "enqueue_single"):
        for drain in ("drain_worker", "drain_pgbench"):
            name = f"{enqueue}+{drain}"
            model[f"cpu_us_per_job[{name}]"] = cpu[enqueue] + cpu[drain]
            model[f"jobs_per_second_per_core[{name}]"] = 1e6 / (cpu[enqueue] + cpu[drain])
            model[f"wal_bytes_per_job[{name}]"] = wal[enqueue] + wal[drain]
    return model


def show(repeat: int, costs: dict[str, dict[str, Any]]) -> None:
    for phase, cost in costs.items():
        print(
            f"round {repeat + 1} {phase:>28}: {cost['wal_bytes']:6,.0f} WAL B/job "
            f"{cost['server_cpu_us']:6,.1f} server CPU us/job {cost['wall_us']:7,.1f} us/job "
            f"{cost['commits']:6.3f} transactions/job {cost['wal_fsyncs']:6.3f} fsyncs/job",
            flush=True,
        )


@contextmanager
def database(standby: bool) -> Iterator[tuple[str, EmbeddedPostgres | None]]:
    """The run's database (with pg_stat_statements), and its server when
    the run needs its own (for a standby)."""
    options = {"shared_preload_libraries": PGSS}
    if not standby:
        # Without pg_stat_statements (a DATABASE_URL's server may not load
        # it) the phases' costs come from /proc and the statistics views.
        with bench_database("capacity", options, required=False) as url:
            yield url, None
        return
    with bench_server("capacity", options) as server:
        migrate(server.url)
        yield server.url, server


def standby_rounds(
    server: EmbeddedPostgres, admin: Admin, args: argparse.Namespace
) -> list[dict[str, dict[str, Any]]]:
    """Rounds of the commit-bound phases with an asynchronous, then a
    synchronous standby (interleaved by round)."""
    rounds = []
    with streaming_standby(server) as standby:
        for repeat in range(args.repeats):
            costs: dict[str, dict[str, Any]] = {}
            for mode in ("async", "sync"):
                costs |= Round(server.url, admin, args, standby).run_standby(mode)
            show(repeat, costs)
            rounds.append(costs)
        set_synchronous(admin, False)
    return rounds


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--single-jobs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--standby", action="store_true", help="also with a streaming standby (own server only)"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.jobs % (CLIENTS * BATCH) or args.jobs % args.batch:
        parser.error(f"--jobs must be a multiple of {CLIENTS * BATCH} and of --batch")
    rounds = []
    with database(args.standby) as (url, server), psycopg.connect(url, autocommit=True) as admin:
        info = server_info(url)
        for repeat in range(args.repeats):
            rounds.append(Round(url, admin, args).run())
            show(repeat, rounds[-1])
        with_standby = standby_rounds(server, admin, args) if server is not None else []
    table = medians(rounds)
    results = {"per_job": table, "model": derived(table), "rounds": rounds}
    if with_standby:
        results |= {"per_job_with_standby": medians(with_standby), "standby_rounds": with_standby}
    record = ResultRecord(
        name="capacity",
        command=command_line(__spec__, argv),
        server=info,
        parameters=vars(args) | {"worker_concurrency": 100, "pgbench_clients": CLIENTS},
        results=results,
    )
    path = write_result(record, args.out)
    for name, value in record.results["model"].items():
        print(f"{name:>60}: {value:,.1f}")
    print(f"written to {path}")
    return record


if __name__ == "__main__":
    main()
