"""The producer: where jobs are claimed.

It claims up to the free slots in one ``job_claim`` whenever it is woken,
claims again at once while batches come back full, and otherwise sleeps
until woken (a NOTIFY from an enqueue, a freed slot, an ended job of a queue
with a concurrency limit), the poll interval, or the earliest known time a
job becomes runnable (a delayed job's ``run_at``, a rate limit's window
moving on), whichever comes first. Each claimed job goes to ``start`` (the
worker), which runs it.

Two claimers (one per claim connection) take turns: one at a time waits
for work, and while it claims the other waits in its place, so that a hint
that comes during a claim starts the next claim at once instead of after
it (with one claimer, a job committed just after a claim began would wait
for that claim and then for the next). Under load, when claims come back
full, both claim continuously, each asking for the room the other did not.

Its queues share the free slots round-robin (``transitions.claim``), so that
a flood in one cannot hold up another; the turn moves on with every claim,
and a queue that gave nothing last time is asked for one job (what it does
not take goes to the others in the same statement). A
worker of every queue claims from the queues that have queued jobs: it lists
them once per poll interval (until the first listing, its claims list them
themselves), and learns a new one from its hint. Queues with
a latency objective (``max_start_lag_seconds``) at least half way to it are
asked first, for every slot, the furthest behind first: the claim flow reads
their waits before its claim (``transitions.claim``, only when one of the
queues has an objective). A fair queue's claim takes at most FAIR_CLAIM_JOBS
of its jobs, and one that took that many counts as full.

The lookout (``lookout_loop``) does the asking that is not claiming, off the
claimers' connections: once per poll interval, and when a due time has
passed, it lists the queues (a worker of every queue), reads which are fair
and their latency objectives (``claim_hints``) and, unless every
claim since it last asked came back full, asks when a job is next due and
which queues are concurrency-limited. A listing under load walks the
claim index's entries of every job claimed since the last vacuum: on a
claimer's connection, the claims would wait behind it.

Quick claims: under a backlog the claims are big (hundreds of jobs) and
back to back, so that a job of another of the worker's queues, quiet until
then, would wait for the claims in flight and the next one. A hint for a
queue that gave nothing at the last claim, when that claim came back full,
is claimed at once on the lookout's connection
(``quick_loop``, at most QUICK_CLAIM_JOBS of it), and its jobs start before
the buffer's. That connection commits without waiting for a synchronous
standby (runtime.py): a quick claim lost in a failover leaves its job
queued on the new primary, to run again there, as after any fault (at
least once); its outcome is written on the outcome connection, which waits.

Wake-ups: ``listen()`` keeps a LISTEN connection of its own; a hint for one
of our queues wakes the claim loop. Hints sent while it was not listening
are lost, so it also wakes the loop each time it starts listening again.
NOTIFY is a hint: the poll interval is the backstop. The same connection
hears cancels of running jobs (``CancelNotice``), which go to the lease
keeper; for those the heartbeat is the backstop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence

from .. import tracing
from ..core.jobs import Job
from ..core.reads import ClaimHints, claim_hints, next_wake, queues_with_jobs
from ..core.settings import Settings
from ..core.transitions import CancelNotice, claim, release
from ..db.driver import DRIVER_ERRORS
from ..db.worker_connection import FlowDriver
from .held import Held, HeldJobs
from .supervision import WAIT_OUT, Backoff, EventLog, short, together

__all__ = ["Producer"]

Listen = Callable[[], AsyncIterator[str | CancelNotice | None]]

# Claim ahead for this many claims' round trips: room for a claim slower
# than the last, and for the pace to grow when the slots were starved.
PACE_MARGIN = 2
# How long the pace remembers the busiest rate it measured (see _pace).
PACE_MEMORY_SECONDS = 1.0
# A fair queue's claim takes at most this many of its jobs (docs/howto/
# limits.md, "Fair queues"), so that a key that comes beside a large backlog
# waits for one short claim (without limits, a worker's two claims of it
# overlap: migration 0040; with limits, they take turns under its lock).
FAIR_CLAIM_JOBS = 50
# A quick claim (a quiet queue hinted under a backlog: Producer._hinted)
# takes at most this many jobs of each queue it asks: a burst's first jobs,
# the rest in the claimers' turn.
QUICK_CLAIM_JOBS = 10
# A due time the lookout learns wakes an idle claimer if it comes this much
# before the claimer's own wake-up.
DUE_TOLERANCE_SECONDS = 0.01


class Producer:
    def __init__(
        self,
        conn: FlowDriver,
        held: HeldJobs,
        settings: Settings,
        events: EventLog,
        *,
        queues: Sequence[str] | None,
        start: Callable[[list[Job]], None],
        start_first: Callable[[list[Job]], None] | None = None,
        more: Sequence[FlowDriver] = (),
        lookout: FlowDriver | None = None,
        cancelled: Callable[[CancelNotice], None] = lambda notice: None,
    ) -> None:
        self.conns = [conn, *more]  # one claimer each
        self.lookout = lookout or conn  # the lookout's (the worker's upkeep connection)
        self.held = held
        self.settings = settings
        self.events = events
        self.queues = list(queues) if queues else None
        self.known = list(self.queues or ())  # the queues claimed from
        # Whether ``known`` is worth claiming from: a worker of every queue
        # knows none until the lookout's first listing, and meanwhile its
        # claims list the queues themselves (else its first claim, under a
        # backlog, would ask no queue and wait for the listing).
        self._listed = self.queues is not None
        self.start = start
        self.start_first = start_first or start  # a quick claim's jobs: before the buffer's
        self.cancelled = cancelled  # a cancel's notice heard (LeaseKeeper.cancelled)
        self.stats = {"claimed": 0, "claims": 0}
        self.last_claim_at: float | None = None  # monotonic
        self.stopping = False
        self._wake = asyncio.Event()  # work may be ready (or we are stopping)
        self._last_claim_full = True  # start by looking for work
        self._polling = asyncio.Lock()  # held by the claimer that waits for work
        self._look = asyncio.Event()  # the lookout should ask now (a due time passed)
        self._next_due: float | None = None  # monotonic time of the earliest run_at
        self._asleep_until = 0.0  # when the idle claimer wakes up by itself (0: awake)
        self._idled = True  # a claim came back short since the lookout last asked
        self._heard: set[str] = set()  # queues named by hints since the last listing began
        self._turn = 0  # which queue comes first in the round-robin
        self._sparse: frozenset[str] = frozenset()  # queues that gave nothing last time
        self._limited: frozenset[str] = frozenset()  # queues with a concurrency limit
        self._hints = ClaimHints()  # fair queues, latency objectives (the lookout's)
        # (when, jobs finished, the rate it paced for) at the last full claim
        self._paced: tuple[float, int, float] = (time.monotonic(), 0, 0.0)
        self._claiming = 0  # jobs asked for by the claims in flight
        self._quick: set[str] = set()  # quiet queues hinted under a backlog (_hinted)
        self._quick_asked = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    def jobs_ended(self, queues: set[str]) -> None:
        """Jobs of these queues ended (their outcomes are written): under a
        concurrency limit, that is a slot for the next claim."""
        if not self._limited.isdisjoint(queues):
            self._wake.set()

    def stop(self) -> None:
        """Claim nothing more; a claim in flight completes (its jobs run)."""
        self.stopping = True
        self._wake.set()
        self._quick_asked.set()
        self.held.slot_freed.set()

    async def claim_loop(self) -> None:
        """Claim whenever there are free slots and work may be ready, until
        stopped: one claimer per connection, so that a claim can go out
        while another is in flight (each asks only for the room the others
        have not asked for)."""
        await together([*(self._claimer(conn) for conn in self.conns), self.quick_loop()])

    async def _claimer(self, conn: FlowDriver) -> None:
        backoff = Backoff(self.events, "claim")
        while not self.stopping:
            free = self.held.free_slots() - self._claiming
            # With jobs claimed ahead, wait until half of them have started,
            # so that a busy worker claims in batches, not a job at a time.
            if free <= 0 or self.held.beyond_slots > self.held.ahead // 2:
                self.held.slot_freed.clear()
                await self.held.slot_freed.wait()
                continue
            if not self._last_claim_full:
                # One claimer at a time waits for work, so that an idle
                # worker polls with one claim. While it claims, another waits
                # in its place: a hint that comes during a claim starts the
                # next one at once, not after it.
                async with self._polling:
                    await self._idle_wait()
                if self.stopping:
                    break
                # The queues ran dry at the last claim: ask for part of the
                # room, and leave the rest to the claimer now waiting.
                free = self._share(self.held.free_slots())
                if free <= 0:
                    continue
            self._wake.clear()
            sent_at = time.monotonic()
            free = self._takes(free)
            self._claiming += free
            try:
                jobs = await conn.drive(
                    tracing.claims(self.settings, claim)(
                        self.settings,
                        limit=free,
                        worker=self.events.worker,
                        queues=self.known if self._listed else None,
                        turn=self._turn,
                        sparse=self._sparse,
                        caps=self._caps(),
                        objectives=self._hints.objectives,
                    )
                )
            except WAIT_OUT as exc:
                self._set_full(True)  # look again after the backoff
                await backoff.failed(exc)
                continue
            finally:
                self._claiming -= free
                # The room this claim had reserved is free for the other to see.
                self.held.slot_freed.set()
            backoff.succeeded()
            # A short claim says the queues ran dry, not the buffer; a fair
            # queue that gave its cap may have more.
            full = len(jobs) == free or self._capped(jobs)
            if full:
                self._pace(sent_at)
            self._claimed(jobs, full=full)
            # Let the handlers of the jobs just started run first, so that the
            # next claim is sized by the slots they free (no-op jobs: at once).
            await asyncio.sleep(0)

    def _hinted(self, queue: str) -> None:
        """A job of ``queue`` was enqueued. A queue that gave nothing at the
        last claim while that claim came back full (a backlog of the
        worker's other queues) is claimed from at once by ``quick_loop``:
        its job would otherwise wait for the claims in flight and the next
        (under a backlog, claims of hundreds of jobs: tens of ms). A queue
        that ran dry at a claim that came back short waits for no backlog:
        its hint wakes the claimers, as any hint does. Nor does a worker
        that claims nothing ahead (long jobs: another worker may be free to
        run it) or whose slots are held by hung threads (it starts nothing
        soon)."""
        if queue in self._sparse and self._last_claim_full and self._quick_room():
            self._quick.add(queue)
            self._quick_asked.set()
        self._wake.set()

    async def quick_loop(self) -> None:
        """Claim the quiet queues' hinted jobs, QUICK_CLAIM_JOBS of each, on
        the lookout's connection (the claimers' are busy), and start them
        before the jobs claimed ahead (HeldJobs.hold, ``first``). The
        turn, the pace and the claimers' room stay as they were; a claim
        that fails leaves the jobs to the claimers' next."""
        backoff = Backoff(self.events, "quick claim")
        while not self.stopping:
            await self._quick_asked.wait()
            self._quick_asked.clear()
            queues = sorted(self._quick)
            self._quick.clear()
            limit = min(QUICK_CLAIM_JOBS * len(queues), self._quick_room())
            if self.stopping or limit <= 0:
                continue
            try:
                jobs = await self.lookout.drive(
                    tracing.claims(self.settings, claim)(
                        self.settings,
                        limit=limit,
                        worker=self.events.worker,
                        queues=queues,
                        caps=self._caps(),
                        objectives=self._hints.objectives,
                    )
                )
            except WAIT_OUT as exc:
                await backoff.failed(exc)
                continue
            backoff.succeeded()
            self.stats["claims"] += 1
            self.stats["claimed"] += len(jobs)
            self._sparse = self._sparse.difference(job.queue for job in jobs)
            if jobs:
                self.start_first(jobs)

    def _quick_room(self) -> int:
        """How many jobs a quick claim may take: no more than the worker
        claims ahead (what starts within two claims' round trips at the
        rate its jobs end; none while hung threads hold slots), within its
        allowance of held jobs."""
        return min(self.held.claim_ahead(), self.held.allowance())

    def _caps(self) -> dict[str, int]:
        return {name: FAIR_CLAIM_JOBS for name in self._hints.fair}

    def _takes(self, free: int) -> int:
        """What a claim can take of ``free`` slots: all of them, unless
        every queue it asks is a fair one, whose claims are capped. The
        rest is left to the other claimer, whose claim then overlaps this
        one (a fair queue without limits is claimed under row locks, not
        its queue's lock), so that a key coming beside a backlog waits for
        whichever claim begins next."""
        if not self._hints.fair:
            return free
        asked = set(self.known)
        if not asked or not self._hints.fair.issuperset(asked):
            return free
        return min(free, FAIR_CLAIM_JOBS * len(asked))

    def _capped(self, jobs: list[Job]) -> bool:
        """Whether a fair queue gave as many jobs as its claim may take."""
        if not self._hints.fair:
            return False
        got = Counter(job.queue for job in jobs)
        return any(got[name] >= FAIR_CLAIM_JOBS for name in self._hints.fair)

    def _share(self, room: int) -> int:
        """What a claim takes of the free ``room`` when jobs come in slower
        than the claims take them: an equal share for each claimer, of what
        the claims in flight left."""
        return min(room - self._claiming, math.ceil(room / len(self.conns)))

    def _pace(self, sent_at: float) -> None:
        """Claim ahead as many jobs as start during PACE_MARGIN claims'
        round trips at the rate jobs end: those the buffer must hold for the
        slots to stay busy while the next claim is out. Long jobs end slowly:
        a job or so ahead.

        The rate is the busiest measured since the last full claim or
        before it, forgotten over PACE_MEMORY_SECONDS. Short jobs end in
        bursts (a batch ends at once, then none while the next claim is
        out), so that the rate between two claims swings from 0 to several
        times its mean: a buffer sized by that rate alone would shrink to a
        job or two after each swing down, and the slots would wait for the
        claims."""
        now, finished = time.monotonic(), self.held.finished
        since, before, paced = self._paced
        measured = (finished - before) / max(now - since, 1e-6)
        rate = max(measured, paced * math.exp((since - now) / PACE_MEMORY_SECONDS))
        wanted = math.ceil(PACE_MARGIN * rate * (now - sent_at))
        self.held.ahead = min(self.held.prefetch, wanted)
        self._paced = (now, finished, rate)

    async def give_back(self, waiting: Sequence[Held]) -> None:
        """Stopping: queue again at once the claimed jobs that never started
        (not after their leases expire); after a fault, the leases will."""
        leases = [(h.job.id, h.job.lease_token or 0) for h in waiting if not h.lost]
        try:
            await self.conns[0].drive(release(leases))
        # A claim cut short by the shutdown's deadline may leave its
        # connection unusable: the leases are the backstop either way.
        except (*WAIT_OUT, *DRIVER_ERRORS) as exc:
            self.events(
                logging.WARNING,
                "shutdown",
                "could not give back %d prefetched jobs (%s); they return to the queue "
                "when their leases expire",
                len(leases),
                short(exc),
            )
            return
        if leases:
            self.events(
                logging.INFO, "shutdown", "gave back %d prefetched jobs, never started", len(leases)
            )

    def _set_full(self, full: bool) -> None:
        self._last_claim_full = full
        if full:
            self._wake.set()  # the claimer waiting for work helps a busy one

    def seconds_since_claim(self) -> float | None:
        """Since the last claim statement that worked (None: none yet)."""
        return None if self.last_claim_at is None else time.monotonic() - self.last_claim_at

    async def lookout_loop(self) -> None:
        """List the queues and learn the next due time and the limited
        queues, once per poll interval and when a due time has passed, for
        ever (see the module's docstring)."""
        backoff = Backoff(self.events, "lookout")
        while True:
            self._look.clear()
            try:
                await self._list_queues(self.lookout)
                self._hints = await self.lookout.drive(claim_hints(self.queues))
                # A worker whose every claim came back full has no use for it.
                if self._idled:
                    self._idled = False
                    await self._refresh_next_due(self.lookout)
            except WAIT_OUT as exc:
                self._idled = True  # ask again after the backoff
                await backoff.failed(exc)
                continue
            backoff.succeeded()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._look.wait(), self.settings.poll_interval_seconds)

    async def _list_queues(self, conn: FlowDriver) -> None:
        """A worker of every queue: list the queues that have jobs (hints
        add new ones in between); wake the claimers for a queue they did not
        know."""
        if self.queues is not None:
            return
        self._heard.clear()
        listed = await conn.drive(queues_with_jobs())
        # A queue heard of while the list was read may have jobs it missed.
        known = [*listed, *(name for name in self._heard if name not in listed)]
        if not set(known).issubset(self.known):
            self._wake.set()
        self.known = known
        self._listed = True

    def _claimed(self, jobs: list[Job], *, full: bool) -> None:
        self.stats["claims"] += 1
        self.last_claim_at = time.monotonic()
        self._turn += 1
        self._sparse = frozenset(self.known).difference(job.queue for job in jobs)
        self._set_full(full)
        self._idled = self._idled or not full
        if not jobs:
            return
        self.stats["claimed"] += len(jobs)
        if self.events.enabled(logging.DEBUG):
            self.events(
                logging.DEBUG, "claim", "claimed %d jobs", len(jobs), job_ids=[j.id for j in jobs]
            )
        self.start(jobs)

    async def _idle_wait(self) -> None:
        """Sleep until woken, the poll interval, or the earliest known run_at."""
        timeout = self.settings.poll_interval_seconds
        if self._next_due is not None:
            timeout = min(timeout, max(0.0, self._next_due - time.monotonic()))
        if not self._wake.is_set() and timeout > 0:
            self._asleep_until = time.monotonic() + timeout
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._asleep_until = 0.0
        if self._next_due is not None and time.monotonic() >= self._next_due:
            self._next_due = None
            self._look.set()  # the next due time is another one

    async def _refresh_next_due(self, conn: FlowDriver) -> None:
        """Ask when a job is next due (a delayed job, a rate window) and
        which queues are concurrency-limited."""
        wake = await conn.drive(next_wake(self.queues))
        self._limited = wake.limited
        seconds = wake.seconds
        due = time.monotonic() + seconds if seconds is not None and seconds > 0 else None
        # A claimer asleep past it looks again now, and then sleeps until it
        # (the same due time read again may come back a few ms earlier).
        if due is not None and due < self._asleep_until - DUE_TOLERANCE_SECONDS:
            self._wake.set()
        self._next_due = due

    async def listen_loop(self, hints: Listen) -> None:
        """Wake the claim loop on every hint for one of our queues; hand a
        cancel's notice to ``cancelled``; reconnect (with backoff) when the
        listening connection is lost."""
        backoff = Backoff(self.events, "listen connection")
        ours = set(self.queues or ())
        while True:
            try:
                async for hint in hints():
                    if hint is None:  # listening (again): look, hints were missed
                        backoff.succeeded()
                        self._wake.set()
                    elif isinstance(hint, CancelNotice):
                        self.cancelled(hint)
                    elif not ours or hint in ours:
                        self._heard.add(hint)
                        if hint not in self.known:
                            self.known.append(hint)
                            self._sparse |= {hint}  # it gave nothing yet
                        self._hinted(hint)
                raise ConnectionError("the listening connection was closed")
            except WAIT_OUT as exc:  # ConnectionError is an OSError
                await backoff.failed(exc)
