"""What a handler may ask for besides returning a result or failing.

A handler, sync or async, raises one of these and the worker makes it the
attempt's outcome::

    raise Snooze(30)            run again in 30 s (database clock); the attempt
                                is given back, the job's ``snoozes`` goes up;
                                past the task's max_snoozes the job is dead
    raise CancelJob("reason")   end the job now as cancelled, the reason in
                                last_error; no retry

They are exceptions rather than return values so that a handler's return
value is always its result, and so that code deep inside a handler can ask
too. They are not ``PgQueueError``s: pgqueue does not raise them, handlers do.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NamedTuple

from .errors import InvalidJob
from .jobs import MAX_DELAY_SECONDS, Job, dump_json
from .json_text import printable
from .rules import Seconds

__all__ = ["CancelJob", "Outcome", "Snooze", "attempt_token", "snooze_seconds"]

_SNOOZE = Seconds(0.0, MAX_DELAY_SECONDS)


def snooze_seconds(value: float | timedelta) -> float:
    """A snooze's delay checked (0 up to ten years), as seconds; InvalidJob if not."""
    return _SNOOZE.check("Snooze seconds", value)


class Snooze(Exception):
    """Run this job again after ``seconds`` (a number or a timedelta) without
    counting the attempt. Raises InvalidJob at once for a delay out of range."""

    def __init__(self, seconds: float | timedelta) -> None:
        self.seconds = snooze_seconds(seconds)
        super().__init__(f"snooze for {self.seconds:g} s")


class CancelJob(Exception):
    """End this job now as cancelled, with ``reason`` as its last_error: no
    retry, whatever attempts are left."""

    def __init__(self, reason: str = "cancelled by its handler") -> None:
        self.reason = str(reason)
        super().__init__(self.reason)


class Outcome(NamedTuple):
    """How one attempt ended, fenced by the token of its claim: a success, a
    failure, or what its handler asked for (a snooze, a cancel). Make one
    with the constructors below. (A named tuple, not a frozen dataclass: the
    worker makes one per job, and a tuple is built in one step, not through
    object.__setattr__ for each field.)"""

    job_id: int
    token: int
    succeeded: bool
    result_json: str | None = None
    error: str | None = None  # a failure's error, or a cancel's reason
    retryable: bool = True
    snooze_seconds: float | None = None  # a snooze: queued again after this long
    cancelled: bool = False  # the handler cancelled the job

    @classmethod
    def success(cls, job: Job, result: Any) -> Outcome:
        """A success, unless the result cannot be stored: then a failed attempt."""
        try:
            # (None, what most handlers return, needs no encoder: a job's cost)
            text = "null" if result is None else dump_json(result, "result")
        except InvalidJob as exc:
            return cls.failure(job, f"handler returned a result PostgreSQL cannot store: {exc}")
        return cls(job.id, attempt_token(job), True, result_json=text)

    @classmethod
    def failure(cls, job: Job, error: str, *, retryable: bool = True) -> Outcome:
        return cls(job.id, attempt_token(job), False, error=_storable(error), retryable=retryable)

    @classmethod
    def snooze(
        cls, job: Job, seconds: float, *, max_snoozes: int | None = None, error: str | None = None
    ) -> Outcome:
        """Queued again after ``seconds``, the attempt given back (``error``:
        why, kept as last_error; None leaves it). A job that already snoozed
        ``max_snoozes`` times (None: no bound) is dead instead, so that a job
        waiting for something that never comes ends visibly."""
        seconds = snooze_seconds(seconds)
        if max_snoozes is not None and job.snoozes >= max_snoozes:
            return cls.failure(
                job,
                f"asked to snooze ({seconds:g} s) after {job.snoozes} snoozes, the most "
                f"allowed (max_snoozes {max_snoozes}): giving up",
                retryable=False,
            )
        text = None if error is None else _storable(error)
        return cls(job.id, attempt_token(job), False, error=text, snooze_seconds=seconds)

    @classmethod
    def cancel(cls, job: Job, reason: str) -> Outcome:
        """Cancelled at its handler's request: no retry, ``reason`` kept as last_error."""
        return cls(job.id, attempt_token(job), False, error=_storable(reason), cancelled=True)


def _storable(text: str) -> str:
    # jsonb is not involved, but text columns refuse NUL and lone surrogates
    # as well (an exception's text may quote either).
    return printable(text).replace("\x00", "\\0")


def attempt_token(job: Job) -> int:
    if job.lease_token is None:
        raise ValueError(f"job {job.id} was not claimed: it has no lease token")
    return job.lease_token


# -- the worker's transitions -------------------------------------------------
