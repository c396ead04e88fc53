"""Run a few child processes as one: ``pgqueue up``.

Each child starts in a process group of its own, so the terminal's Ctrl-C
reaches only the supervisor, which then stops the children in order: it
forwards the signal it got to every child's group (grandchildren included),
waits up to ``stop_timeout`` seconds, and kills whatever is left. A second
Ctrl-C kills at once. When any child exits on its own, the rest are stopped
the same way. Output of every child is read line by line and printed with
the child's name in front, in one stream.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.text import Text

__all__ = ["Supervisor"]

_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta")


@dataclass
class _Child:
    name: str
    colour: str
    process: subprocess.Popen[bytes]
    reader: threading.Thread | None = None
    expected_exit: bool = False

    @property
    def pgid(self) -> int:
        return self.process.pid  # the child leads its own group


@dataclass
class Supervisor:
    console: Console
    stop_timeout: float = 35.0
    children: list[_Child] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _signals: list[int] = field(default_factory=list)
    _tails: list[threading.Thread] = field(default_factory=list)

    # -- output -----------------------------------------------------------------

    def say(self, name: str, line: str, colour: str = "bold") -> None:
        """Print one line with a name prefix, whole, under the shared lock."""
        text = Text.assemble((f"{name:>9} | ", colour), line)
        with self._lock:
            self.console.print(text, soft_wrap=True, highlight=False, markup=False)

    def _pump(self, child: _Child) -> None:
        assert child.process.stdout is not None
        for raw in iter(child.process.stdout.readline, b""):
            self.say(child.name, raw.decode("utf-8", "replace").rstrip("\r\n"), child.colour)

    def tail(self, name: str, path: Path) -> None:
        """Follow a log file from its current end (the server's log)."""
        colour = _COLOURS[(len(self.children) + len(self._tails)) % len(_COLOURS)]

        def follow() -> None:
            with contextlib.suppress(OSError), open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                while not self._stop.is_set():
                    line = handle.readline()
                    if line:
                        self.say(name, line.decode("utf-8", "replace").rstrip("\r\n"), colour)
                    else:
                        self._stop.wait(0.25)

        thread = threading.Thread(target=follow, name=f"tail-{name}", daemon=True)
        thread.start()
        self._tails.append(thread)

    # -- lifecycle ----------------------------------------------------------------

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
        colour = _COLOURS[len(self.children) % len(_COLOURS)]
        process = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        child = _Child(name, colour, process)
        child.reader = threading.Thread(
            target=self._pump, args=(child,), name=f"pump-{name}", daemon=True
        )
        child.reader.start()
        self.children.append(child)

    def run(self, on_ready: Callable[[], bool] | None = None) -> int:
        """Block until a signal or until a child exits; stop all; the exit code.

        ``on_ready`` is polled until it returns True (for a one-time banner).
        Exit code: 0 after a signal with every child stopping cleanly, else 1.
        """
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            ready = on_ready is None
            failed: _Child | None = None
            while not self._signals:
                failed = next((c for c in self.children if c.process.poll() is not None), None)
                if failed is not None:
                    break
                if not ready and on_ready is not None:
                    ready = on_ready()
                self._stop.wait(0.1)
            if failed is not None:
                self.say(
                    "up",
                    f"{failed.name} exited with code {failed.process.returncode};"
                    " stopping everything",
                    "bold red",
                )
                self.stop(signal.SIGTERM)
                return 1
            sig = self._signals[0]
            self.say(
                "up",
                f"got {signal.Signals(sig).name}; stopping "
                f"{len(self.children)} processes (up to {self.stop_timeout:g}s)",
            )
            clean = self.stop(sig)
            return 0 if clean else 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)
        if len(self._signals) > 1:  # a second Ctrl-C: no more waiting
            for child in self.children:
                _killpg(child.pgid, signal.SIGKILL)
        self._stop.set()

    def stop(self, sig: int) -> bool:
        """Forward ``sig`` to every child's group, wait, kill stragglers.

        True when every child exited with code 0 (or by the forwarded signal)
        within the timeout and left nothing behind in its group.
        """
        self._stop.set()
        for child in self.children:
            if child.process.poll() is None:
                _killpg(child.pgid, sig)
        deadline = time.monotonic() + self.stop_timeout
        clean = True
        for child in self.children:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(
                    "up",
                    f"{child.name} did not stop within {self.stop_timeout:g}s; killing it",
                    "bold red",
                )
                _killpg(child.pgid, signal.SIGKILL)
                child.process.wait()
                clean = False
        # Grandchildren that outlived their parent are still in its group.
        for child in self.children:
            while _group_alive(child.pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _group_alive(child.pgid):
                self.say("up", f"killing what is left of {child.name}'s process group", "bold red")
                _killpg(child.pgid, signal.SIGKILL)
                clean = False
        for child in self.children:
            if child.reader is not None:
                child.reader.join(timeout=2.0)
            code = child.process.returncode
            ok = code in (0, -sig, 128 + sig)
            clean = clean and ok
            self.say("up", f"{child.name} exited with code {code}", "bold" if ok else "bold red")
        return clean


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
