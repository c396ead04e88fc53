"""Run a few child processes as one: ``pgqueue up`` and ``pgqueue worker --processes N``.

Each child leads a process group of its own, so the terminal's Ctrl-C reaches
only the supervisor, which then stops the children in order:

- the first SIGINT or SIGTERM is forwarded to every child (a graceful stop:
  each child decides how to stop what it started, e.g. a worker finishes its
  running jobs); whatever is left of a child's group ``stop_timeout`` seconds
  later is killed (SIGKILL);
- a second signal kills every child's group at once;
- a child that exits by itself is started again if its spec says ``restart``
  (at once, or after 1, 2, 4 ... 30 s while it keeps dying young); any other
  child that exits stops them all, and the exit code is 1.

The exit code is 0 only after a stop asked for by a signal in which every
child ended with 0 (or by the signal it was sent) in time and left nothing
behind in its group.

What the supervisor says goes to ``on_event(action, message, level)``; the
children's output either goes where the supervisor's goes (inherited), or,
with ``on_output(name, line)``, is read line by line and handed over, so that
the caller can print it with the child's name in front.

A child whose spec has ``fork`` starts the first time as a fork of the
supervisor running that function, when nothing else runs in this process
(one thread, output inherited): it has no interpreter to start and nothing
to import again, which is most of a worker process's start. Restarts, and a
first start that cannot be a fork, run ``argv``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

__all__ = ["Child", "EventSink", "OutputSink", "ProcessSupervisor"]

log = logging.getLogger("pgqueue.processes")

OutputSink = Callable[[str, str], None]  # (child name, line)
EventSink = Callable[[str, str, int], None]  # (action, message, logging level)

# A child that dies within this many seconds of its start is restarted after a
# growing delay (1, 2, 4 ... 30 s), so that a broken deploy does not spin.
YOUNG_SECONDS = 10.0
RESTART_DELAY_MAX = 30.0
_TICK = 0.05


@dataclass(frozen=True)
class Child:
    """What to run: ``argv`` with ``env`` (None: the supervisor's), ``stdin``
    bytes written to it (None: no input), ``restart`` when it dies; ``fork``:
    what a fork of the supervisor runs instead at the first start (its
    return value is the exit code), when it can (see the module's doc)."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    stdin: bytes | None = None
    restart: bool = False
    fork: Callable[[], int] | None = None


class _Forked:
    """A child made by ``os.fork``, with the part of Popen's face the
    supervisor uses."""

    stdout = None

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def _fork(run: Callable[[], int]) -> _Forked:
    """Run ``run`` in a fork that leads a process group of its own, with the
    default signal dispositions (the supervisor's handlers are not its)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: it never returns from here
        code = 1
        try:
            os.setpgid(0, 0)
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            code = run()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            # Not the supervisor's atexit handlers (an embedded server's stop).
            os._exit(code)
    # Also here: a signal to the group must not find it missing in between.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.setpgid(pid, pid)
    return _Forked(pid)


@dataclass
class _Running:
    spec: Child
    process: subprocess.Popen[bytes] | _Forked | None = None
    reader: threading.Thread | None = None
    started_at: float = 0.0
    restart_at: float = 0.0
    quick_deaths: int = 0
    starts: int = 0

    @property
    def pgid(self) -> int:
        assert self.process is not None
        return self.process.pid  # the child leads its own group


def _log_event(action: str, message: str, level: int) -> None:
    log.log(level, message, extra={"action": action})


@dataclass
class ProcessSupervisor:
    children: Sequence[Child]
    stop_timeout: float
    on_event: EventSink = _log_event
    on_output: OutputSink | None = None
    _running: list[_Running] = field(default_factory=list)
    _signals: list[int] = field(default_factory=list)
    _stopping: bool = False

    def run(
        self,
        on_ready: Callable[[], bool] | None = None,
        after_start: Callable[[], object] | None = None,
    ) -> int:
        """Start the children and supervise them until a signal, or until a
        child that is not restarted exits; stop them all; the exit code.
        ``on_ready`` is polled until it returns True (for a one-time banner).
        ``after_start`` runs once they are started: if it raises, they are
        stopped and the exception propagates."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            self._running = [_Running(spec) for spec in self.children]
            for child in self._running:
                self._spawn(child)
            names = ", ".join(spec.name for spec in self.children)
            self.on_event("start", f"started {len(self.children)} processes: {names}", logging.INFO)
            if after_start is not None:
                try:
                    after_start()
                except BaseException:
                    self.stop(signal.SIGTERM)
                    raise
            failed = self._watch(on_ready)
            if failed is not None:
                assert failed.process is not None
                self.on_event(
                    "exit",
                    f"{failed.spec.name} exited with code {failed.process.returncode};"
                    " stopping everything",
                    logging.ERROR,
                )
                self.stop(signal.SIGTERM)
                return 1
            sig = self._signals[0]
            self.on_event(
                "shutdown",
                f"got {signal.Signals(sig).name}; stopping {len(self._live())} processes "
                f"(up to {self.stop_timeout:g}s)",
                logging.INFO,
            )
            return 0 if self.stop(sig) else 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # No lock may be taken here (the signal module's documentation warns
        # of deadlocks): the handler runs on the main thread between two of
        # its bytecodes, perhaps while that thread holds the lock, as a
        # threading.Event's wait holds its own for a moment each tick. The
        # Event this replaces is the likely cause of a supervisor that once
        # ignored a SIGTERM for 30 s. _watch sees the list within a tick.
        self._signals.append(signum)
        if self._stopping or len(self._signals) > 1:  # asked again: no more waiting
            for child in self._live():
                _killpg(child.pgid, signal.SIGKILL)

    def _watch(self, on_ready: Callable[[], bool] | None) -> _Running | None:
        """Until a signal: restart children that may be, return one that may not."""
        ready = on_ready is None
        while not self._signals:
            now = time.monotonic()
            for child in self._running:
                if child.process is None:
                    if now >= child.restart_at:
                        self._spawn(child)
                elif child.process.poll() is not None:
                    if not child.spec.restart:
                        return child
                    self._schedule_restart(child, now)
            if not ready and on_ready is not None:
                ready = on_ready()
            time.sleep(_TICK)
        return None

    def _schedule_restart(self, child: _Running, now: float) -> None:
        assert child.process is not None
        code = child.process.returncode
        self._reap(child)
        young = now - child.started_at < YOUNG_SECONDS
        child.quick_deaths = child.quick_deaths + 1 if young else 0
        delay = min(RESTART_DELAY_MAX, 2.0 ** (child.quick_deaths - 1)) if young else 0.0
        child.restart_at = now + delay
        self.on_event(
            "restart",
            f"{child.spec.name} exited with {code}; restarting in {delay:.0f} s",
            logging.WARNING,
        )

    def _spawn(self, child: _Running) -> None:
        child.starts += 1
        piped = self.on_output is not None
        fork = child.spec.fork
        if fork is not None and child.starts == 1 and not piped and threading.active_count() == 1:
            child.process, child.started_at = _fork(fork), time.monotonic()
            return
        process = subprocess.Popen(
            list(child.spec.argv),
            env=None if child.spec.env is None else dict(child.spec.env),
            stdin=subprocess.DEVNULL if child.spec.stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE if piped else None,
            stderr=subprocess.STDOUT if piped else None,
            process_group=0,
        )
        if child.spec.stdin is not None:
            assert process.stdin is not None
            # A child that dies at once closes the pipe; _watch sees the death.
            with contextlib.suppress(BrokenPipeError):
                process.stdin.write(child.spec.stdin)
            with contextlib.suppress(BrokenPipeError):
                process.stdin.close()
        child.process, child.started_at = process, time.monotonic()
        if self.on_output is not None:
            child.reader = threading.Thread(
                target=self._pump, args=(child.spec.name, process), daemon=True
            )
            child.reader.start()

    def _pump(self, name: str, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None and self.on_output is not None
        for raw in iter(process.stdout.readline, b""):
            self.on_output(name, raw.decode("utf-8", "replace").rstrip("\r\n"))

    def _reap(self, child: _Running) -> None:
        """Forget a child that exited, once its last output is read (unless a
        grandchild still holds the pipe: its reader then runs on to the end)."""
        if child.reader is not None:
            child.reader.join(timeout=2.0)
        stdout = child.process.stdout if child.process is not None else None
        if stdout is not None and not (child.reader and child.reader.is_alive()):
            stdout.close()
        child.process, child.reader = None, None

    def _live(self) -> list[_Running]:
        return [c for c in self._running if c.process is not None]

    # -- stopping -------------------------------------------------------------

    def stop(self, sig: int) -> bool:
        """Forward ``sig`` to every child, wait, kill what is left. True when
        every child ended with 0 (or by ``sig``) in time, leaving nothing
        behind in its group. A child that died by itself just before, and
        would have been restarted, is not asked and not counted."""
        self._stopping = True
        for child in self._live():
            assert child.process is not None
            if child.spec.restart and child.process.poll() is not None:
                self._reap(child)
        stopping = self._live()
        for child in stopping:
            assert child.process is not None
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(sig)
        deadline = time.monotonic() + self.stop_timeout
        clean = True
        for child in stopping:
            clean = self._wait(child, deadline) and clean
        for child in stopping:
            clean = self._empty_group(child, deadline) and clean
        for child in stopping:
            clean = self._report(child, sig) and clean
        return clean

    def _wait(self, child: _Running, deadline: float) -> bool:
        assert child.process is not None
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            self.on_event(
                "kill",
                f"{child.spec.name} did not stop within {self.stop_timeout:g}s; killing it",
                logging.ERROR,
            )
            _killpg(child.pgid, signal.SIGKILL)
            child.process.wait()
            return False

    def _empty_group(self, child: _Running, deadline: float) -> bool:
        """Grandchildren that outlived their parent are still in its group."""
        while _group_alive(child.pgid) and time.monotonic() < deadline:
            time.sleep(_TICK)
        if not _group_alive(child.pgid):
            return True
        self.on_event(
            "kill", f"killing what is left of {child.spec.name}'s process group", logging.ERROR
        )
        _killpg(child.pgid, signal.SIGKILL)
        return False

    def _report(self, child: _Running, sig: int) -> bool:
        assert child.process is not None
        code = child.process.returncode
        ok = code in (0, -sig, 128 + sig)
        self._reap(child)
        self.on_event(
            "exited",
            f"{child.spec.name} exited with code {code}",
            logging.INFO if ok else logging.ERROR,
        )
        return ok


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process remains in the group."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # not Linux: fall back to the kernel's answer
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode("ascii", "replace")
        except OSError:
            continue
        # Fields after the ")" that closes the command name: state ppid pgrp ...
        parts = stat[stat.rindex(")") + 2 :].split()
        if int(parts[2]) == pgid and parts[0] not in ("Z", "X"):
            return True
    return False
