"""Durable sleeps and signals: ``job.sleep()``, ``job.sleep_until()``,
``job.wait_for_signal()`` and ``Queue.signal()``
(docs/howto/durable-sleep-and-signals.md).

A sleep or a wait is a durable step of its job (core/steps.py) under a name
of pgqueue's own (``pgqueue:sleep:<n>``, ``pgqueue:wait:<signal>:<n>``:
the n-th call of the attempt, counted from 1 by each attempt), fenced by
the attempt's token like any step. Its first call stores when it ends (the
wake time; the deadline), on the database clock; a later attempt's call of
the same name finds it and keeps it, so that a sleep is not slept twice and
a timeout is not moved by a retry. While it has not ended, the same
statement puts the job back to queued until then: the worker's slot is free
for other jobs, the attempt is given back (a snooze's way; but not one of
the job's snoozes, which max_snoozes bounds), and the handler unwinds by
``Asleep``. When the job runs again its handler runs from the top: the
steps before come from storage, and the call returns.

A signal (``pgqueue_job_signals``, migrations/0026) waits for the first wait
of its name that has not received one, oldest signal first; the wait
deletes it as it stores its payload as the wait's outcome, in one
statement, so that each signal is consumed once and each wait receives at
most one. A signal sent to a job asleep in a wait for it wakes the job in
the transaction that stores it (job_signal); both sides lock the job's row
first, so that a wait deciding at that moment never misses it.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .errors import JobAlreadyFinished, JobNotFound, SignalTimeout, StaleAttempt
from .flows import Flow, Statement
from .json_text import dump_json
from .rules import Moment, Name, Seconds
from .steps import NOTHING_STORED, PGQUEUE_STEP_PREFIX

if TYPE_CHECKING:  # jobs.py imports this module
    from .jobs import Job

__all__ = [
    "MAX_SIGNAL_NAME",
    "MAX_SLEEP_SECONDS",
    "SIGNAL_NAME",
    "Asleep",
    "checked_signal_name",
    "checked_sleep",
    "checked_wait_timeout",
    "send_signal",
    "signal_payload_json",
    "sleep",
    "sleep_step_name",
    "wait_for_signal",
    "wait_step_name",
    "waited",
]

MAX_SIGNAL_NAME = 200
# Ten years, as a job's delay (jobs.MAX_SLEEP_SECONDS; jobs.py imports this
# module, so the number is written here again).
MAX_SLEEP_SECONDS = 10 * 365 * 24 * 3600.0
SIGNAL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,199}")
_NAME = Name(SIGNAL_NAME)
_SLEEP = Seconds(0.0, MAX_SLEEP_SECONDS)
_WAKE = Moment(MAX_SLEEP_SECONDS)
_TIMEOUT = Seconds(0.0, MAX_SLEEP_SECONDS)


class Asleep(BaseException):  # not an error: how a sleeping handler unwinds
    """Raised by ``job.sleep()`` and ``job.wait_for_signal()`` once their
    job is asleep (back to queued until ``wake_at``, database clock): it
    unwinds the handler, and the worker writes nothing more for the
    attempt. A BaseException, as asyncio.CancelledError is, so that a
    handler's ``except Exception`` does not stop it on its way out; a
    handler that catches it anyway must raise it again."""

    def __init__(self, job_id: int, wake_at: datetime) -> None:
        self.job_id = job_id
        self.wake_at = wake_at
        super().__init__(f"job {job_id} sleeps until {wake_at.isoformat()}")


def checked_signal_name(name: Any) -> str:
    """A signal's name: 1 to MAX_SIGNAL_NAME characters of letters, digits
    and ``_ . : -`` (not starting with one of ``. : -``); InvalidJob
    naming ``name`` otherwise."""
    return _NAME.check("name", name)


def signal_payload_json(payload: Any) -> str:
    """A signal's payload (any JSON; None is JSON null) as storable JSON
    text, under the rules of a job's payload (json_text.dump_json: depth,
    size, text PostgreSQL can store); InvalidJob naming ``payload``."""
    return dump_json(payload, "payload")


def checked_sleep(
    seconds: float | timedelta | None, until: datetime | None
) -> tuple[float | None, datetime | None]:
    """A sleep's length (0 to ten years) or wake time (with a zone; in
    the past means now); InvalidJob otherwise."""
    if until is not None:
        return None, _WAKE.check("when", until)
    return _SLEEP.check("seconds", seconds), None


def checked_wait_timeout(timeout: float | timedelta) -> float:
    """A wait's timeout: 0 to ten years; InvalidJob otherwise."""
    return _TIMEOUT.check("timeout", timeout)


def sleep_step_name(n: int) -> str:
    """The step of the attempt's n-th sleep."""
    return f"{PGQUEUE_STEP_PREFIX}sleep:{n}"


def wait_step_name(signal: str, n: int) -> str:
    """The step of the attempt's n-th wait for ``signal``."""
    return f"{PGQUEUE_STEP_PREFIX}wait:{signal}:{n}"


def sleep(
    job_id: int, token: int, name: str, seconds: float | None, until: datetime | None
) -> Flow[tuple[datetime, bool]]:
    """Store (or find) the sleep ``name``'s wake time, and put the job to
    sleep until then if it is ahead: (wake time, asleep). StaleAttempt
    (nothing stored) unless the job still runs with ``token``."""
    params = {"id": job_id, "token": token, "name": name, "seconds": seconds, "until": until}
    rows = yield Statement("job_sleep", params)
    if not rows:
        raise StaleAttempt(job_id, token, NOTHING_STORED)
    return rows[0]["wake_at"], rows[0]["asleep"]


def wait_for_signal(
    job_id: int, token: int, name: str, signal: str, timeout: float
) -> Flow[tuple[Any, bool]]:
    """The wait ``name`` for ``signal``, in one transaction: its step's
    result (with ``outcome`` once decided) and whether the job went to
    sleep. StaleAttempt (nothing stored) unless the job still runs with
    ``token``."""
    locked = yield Statement("job_lock_running", {"id": job_id, "token": token})
    if not locked:
        raise StaleAttempt(job_id, token, NOTHING_STORED)
    params = {"id": job_id, "token": token, "name": name, "signal": signal, "timeout": timeout}
    rows = yield Statement("job_signal_wait", params)
    return rows[0]["result"], rows[0]["asleep"]


def waited(job_id: int, signal: str, result: dict[str, Any]) -> Any:
    """What a decided wait returns: the signal's payload; SignalTimeout
    for a wait whose deadline passed first."""
    if result["outcome"] == "timed_out":
        raise SignalTimeout(job_id, signal, datetime.fromisoformat(result["deadline"]))
    return result["payload"]


def send_signal(job_id: int, name: str, payload_json: str) -> Flow[Job]:
    """Store a signal for the job, in one transaction (run it in one), and
    wake the job if it is asleep waiting for it; the job as it is then.
    JobNotFound, or JobAlreadyFinished for a job that succeeded, died or
    was cancelled: nothing is stored."""
    rows = yield Statement("job_signal_lock", {"id": job_id})
    if not rows:
        raise JobNotFound(job_id)
    state = rows[0]["state"]
    if state in ("succeeded", "dead", "cancelled"):
        raise JobAlreadyFinished(job_id, state, "signal")
    yield Statement("job_signal", {"id": job_id, "name": name, "payload": payload_json})
    # The same transaction's next statement sees the run_at job_signal set.
    jobs: list[Job] = yield Statement("job_get", {"id": job_id}, jobs=True)
    return jobs[0]
