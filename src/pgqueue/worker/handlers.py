"""Handlers: what a worker runs for each task name.

A handler is any callable taking the claimed ``Job`` and returning a
JSON-able result (or raising ``Snooze``/``CancelJob``, see pgqueue.control);
``async def`` handlers run on the worker's event loop, plain functions in its
bounded thread pool. Give the worker either a plain mapping ``{"task": fn}``
or a ``TaskRegistry`` filled with its decorator, which can also carry a
per-task timeout, bound on snoozes, and the exceptions that put the job
back without counting an attempt (a database outage, say)::

    registry = TaskRegistry()

    @registry.task(timeout=30, max_snoozes=10, retry_without_attempt=(OperationalError,))
    async def send_email(job: Job) -> dict[str, str]:
        ...

A plain function registered with ``isolated=True`` runs in a child process
instead of a thread (worker/isolation.py): its timeout kills the child, and a
child that crashes fails its attempt without harming the worker. It must be
importable by name (a module-level function), and so must what it returns.

A registry also declares schedules (periodic jobs; ``pgqueue.schedules``):
``@registry.task(cron="30 2 * * *", tz="Europe/Berlin")`` enqueues the task
at each tick, and ``registry.periodic(name, task=..., cron=... or every=...,
payload=...)`` declares any number of them. A worker given the registry
writes them to pgqueue_schedules when it starts (see ``sync`` there).

``load_handlers("package.module:ATTR")`` resolves the command line's
``--handlers`` argument to either form.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from ..core.jobs import Job
from ..core.schedules import Schedule
from .typed import TypedTask, is_job_handler

__all__ = [
    "Handler",
    "Task",
    "TaskRegistry",
    "load_handlers",
    "load_target",
    "resolve_schedules",
    "resolve_tasks",
    "task",
    "tasks",
]

Handler = Callable[[Job], Any]
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Task:
    """One registered handler: its callable, whether it is a coroutine
    function, its default timeout (a job's own timeout wins), how many
    times one job may snooze (None: the setting ``max_snoozes``), whether
    it runs in a child process, and the exceptions that snooze it after a
    backoff instead of failing the attempt (within the same bound)."""

    name: str
    fn: Handler
    is_async: bool
    timeout_seconds: float | None = None
    max_snoozes: int | None = None
    isolated: bool = False
    retry_without_attempt: tuple[type[Exception], ...] = ()


def _is_async(fn: Any) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _task(
    name: str,
    fn: Any,
    timeout: float | None = None,
    max_snoozes: int | None = None,
    isolated: bool = False,
    retry_without_attempt: Any = (),
) -> Task:
    if not callable(fn):
        raise TypeError(f"handler for task {name!r} is not callable: {fn!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout of task {name!r} must be > 0, got {timeout!r}")
    if max_snoozes is not None and (
        isinstance(max_snoozes, bool) or not isinstance(max_snoozes, int) or max_snoozes < 0
    ):
        raise ValueError(
            f"max_snoozes of task {name!r} must be an integer >= 0, got {max_snoozes!r}"
        )
    is_async = _is_async(fn)
    if isolated and is_async:
        raise ValueError(
            f"task {name!r}: isolated=True is for plain functions; an async handler "
            "is cancelled on timeout already"
        )
    retried = _exception_classes(name, retry_without_attempt)
    return Task(name, fn, is_async, timeout, max_snoozes, isolated, retried)


def _exception_classes(name: str, value: Any) -> tuple[type[Exception], ...]:
    """An exception class or a tuple of them, as in an ``except`` clause."""
    classes = value if isinstance(value, tuple) else (value,)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise ValueError(
                f"retry_without_attempt of task {name!r} must be an exception class or a "
                f"tuple of them, got {value!r}"
            )
    return classes


class TaskRegistry(Mapping[str, Handler]):
    """A mapping of task name to handler, filled by the ``task`` decorator."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._schedules: dict[str, Schedule] = {}

    @overload
    def task(self, fn: Callable[[Job], R], /) -> Callable[[Job], R]: ...

    @overload
    def task(self, fn: Callable[P, R], /) -> TypedTask[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        timeout: float | None = None,
        max_snoozes: int | None = None,
        isolated: bool = False,
        retry_without_attempt: type[Exception] | tuple[type[Exception], ...] = (),
        **options: Any,
    ) -> Register: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        timeout: float | None = None,
        max_snoozes: int | None = None,
        isolated: bool = False,
        retry_without_attempt: type[Exception] | tuple[type[Exception], ...] = (),
        **options: Any,
    ) -> Any:
        """Register ``fn`` under ``name`` (default: the function's name).
        ``max_snoozes``: how many times one job may snooze (default: the
        setting ``max_snoozes``). ``isolated``: run this plain function in
        a child process, which its timeout kills. ``retry_without_attempt``:
        exceptions (e.g. ``psycopg.OperationalError``) that put the job back
        after a backoff without counting the attempt, as a snooze and within
        the same bound; past it, such an exception fails the attempt as any
        other. A function whose parameters are the payload becomes a
        TypedTask (worker/typed.py): ``queue``, ``priority`` and
        ``max_attempts`` are then its jobs' fields. With ``cron=`` or
        ``every=`` (and any other argument of ``periodic``), also declare a
        schedule of the same name that runs it."""

        def register(fn: Callable[..., Any]) -> Any:
            key = name or getattr(fn, "__name__", None)
            if not key:
                raise ValueError(f"give a name for {fn!r}: it has no __name__")
            if key in self._tasks:
                raise ValueError(f"task {key!r} is registered twice")
            typed = None if is_job_handler(fn) else _typed(key, fn, options, isolated)
            if options and not {"cron", "every"} & options.keys():
                raise ValueError(_not_an_option(key, sorted(options), typed is not None))
            handler = typed.handler() if typed else fn
            task = _task(key, handler, timeout, max_snoozes, isolated, retry_without_attempt)
            if options:
                self.periodic(key, task=key, **options)
            self._tasks[key] = task
            return typed or fn

        return register(fn) if fn is not None else register

    def periodic(self, name: str, **schedule: Any) -> Schedule:
        """Declare a schedule: ``Schedule.create(name, **schedule)`` (task,
        cron and tz or every, payload, queue, catch_up, ...). Raises
        InvalidSchedule for a bad argument, ValueError for a name taken."""
        if name in self._schedules:
            raise ValueError(f"schedule {name!r} is declared twice")
        created = self._schedules[name] = Schedule.create(name, **schedule)
        return created

    def schedules(self) -> list[Schedule]:
        return list(self._schedules.values())

    def add(
        self,
        name: str,
        fn: Handler,
        *,
        timeout: float | None = None,
        max_snoozes: int | None = None,
        isolated: bool = False,
        retry_without_attempt: type[Exception] | tuple[type[Exception], ...] = (),
    ) -> None:
        self.task(
            name=name,
            timeout=timeout,
            max_snoozes=max_snoozes,
            isolated=isolated,
            retry_without_attempt=retry_without_attempt,
        )(fn)

    def tasks(self) -> dict[str, Task]:
        return dict(self._tasks)

    def __getitem__(self, name: str) -> Handler:
        return self._tasks[name].fn

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)


#: The default registry, for ``@task``-decorated functions.
tasks = TaskRegistry()
task = tasks.task


# A typed task's job fields, which a schedule of it shares.
_JOB_FIELDS = ("queue", "priority", "max_attempts")


def _typed(
    name: str, fn: Callable[..., Any], options: dict[str, Any], isolated: bool
) -> TypedTask[Any, Any]:
    if isolated:
        raise ValueError(f"task {name!r}: a typed task cannot be isolated (yet)")
    fields = {key: options[key] for key in _JOB_FIELDS if key in options}
    if not {"cron", "every"} & options.keys():
        for key in fields:  # not a schedule's: the task's own
            del options[key]
    return TypedTask(name, fn, fields)


def _not_an_option(name: str, given: list[str], typed: bool) -> str:
    """Why ``task()`` refuses ``given``: without cron= or every= they are no
    schedule's, and a handler of Job takes no job field (its producer, not
    its worker, sets them)."""
    words = f"task {name!r}: unknown option(s) {', '.join(given)}"
    fields = [key for key in given if key in _JOB_FIELDS]
    if fields and not typed:
        return (
            f"{words}: a handler that takes a Job gets {', '.join(fields)} from each "
            f"job, given at enqueue (queue.enqueue({name!r}, payload, {fields[0]}=...)); "
            "a typed task (parameters for the payload) takes them here"
        )
    return f"{words}; a schedule's options need cron= or every="


class Register(Protocol):
    """What ``TaskRegistry.task(...)`` with options returns."""

    @overload
    def __call__(self, fn: Callable[[Job], R], /) -> Callable[[Job], R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> TypedTask[P, R]: ...


def resolve_tasks(handlers: Mapping[str, Any] | TaskRegistry) -> dict[str, Task]:
    """Normalise what the worker was given into ``{name: Task}``."""
    if isinstance(handlers, TaskRegistry):
        return handlers.tasks()
    if not isinstance(handlers, Mapping):
        raise TypeError(
            "handlers must be a mapping of task name to callable, or a TaskRegistry; "
            f"got {type(handlers).__name__}"
        )
    out = {}
    for name, fn in handlers.items():
        if not isinstance(name, str):
            raise TypeError(f"task names must be strings, got {name!r}")
        out[name] = fn if isinstance(fn, Task) else _task(name, fn)
    return out


def resolve_schedules(handlers: Mapping[str, Any] | TaskRegistry) -> list[Schedule] | None:
    """The schedules a registry declares; None for a plain mapping, which
    declares none and so owns none (its worker leaves the table as it is)."""
    return handlers.schedules() if isinstance(handlers, TaskRegistry) else None


def load_handlers(spec: str) -> dict[str, Task]:
    """Import ``"package.module:ATTR"``: a mapping or a TaskRegistry."""
    return resolve_tasks(load_target(spec))


def find_target(spec: str) -> None:
    """Check what can be checked of ``"package.module:ATTR"`` without running
    any of its code: its shape, and that its top-level module exists."""
    module_name, _ = _split_target(spec)
    top = module_name.partition(".")[0]
    if importlib.util.find_spec(top) is None:
        raise ModuleNotFoundError(f"No module named {top!r}", name=top)


def load_target(spec: str) -> Mapping[str, Any] | TaskRegistry:
    """What ``"package.module:ATTR"`` names: a mapping or a TaskRegistry
    (a zero-argument factory is called)."""
    module_name, attr = _split_target(spec)
    module = importlib.import_module(module_name)
    try:
        target: Any = module
        for part in attr.split("."):
            target = getattr(target, part)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None
    if callable(target) and not isinstance(target, Mapping):
        target = target()  # a factory returning the mapping
    if not isinstance(target, Mapping):
        resolve_tasks(target)  # raises, naming what it got
    return target  # type: ignore[no-any-return]


def _split_target(spec: str) -> tuple[str, str]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"handlers must look like 'package.module:ATTR', got {spec!r}")
    return module_name, attr
