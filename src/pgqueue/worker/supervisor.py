"""Several worker processes under one supervisor.

The supervisor starts P children (``python -c`` running ``child_main``, each
in its own session so that a terminal's Ctrl-C reaches only the supervisor),
restarts a child that dies (with a growing delay if it keeps dying young),
and forwards SIGTERM/SIGINT: the first asks every child to shut down
gracefully, a second makes them exit at once. A child whose supervisor
vanishes (SIGKILL) notices within a second and shuts down gracefully.

Its exit code is 0 when every child exited 0 after the stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from types import FrameType

from ..settings import Settings

__all__ = ["Supervisor", "child_main"]

log = logging.getLogger("pgqueue.worker")

# A child that dies within this many seconds of starting is restarted after
# a growing delay (1, 2, 4 ... 30 s), so that a broken deploy does not spin.
YOUNG_SECONDS = 10.0
RESTART_DELAY_MAX = 30.0
# Past the workers' own shutdown timeout, how long before children are killed.
KILL_GRACE_SECONDS = 10.0
_CHILD_COMMAND = "from pgqueue.worker.supervisor import child_main; child_main()"


@dataclass
class _Child:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    quick_deaths: int = 0
    restart_at: float = 0.0
    exit_codes: list[int] = field(default_factory=list)
    # How the process that was running when the stop began ended; None for a
    # child that was already dead then (waiting to be restarted).
    stop_code: int | None = None


class Supervisor:
    def __init__(
        self,
        handlers: str,
        *,
        processes: int,
        queues: list[str] | None,
        concurrency: int,
        settings: Settings,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.handlers = handlers
        self.processes = processes
        self.queues = queues
        self.concurrency = concurrency
        self.settings = settings
        self.children = [_Child(i) for i in range(processes)]
        self._signals: list[int] = []
        self._stopping = False

    # -- running --------------------------------------------------------------

    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for child in self.children:
                self._spawn(child)
            log.info(
                "supervisor %d started %d worker processes",
                os.getpid(),
                self.processes,
                extra={"action": "start", "worker_id": f"supervisor:{os.getpid()}"},
            )
            return self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    def _loop(self) -> int:
        forwarded = 0
        kill_at: float | None = None
        while True:
            while forwarded < len(self._signals):
                sig = self._signals[forwarded]
                forwarded += 1
                if not self._stopping:
                    self._stopping = True
                    kill_at = (
                        time.monotonic()
                        + self.settings.shutdown_timeout_seconds
                        + KILL_GRACE_SECONDS
                    )
                    log.info(
                        "supervisor received %s: stopping %d workers",
                        signal.Signals(sig).name,
                        self.processes,
                        extra={"action": "shutdown"},
                    )
                else:
                    log.warning(
                        "supervisor received %s again: workers exit at once",
                        signal.Signals(sig).name,
                        extra={"action": "shutdown"},
                    )
                self._forward(sig)
            alive = False
            now = time.monotonic()
            for child in self.children:
                proc = child.process
                if proc is not None and proc.poll() is None:
                    alive = True
                    continue
                if proc is not None:  # it just ended
                    code = proc.returncode
                    child.exit_codes.append(code)
                    child.process = None
                    if self._stopping:
                        child.stop_code = code
                    else:
                        self._schedule_restart(child, code, now)
                if not self._stopping and child.process is None and now >= child.restart_at:
                    self._spawn(child)
                    alive = True
                elif not self._stopping:
                    alive = True  # waiting to restart
            if self._stopping and not alive:
                break
            if self._stopping and kill_at is not None and now > kill_at:
                log.error(
                    "workers did not stop in time: killing them", extra={"action": "shutdown"}
                )
                self._forward(signal.SIGKILL)
                kill_at = None
            time.sleep(0.05)
        # A clean stop is judged by the processes that were asked to stop; a
        # child that had died before (and was waiting to restart) was already
        # handled by restarting it.
        codes = [c.stop_code for c in self.children if c.stop_code is not None]
        log.info("supervisor stopped (worker exit codes %s)", codes, extra={"action": "stopped"})
        return 0 if all(code == 0 for code in codes) else 1

    def _forward(self, sig: int) -> None:
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(sig)

    def _schedule_restart(self, child: _Child, code: int, now: float) -> None:
        young = now - child.started_at < YOUNG_SECONDS
        child.quick_deaths = child.quick_deaths + 1 if young else 0
        delay = min(RESTART_DELAY_MAX, 2.0 ** (child.quick_deaths - 1)) if young else 0.0
        child.restart_at = now + delay
        child.restarts += 1
        log.warning(
            "worker process %d exited with %s; restarting in %.0f s",
            child.index,
            code,
            delay,
            extra={"action": "restart"},
        )

    def _spawn(self, child: _Child) -> None:
        config = pickle.dumps(
            {
                "handlers": self.handlers,
                "queues": self.queues,
                "concurrency": self.concurrency,
                "settings": self.settings,
                "log_level": logging.getLogger("pgqueue").getEffectiveLevel(),
                "parent": os.getpid(),
            }
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD_COMMAND],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stdin is not None
        proc.stdin.write(config)
        proc.stdin.close()
        child.process = proc
        child.started_at = time.monotonic()


def child_main() -> None:
    """Entry point of a child process: read the config from stdin and work."""
    from . import run_worker

    config = pickle.loads(sys.stdin.buffer.read())
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=config["log_level"],
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
        )
    parent = config["parent"]
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    code = run_worker(
        config["handlers"],
        queues=config["queues"],
        concurrency=config["concurrency"],
        settings=config["settings"],
    )
    logging.shutdown()
    # Handler threads that outlived their timeout must not hold the exit.
    os._exit(code)


def _watch_parent(parent: int) -> None:
    """If the supervisor dies, stop gracefully rather than run orphaned."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
            return
