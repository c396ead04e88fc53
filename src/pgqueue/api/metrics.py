"""GET /metrics: Prometheus text from one database snapshot.

Small reads in one REPEATABLE READ READ ONLY transaction (so they agree
with each other and share one now()):

    queue_stats               live jobs per queue: the partial indexes of
                              queued and running rows, never the history
    counters_totals           outcome counters, written by the transitions
                              themselves, so pruning does not lower them
    start_latency_histogram   enqueue-to-start buckets, written at claim
    worker_list               the workers registry (one row per worker process)
    queue_controls            the queues' controls (their latency objectives)
    key_objective_list        the per-key latency objectives, each with its
                              key's wait (a probe per declared key)

None of them reads finished jobs, so a scrape costs the same with a million
of them in the table as with none (bench/metrics_history.py).

Metrics:

    pgqueue_jobs{queue,state}                 gauge: queued (runnable now),
                                              scheduled (waiting for run_at), running,
                                              waiting (for the jobs they depend on)
    pgqueue_queue_lag_seconds{queue}          gauge: age of the oldest runnable job
    pgqueue_queue_start_lag_objective_seconds{queue}
                                              gauge: the queue's latency objective
                                              (max_start_lag_seconds; only queues
                                              that have one)
    pgqueue_queue_start_lag_shortfall_seconds{queue}
                                              gauge: how far the oldest runnable job's
                                              wait is past that objective (0: within it)
    pgqueue_key_start_lag_objective_seconds{queue,key}
                                              gauge: a key's latency objective in a fair
                                              queue (only the keys declared: operators
                                              choose them, so the series stay few)
    pgqueue_key_start_lag_shortfall_seconds{queue,key}
                                              gauge: how far the key's next job's wait is
                                              past it (0: within it)
    pgqueue_jobs_completed_total{queue,state} counter: jobs that ended succeeded,
                                              dead or cancelled
    pgqueue_job_failures_total{queue}         counter: failed attempts (handler
                                              errors and expired leases)
    pgqueue_job_snoozes_total{queue}          counter: snoozes handlers asked for
                                              (not failures, not attempts)
    pgqueue_enqueue_to_start_seconds{queue}   histogram: from when the job became
                                              runnable to its claim
    pgqueue_workers{queue}                    gauge: live worker processes that claim
                                              from the queue
    pgqueue_worker_last_seen_seconds{worker}  gauge: since each registered worker's
                                              last heartbeat (a killed one's grows
                                              until maintenance prunes its row)
    pgqueue_worker_stalled{worker}            gauge: 1 for a live worker with free
                                              slots that has not claimed waiting work

The histogram's buckets are ``Settings.latency_buckets`` of the workers that
recorded them; the API must run with the same setting.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ..core import key_objectives, workers
from ..core.flows import Flow, Statement
from ..core.key_objectives import KeyObjective
from ..core.workers import WorkerRow

__all__ = ["LIVE_STATES", "Snapshot", "render", "snapshot"]

Row = dict[str, Any]
LIVE_STATES = ("queued", "scheduled", "running", "waiting")
COMPLETED_STATES = ("succeeded", "dead", "cancelled")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one scrape read, at one moment."""

    stats: list[Row]
    counters: list[Row]
    latency: list[Row]
    workers: list[WorkerRow] = field(default_factory=list)
    objectives: dict[str, float] = field(default_factory=dict)
    key_objectives: list[KeyObjective] = field(default_factory=list)

    def queues(self) -> list[str]:
        """Every queue that has live jobs or has ever counted an outcome."""
        names = {r["queue"] for r in self.stats} | {r["queue"] for r in self.counters}
        names |= {r["queue"] for r in self.latency}
        return sorted(names)


def snapshot() -> Flow[Snapshot]:
    """Read the three tables in one read-only snapshot. Run it with
    ``transaction=True``: snapshot_begin must open the transaction."""
    yield Statement("snapshot_begin", {})
    stats = yield Statement("queue_stats", {})
    counters = yield Statement("counters_totals", {})
    latency = yield Statement("start_latency_histogram", {})
    alive = yield from workers.list_workers()
    controls = yield Statement("queue_controls", {})
    objectives = {
        row["name"]: float(row["max_start_lag_seconds"])
        for row in controls
        if row["max_start_lag_seconds"] is not None
    }
    keys = yield from key_objectives.read()
    return Snapshot(stats, counters, latency, alive, objectives, keys)


class _SnapshotCollector:
    def __init__(self, snap: Snapshot, bounds: Sequence[float]) -> None:
        self.snap = snap
        self.bounds = tuple(bounds)

    def collect(self) -> Iterator[Metric]:
        queues = self.snap.queues()
        stats = {r["queue"]: r for r in self.snap.stats}
        counters = {r["queue"]: r for r in self.snap.counters}

        jobs = GaugeMetricFamily(
            "pgqueue_jobs",
            "Jobs in a live state (finished outcomes are the _total counters).",
            labels=["queue", "state"],
        )
        lag = GaugeMetricFamily(
            "pgqueue_queue_lag_seconds",
            "Age of the oldest runnable job (0 when none waits).",
            labels=["queue"],
        )
        completed = CounterMetricFamily(
            "pgqueue_jobs_completed", "Jobs that ended, by final state.", labels=["queue", "state"]
        )
        failures = CounterMetricFamily(
            "pgqueue_job_failures",
            "Failed attempts (handler errors and expired leases), retried or not.",
            labels=["queue"],
        )
        snoozes = CounterMetricFamily(
            "pgqueue_job_snoozes",
            "Snoozes handlers asked for (Snooze): attempts given back, not failures.",
            labels=["queue"],
        )
        for queue in queues:
            live = stats.get(queue, {})
            for state in LIVE_STATES:
                jobs.add_metric([queue, state], float(live.get(state, 0)))
            lag.add_metric([queue], float(live.get("oldest_runnable_seconds", 0.0)))
            totals = counters.get(queue, {})
            for state in COMPLETED_STATES:
                completed.add_metric([queue, state], float(totals.get(state, 0)))
            failures.add_metric([queue], float(totals.get("failed", 0)))
            snoozes.add_metric([queue], float(totals.get("snoozed", 0)))
        yield from (jobs, lag, completed, failures, snoozes, self._histogram(queues))
        yield from self._objectives(stats)
        yield from self._workers(queues)

    def _objectives(self, stats: dict[str, Row]) -> Iterator[Metric]:
        """Each queue's latency objective, and how far its oldest runnable
        job's wait (the database's clock) is past it; each declared key's
        objective, and how far its next job's wait is past it."""
        objective = GaugeMetricFamily(
            "pgqueue_queue_start_lag_objective_seconds",
            "The queue's latency objective: the longest a runnable job should wait to start.",
            labels=["queue"],
        )
        shortfall = GaugeMetricFamily(
            "pgqueue_queue_start_lag_shortfall_seconds",
            "How far the oldest runnable job's wait is past the queue's latency objective "
            "(0: within it).",
            labels=["queue"],
        )
        for queue, seconds in sorted(self.snap.objectives.items()):
            lag = float(stats.get(queue, {}).get("oldest_runnable_seconds", 0.0))
            objective.add_metric([queue], seconds)
            shortfall.add_metric([queue], max(0.0, lag - seconds))
        key_objective = GaugeMetricFamily(
            "pgqueue_key_start_lag_objective_seconds",
            "A key's latency objective in a fair queue: the longest its runnable jobs should "
            "wait to start.",
            labels=["queue", "key"],
        )
        key_shortfall = GaugeMetricFamily(
            "pgqueue_key_start_lag_shortfall_seconds",
            "How far the key's next job's wait is past its latency objective (0: within it).",
            labels=["queue", "key"],
        )
        for declared in self.snap.key_objectives:
            labels = [declared.queue, declared.key]
            key_objective.add_metric(labels, declared.max_start_lag_seconds)
            key_shortfall.add_metric(labels, declared.shortfall_seconds)
        yield from (objective, shortfall, key_objective, key_shortfall)

    def _workers(self, queues: Sequence[str]) -> Iterator[Metric]:
        live = [w for w in self.snap.workers if w.alive]
        per_queue = GaugeMetricFamily(
            "pgqueue_workers", "Live worker processes that claim from the queue.", labels=["queue"]
        )
        for queue in queues:
            serving = [w for w in live if w.queues is None or queue in w.queues]
            per_queue.add_metric([queue], float(len(serving)))
        last_seen = GaugeMetricFamily(
            "pgqueue_worker_last_seen_seconds",
            "Seconds since each registered worker's last heartbeat.",
            labels=["worker"],
        )
        stalled = GaugeMetricFamily(
            "pgqueue_worker_stalled",
            "1 when a live worker with free slots has not claimed work that waits.",
            labels=["worker"],
        )
        for worker in self.snap.workers:
            last_seen.add_metric([worker.name], worker.last_seen_seconds)
            if worker.alive:
                stalled.add_metric([worker.name], 1.0 if worker.stalled else 0.0)
        yield from (per_queue, last_seen, stalled)

    def _histogram(self, queues: Sequence[str]) -> HistogramMetricFamily:
        """Bucket k of the table (width_bucket over the bounds) holds waits in
        [bound k-1, bound k); Prometheus buckets are cumulative, so le=bound j
        is the sum of table buckets 0..j, and +Inf is everything."""
        family = HistogramMetricFamily(
            "pgqueue_enqueue_to_start_seconds",
            "Seconds from when a job became runnable (enqueue, or run_at) to its claim.",
            labels=["queue"],
        )
        n = len(self.bounds)
        per_queue: dict[str, tuple[list[int], float]] = {q: ([0] * (n + 1), 0.0) for q in queues}
        for row in self.snap.latency:
            counts, total = per_queue[row["queue"]]
            counts[min(max(int(row["bucket"]), 0), n)] += int(row["count"])
            per_queue[row["queue"]] = (counts, total + float(row["sum_seconds"] or 0.0))
        for queue in queues:
            counts, total = per_queue[queue]
            cumulative, buckets = 0, []
            for bound, count in zip(self.bounds, counts, strict=False):
                cumulative += count
                buckets.append((_le(bound), float(cumulative)))
            buckets.append(("+Inf", float(sum(counts))))
            family.add_metric([queue], buckets, total)
        return family


def _le(bound: float) -> str:
    return repr(float(bound))


def render(snap: Snapshot, bounds: Sequence[float]) -> bytes:
    """The text exposition of one snapshot, from a registry made for it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snap, bounds))
    return generate_latest(registry)
