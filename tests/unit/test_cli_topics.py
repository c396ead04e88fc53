"""The console script loads only the topic modules of the command it runs
(pgqueue.cli.topics_for): each command must find under it all it has when
every topic is loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from pgqueue.cli import COMMAND_TOPICS

# Prints every command path of the root group, loaded as the console script
# loads it for the command line given in argv[1] (JSON; null: everything).
TREE = """
import json, sys
from pgqueue import console
console.command_line = json.loads(sys.argv[1])
import typer.main
from pgqueue.cli import app

def walk(command, path):
    yield " ".join(path)
    for name, sub in getattr(command, "commands", {}).items():
        yield from walk(sub, (*path, name))

print(json.dumps(sorted(walk(typer.main.get_command(app), ()))))
"""


def command_paths(command_line: list[str] | None) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", TREE, json.dumps(command_line)],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout))


def test_every_top_level_command_has_its_topics_listed() -> None:
    everything = command_paths(None)
    top_level = {path for path in everything if path and " " not in path}
    assert top_level == set(COMMAND_TOPICS)


def test_each_command_alone_loads_all_that_lies_under_it() -> None:
    everything = command_paths(None)
    commands = sorted(COMMAND_TOPICS)
    with ThreadPoolExecutor(max_workers=4) as pool:
        paths = pool.map(lambda c: command_paths([c, "--help"]), commands)
        loaded = dict(zip(commands, paths, strict=True))
    for command in commands:
        under = {path for path in everything if path.split(" ")[0] == command}
        assert under <= loaded[command], command
        # Only what it needs: another command's subcommands come along only
        # from a topic module they share (the root's own groups are empty).
        for path in loaded[command] - under - {""}:
            other = path.split(" ")[0]
            shared = set(COMMAND_TOPICS[other]) & set(COMMAND_TOPICS[command])
            assert shared or path == other, (command, path)


def test_a_command_line_naming_no_command_loads_everything() -> None:
    assert command_paths(["--help"]) == command_paths(None)
    assert command_paths(["wroker"]) == command_paths(None)


# Runs the console script's command line given in argv[1] (JSON), then
# prints the modules it imported (JSON).
RUN = """
import json, runpy, sys
sys.argv = ["pgqueue", *json.loads(sys.argv[1])]
try:
    runpy.run_module("pgqueue", run_name="__main__")
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.__stdout__)
"""


def imported_by(line: list[str]) -> set[str]:
    unreachable = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2"
    out = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(["--database-url", unreachable, *line])],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_command_parses_its_line_without_importing_pydantic() -> None:
    """Typer from 0.29 on builds a pydantic TypeAdapter per parameter: 0.02 to
    0.1 s of a command's start (pyproject.toml keeps it below)."""
    for line in (["jobs", "list"], ["enqueue", "t", "--payload", "{}"], ["worker", "--help"]):
        imported = imported_by(line)
        assert "typer" in imported, line  # the command line was parsed
        assert "pydantic" not in imported, line


def test_the_worker_command_imports_no_queue_face() -> None:
    """What ``pgqueue worker`` imports before it forks its processes is paid
    once per start, before any job runs: the Queue faces are not needed."""
    imported = imported_by(["worker", "--help"])
    assert "pgqueue.worker.processes" in imported
    assert not {name for name in imported if name.startswith(("pgqueue.queue", "pgqueue.clusters"))}
