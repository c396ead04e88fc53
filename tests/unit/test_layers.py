"""The layers of the package import only downwards (like an import-linter contract)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "pgqueue"
# The core knows nothing of the runtime, the HTTP layer or the command line.
CORE = [
    "jobs.py",
    "transitions.py",
    "queue.py",
    "settings.py",
    "errors.py",
    "migrate.py",
    "embedded.py",
    "_asyncpg.py",
    "sql/__init__.py",
]
OUTER = ("worker", "api", "cli")


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_core_modules_do_not_import_the_outer_layers() -> None:
    for name in CORE:
        for module in imported_modules(PACKAGE / name):
            parts = module.lstrip(".").split(".")
            stripped = parts[1:] if parts[0] == "pgqueue" else parts
            assert not stripped or stripped[0] not in OUTER, f"{name} imports {module}"


def test_the_api_and_the_worker_do_not_import_each_other_or_the_cli() -> None:
    for layer, forbidden in (("api", ("worker", "cli")), ("worker", ("api", "cli"))):
        for path in (PACKAGE / layer).rglob("*.py"):
            for module in imported_modules(path):
                parts = module.lstrip(".").split(".")
                assert not set(parts) & set(forbidden), f"{path.name} imports {module}"
