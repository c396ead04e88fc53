"""Every part of the package has a place in the import contracts
(pyproject.toml), so that a module added at the top level is checked the
day it is added: packages are named by the contracts as a whole, and the
top-level modules either stand below the worker, the API and the command
line (the contract that forbids importing them) or are entry points, which
may import everything."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pgqueue

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(pgqueue.__file__).parent

# What starts a process or a user's test run: these sit above everything.
ENTRY_POINTS = {"__init__", "__main__", "console", "testing", "pytest_plugin"}
# The layers above the core, each the subject of a contract of its own.
FACES = {"api", "cli", "worker", "integrations"}
UPWARD = "The core, the database layer and the faces know nothing of the worker"


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _below_the_faces() -> set[str]:
    [contract] = [c for c in _contracts() if str(c["name"]).startswith(UPWARD)]
    sources = contract["source_modules"]
    assert isinstance(sources, list)
    return {name.removeprefix("pgqueue.") for name in sources}


def test_every_top_level_module_and_package_has_a_place_in_the_contracts() -> None:
    parts = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    }
    placed = _below_the_faces() | ENTRY_POINTS | FACES
    assert parts - placed == set(), "add it to a contract in pyproject.toml"
    assert {"core", "db", "queue"} <= _below_the_faces()


def test_the_contracts_name_only_parts_that_exist() -> None:
    for name in _below_the_faces():
        path = PACKAGE / name
        assert path.with_suffix(".py").exists() or (path / "__init__.py").exists(), name
