"""What both faces of the queue share: settings, the URL, the enqueue flows
(traced when tracing is on), the retrying of producers' calls, and the
checks of what a caller passes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from .. import tracing
from ..core import runtime_schedules, sleeps
from ..core import transitions as t
from ..core.bulk import BulkAction, JobFilter, bulk
from ..core.enqueue import Enqueued, PerAttempt, one_statement, per_attempt
from ..core.errors import InvalidSchedule
from ..core.every_queue import EveryQueue
from ..core.flows import Flow
from ..core.job_spec import JobSpec, build_specs
from ..core.jobs import Job
from ..core.reads import checked_job_id
from ..core.schedules import Schedule, ScheduleRecord
from ..core.settings import Settings
from ..db.retrying import Retrying

__all__ = ["Common", "call_name"]

T = TypeVar("T")


def call_name(flow: Flow[Any]) -> str:
    """The call a flow makes, for its errors: its generator's name."""
    return str(getattr(flow, "__name__", "call"))


class Common:
    """Settings, URL and the validation shared by both faces."""

    def __init__(self, url: str | None, settings: Settings | None) -> None:
        self.settings = settings or Settings.load()
        self._url = url
        self._every_queue = EveryQueue(self.settings.poll_interval_seconds)
        self._retrying = Retrying(self.settings)
        # core/enqueue.py's enqueue and enqueue_many, core/workflows.py's
        # enqueue (as .workflow): each a PRODUCER span when tracing is on.
        self._enqueue_flows = tracing.EnqueueFlows(self.settings)

    def _spec(self, task: Any, payload: Any, **fields: Any) -> JobSpec:
        given = {"task": task, "payload": payload, **fields}
        spec = JobSpec.from_fields(given, default_max_attempts=self.settings.default_max_attempts)
        return self._enqueue_flows.stamp([spec])[0]

    def _specs(self, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[JobSpec]:
        specs = build_specs(jobs, default_max_attempts=self.settings.default_max_attempts)
        return self._enqueue_flows.stamp(specs)

    def _bulk_attempts(self, specs: list[JobSpec]) -> tuple[PerAttempt[Any, list[Enqueued]], bool]:
        """The attempts of an ``enqueue_many`` call, and whether each needs a
        transaction: a few plain jobs go in by one statement, which commits
        them all or none without one (``enqueue.one_statement``)."""
        if one_statement(specs):
            return per_attempt(self._enqueue_flows.enqueue_plain, specs), False
        return per_attempt(self._enqueue_flows.enqueue_many, specs), True

    def _claim(self, limit: int, worker: str, queues: Sequence[str] | None) -> Flow[list[Job]]:
        if not 1 <= limit <= 10_000:
            raise ValueError(f"limit must be between 1 and 10000, got {limit}")
        if queues is None:
            return self._every_queue.claim(self.settings, limit=limit, worker=worker)
        return t.claim(self.settings, limit=limit, worker=worker, queues=queues)

    @staticmethod
    def _signal(job_id: int, name: str, payload: Any) -> Flow[Job]:
        """The flow of a signal, its input checked now (before any connection)."""
        return sleeps.send_signal(
            checked_job_id(job_id),
            sleeps.checked_signal_name(name),
            sleeps.signal_payload_json(payload),
        )

    @staticmethod
    def _bulk(
        action: BulkAction | str, where: JobFilter | None, dry_run: bool, filters: dict[str, Any]
    ) -> Flow[int]:
        if where is not None and filters:
            raise TypeError("give a JobFilter or its fields as keywords, not both")
        return bulk(BulkAction(action), where or JobFilter.from_fields(filters), dry_run=dry_run)

    @staticmethod
    def _create_schedule(
        name: str, task: str | None, fields: dict[str, Any]
    ) -> Flow[ScheduleRecord]:
        """The flow that stores a runtime schedule, its arguments checked
        (InvalidSchedule names a bad or unknown one)."""
        enabled = fields.pop("enabled", True)
        unknown = sorted(set(fields) - set(runtime_schedules.FIELDS) - {"task"})
        if unknown:
            raise InvalidSchedule(str(name)[:80], unknown[0], "is not a field of a schedule")
        if not isinstance(enabled, bool):
            raise InvalidSchedule(str(name)[:80], "enabled", "must be true or false")
        schedule = Schedule.create(name, task=task, **fields)
        return runtime_schedules.create(schedule, enabled=enabled)
