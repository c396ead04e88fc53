"""An open-loop producer: jobs enqueued on a fixed schedule, whatever the
workers do, so that a slow worker meets a growing backlog instead of a
producer that politely waits for it (a closed loop hides queueing delay).

The schedule is a batch every ``tick`` seconds (default 10 ms; sizes
rounded so that the total follows ``per_second`` exactly), shared round-robin by ``producers``
threads, each on its own connection, so that one batch's commit (a WAL
flush) does not hold back the next. A batch that starts late is sent at
once and the schedule is not shifted; how late each started is reported,
and ``Production.kept_up`` says whether the offered rate was really offered.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from dataclasses import dataclass

from pgqueue import Queue, Settings

__all__ = ["Production", "open_loop"]

# A producer is "behind" when the achieved rate falls short of the target by more.
KEPT_UP = 0.98


@dataclass(frozen=True)
class Production:
    """What the producer did: the target, what it achieved, and how late
    batches started against the schedule (ms)."""

    target_per_second: float
    jobs: int
    seconds: float
    batches: int
    late_batches: int  # started more than one tick after their time
    behind_p99_ms: float
    behind_max_ms: float
    # How long one batch's enqueue took (client clock): its jobs' run_at is
    # the transaction's start, so this much of their latency is the producer's.
    enqueue_p50_ms: float
    enqueue_p99_ms: float

    @property
    def achieved_per_second(self) -> float:
        return self.jobs / self.seconds

    @property
    def kept_up(self) -> bool:
        return self.achieved_per_second >= KEPT_UP * self.target_per_second

    def as_dict(self) -> dict[str, float | int | bool]:
        return {
            "target_per_second": round(self.target_per_second, 1),
            "achieved_per_second": round(self.achieved_per_second, 1),
            "producer_kept_up": self.kept_up,
            "jobs": self.jobs,
            "batches": self.batches,
            "late_batches": self.late_batches,
            "behind_p99_ms": round(self.behind_p99_ms, 2),
            "behind_max_ms": round(self.behind_max_ms, 2),
            "enqueue_p50_ms": round(self.enqueue_p50_ms, 2),
            "enqueue_p99_ms": round(self.enqueue_p99_ms, 2),
        }


def _sizes(per_second: float, tick: float, batches: int) -> list[int]:
    """Batch sizes whose running total stays within one job of the schedule."""
    totals = [round(per_second * tick * k) for k in range(batches + 1)]
    return [b - a for a, b in itertools.pairwise(totals)]


def open_loop(
    url: str,
    task: str,
    per_second: float,
    seconds: float,
    *,
    producers: int = 4,
    tick: float = 0.01,
) -> Production:
    """Enqueue jobs of ``task`` at ``per_second`` for ``seconds`` (plain
    jobs, ``enqueue_many``: one COPY and one commit per batch)."""
    sizes = _sizes(per_second, tick, max(1, round(seconds / tick)))
    behind: list[float] = [0.0] * len(sizes)
    took: list[float] = [0.0] * len(sizes)
    errors: list[BaseException] = []
    start = time.monotonic() + 0.2  # every thread connected and waiting

    def produce(first: int) -> None:
        settings = Settings(database_url=url, pool_min_size=1, pool_max_size=1)
        try:
            with Queue(url, settings=settings) as q:
                for k in range(first, len(sizes), producers):
                    due = start + k * tick
                    if (pause := due - time.monotonic()) > 0:
                        time.sleep(pause)
                    began = time.monotonic()
                    behind[k] = max(0.0, began - due)
                    if sizes[k]:
                        q.enqueue_many([{"task": task}] * sizes[k])
                    took[k] = time.monotonic() - began
        except BaseException as exc:  # re-raised by the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    late = _ms(behind)
    enqueue = _ms(took)
    return Production(
        target_per_second=per_second,
        jobs=sum(sizes),
        seconds=time.monotonic() - start,
        batches=len(sizes),
        late_batches=sum(1 for b in behind if b > tick),
        behind_p99_ms=late[98],
        behind_max_ms=max(behind) * 1000,
        enqueue_p50_ms=enqueue[49],
        enqueue_p99_ms=enqueue[98],
    )


def _ms(seconds: list[float]) -> list[float]:
    """The percentiles (1 to 99) of ``seconds``, in ms."""
    ms = [s * 1000 for s in seconds] * (2 if len(seconds) == 1 else 1)
    return statistics.quantiles(ms, n=100, method="inclusive")
