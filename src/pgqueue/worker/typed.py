"""Typed tasks: a function whose parameters are the job's payload.

    registry = TaskRegistry()

    @registry.task(queue="email", max_attempts=3, timeout=30)
    async def send_email(to: str, subject: str, body: str = "") -> None:
        ...

    send_email.enqueue(to="ada@example.com", subject="hi")         # -> Job
    await send_email.enqueue_async(to="ada@example.com", subject="hi")
    send_email.using(queue, connection=conn, delay=60).enqueue(to=..., subject=...)

``enqueue`` has the function's own signature (a ParamSpec), so mypy flags a
wrong argument, and checks it again at run time: the arguments must bind to
the parameters, and a parameter annotated ``str``, ``int``, ``float`` or
``bool`` must get one, or InvalidJob is raised and nothing is written. A
parameter annotated with a dataclass or a pydantic model travels as its JSON
fields and arrives as an instance; at enqueue, the instance is rebuilt from
those fields as the worker will (and a dataclass's str, int, float and bool
fields checked), so that a value that does not make one is InvalidJob too.
The payload is the bound arguments, by name; the worker calls the function
with them. The job's other fields come from the decorator (queue, priority,
max_attempts, timeout, ...), then from ``using(...)``, which also names the
Queue (default: one made from ``Settings.load()`` on first use) and the
caller's ``connection`` for a transactional enqueue. A typed task cannot be ``isolated``.

A function whose one parameter is the job (annotated ``Job``, or not
annotated) stays a plain handler; ``TaskRegistry.task`` tells them apart.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from ..core.errors import InvalidJob
from ..core.jobs import Job

# The faces are imported where they are used, not with this module: every
# worker process imports it, and most never enqueue through a typed task.
if TYPE_CHECKING:
    from ..queue import AsyncQueue, Queue

__all__ = ["EnqueueOptions", "TypedTask", "is_job_handler"]

P = ParamSpec("P")
R = TypeVar("R")

# The annotations checked at enqueue (a bool is an int to isinstance: not here).
_SIMPLE: dict[Any, tuple[type, ...]] = {
    str: (str,),
    int: (int,),
    float: (int, float),
    bool: (bool,),
}


def is_job_handler(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes the job itself: one parameter, annotated ``Job``
    or not at all."""
    parameters = list(inspect.signature(fn).parameters.values())
    if len(parameters) != 1 or parameters[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        return False
    annotation = _hints(fn).get(parameters[0].name, inspect.Parameter.empty)
    return annotation is inspect.Parameter.empty or annotation is Job


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: checked by nobody
        return {}


class _Defaults:
    """The Queue and AsyncQueue a typed task uses when ``using`` names none:
    made from ``Settings.load()`` on first use, one per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: Queue | None = None
        self._aqueue: AsyncQueue | None = None

    def queue(self) -> Queue:
        from ..queue import Queue

        with self._lock:
            if self._queue is None:
                self._queue = Queue()
            return self._queue

    def aqueue(self) -> AsyncQueue:
        from ..queue import AsyncQueue

        with self._lock:
            if self._aqueue is None:
                self._aqueue = AsyncQueue()
            return self._aqueue


_DEFAULTS = _Defaults()


class TypedTask(Generic[P, R]):
    """A registered function that is also its own producer; see the module
    docstring. Calling it calls the function."""

    def __init__(self, name: str, fn: Callable[P, R], fields: Mapping[str, Any]) -> None:
        self.name = name
        self.fn = fn
        self.fields = dict(fields)  # job fields: queue, priority, max_attempts, ...
        self._signature = inspect.signature(fn)
        self._hints = _hints(fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<typed task {self.name}{self._signature}>"

    # -- producing --------------------------------------------------------------

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Enqueue a job that runs this function with these arguments."""
        return EnqueueOptions(self).enqueue(*args, **kwargs)

    async def enqueue_async(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """As ``enqueue``, on an AsyncQueue."""
        return await EnqueueOptions(self).enqueue_async(*args, **kwargs)

    def using(
        self, queue: Queue | AsyncQueue | None = None, *, connection: Any = None, **fields: Any
    ) -> EnqueueOptions[P, R]:
        """The same enqueue, on ``queue``, in the caller's ``connection``
        (its transaction), with job ``fields`` over the decorator's."""
        return EnqueueOptions(self, queue, connection, fields)

    def payload(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The arguments as the job's payload; InvalidJob if they do not fit."""
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidJob("payload", f"task {self.name}: {exc}") from None
        payload = {}
        for name, value in bound.arguments.items():
            self._check(name, value)
            payload[name] = _encode(value)
            self._check_decodes(name, payload[name])
        return payload

    def _check(self, name: str, value: Any) -> None:
        problem = _mismatch(self._hints.get(name), value)
        if problem is not None:
            raise InvalidJob("payload", f"task {self.name}: argument {name!r} {problem}")

    def _check_decodes(self, name: str, encoded: Any) -> None:
        """For a parameter annotated with a dataclass or a pydantic model:
        that the worker will make one of what is sent (``_decode``), with the
        fields annotated str, int, float or bool of a dataclass holding one.
        Found at enqueue, not at run time after every attempt has failed."""
        annotation = self._hints.get(name)
        if not isinstance(annotation, type) or not _is_structured(annotation):
            return
        problem = _decode_problem(annotation, encoded)
        if problem is not None:
            raise InvalidJob(
                "payload",
                f"task {self.name}: argument {name!r} is not a valid "
                f"{annotation.__name__}: {problem}",
            )

    # -- running ----------------------------------------------------------------

    def handler(self) -> Callable[[Job], Any]:
        """What the worker runs: the function, called with the payload."""
        fn: Callable[..., Any] = self.fn
        if inspect.iscoroutinefunction(fn):

            async def run_async(job: Job) -> Any:
                return await fn(**self.arguments(job))

            return run_async

        def run(job: Job) -> Any:
            return fn(**self.arguments(job))

        return run

    def arguments(self, job: Job) -> dict[str, Any]:
        """The payload back as the function's arguments (dataclasses and
        pydantic models rebuilt)."""
        payload = job.payload if isinstance(job.payload, dict) else {}
        return {name: _decode(self._hints.get(name), value) for name, value in payload.items()}


class EnqueueOptions(Generic[P, R]):
    """A typed task's enqueue with a queue, a connection or job fields chosen."""

    def __init__(
        self,
        task: TypedTask[P, R],
        queue: Queue | AsyncQueue | None = None,
        connection: Any = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        self.task = task
        self.queue = queue
        self.connection = connection
        self.fields = {**task.fields, **(fields or {})}

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        from ..queue import Queue

        queue = self.queue or _DEFAULTS.queue()
        if not isinstance(queue, Queue):
            raise TypeError("enqueue needs a Queue; with an AsyncQueue, use enqueue_async")
        payload = self.task.payload(*args, **kwargs)
        return queue.enqueue(self.task.name, payload, connection=self.connection, **self.fields)

    async def enqueue_async(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        from ..queue import AsyncQueue

        queue = self.queue or _DEFAULTS.aqueue()
        if not isinstance(queue, AsyncQueue):
            raise TypeError("enqueue_async needs an AsyncQueue; with a Queue, use enqueue")
        payload = self.task.payload(*args, **kwargs)
        return await queue.enqueue(
            self.task.name, payload, connection=self.connection, **self.fields
        )


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)  # a pydantic model
    if callable(dump):
        return dump(mode="json")
    return value


def _is_structured(annotation: Any) -> bool:
    """A dataclass or a pydantic model (the annotations ``_decode`` rebuilds)."""
    return isinstance(annotation, type) and (
        dataclasses.is_dataclass(annotation)
        or callable(getattr(annotation, "model_validate", None))
    )


def _decode_problem(annotation: type, encoded: Any) -> str | None:
    """Why the worker could not rebuild ``annotation`` from ``encoded`` (its
    JSON fields), or None."""
    if not isinstance(encoded, dict):
        return f"got {type(encoded).__name__}"
    try:
        made = _decode(annotation, encoded)
    except Exception as exc:  # the class's own refusal (TypeError, ValidationError...)
        return " ".join(str(exc).split())[:300]
    if dataclasses.is_dataclass(annotation):
        hints = _hints(annotation)
        for item in dataclasses.fields(annotation):
            problem = _mismatch(hints.get(item.name), getattr(made, item.name))
            if problem is not None:
                return f"field {item.name!r} {problem}"
    return None


def _mismatch(annotation: Any, value: Any) -> str | None:
    """Why ``value`` does not fit ``annotation`` when that is str, int, float
    or bool (other annotations are not checked), or None."""
    allowed = _SIMPLE.get(annotation)
    if allowed and (
        not isinstance(value, allowed) or (bool not in allowed and isinstance(value, bool))
    ):
        return f"must be {annotation.__name__}, got {type(value).__name__}"
    return None


def _decode(annotation: Any, value: Any) -> Any:
    if not isinstance(value, dict) or not isinstance(annotation, type):
        return value
    if dataclasses.is_dataclass(annotation):
        return annotation(**value)
    validate = getattr(annotation, "model_validate", None)  # a pydantic model
    return validate(value) if callable(validate) else value
