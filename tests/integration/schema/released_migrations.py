"""The sets of migration files earlier versions of pgqueue shipped.

pgqueue has no release tags, so every set of migration files the git
history of ``src/pgqueue/migrations`` ever held counts as a version someone
may have migrated with. The tests read them from ``released_migrations.json``
beside this module, not from git: CI runs on clones of any depth, and a
shallow one has no history to read. The snapshot holds each distinct file
text once, keyed by its SHA-256, and each version as its name (the first
commit that held its files, 8 characters) and its files, (version, hash) in
the order they apply. Today's set is left out: it is what ``migrate()``
gives a fresh database, and leaving it out keeps the snapshot valid when a
migration is added.

When a migration is added or changed, the set before the change becomes a
released one: refresh the snapshot from a full clone and commit it with the
change (a test compares it with the history wherever the history is whole)::

    .venv/bin/python -m tests.integration.schema.released_migrations --refresh
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pgqueue.sql import migration_files

ROOT = Path(__file__).resolve().parents[3]
MIGRATIONS = "src/pgqueue/migrations"
SNAPSHOT = Path(__file__).with_name("released_migrations.json")
REFRESH = "python -m tests.integration.schema.released_migrations --refresh"

Files = tuple[tuple[str, str], ...]  # (version, SQL), in the order they apply


@dataclass(frozen=True)
class Version:
    """One set of migration files the history held, named by its first commit."""

    name: str
    files: Files


class HistoryUnavailable(Exception):
    """No git, no repository, or a shallow clone: the history is not whole."""


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def todays_files() -> Files:
    return tuple(migration_files())


def read_snapshot(path: Path = SNAPSHOT) -> list[Version]:
    snapshot = json.loads(path.read_text("utf-8"))
    texts: dict[str, str] = snapshot["texts"]
    return [
        Version(entry["name"], tuple((version, texts[key]) for version, key in entry["files"]))
        for entry in snapshot["versions"]
    ]


def write_snapshot(versions: Sequence[Version], path: Path = SNAPSHOT) -> None:
    texts = {digest(text): text for version in versions for _, text in version.files}
    entries = [
        {"name": version.name, "files": [[name, digest(text)] for name, text in version.files]}
        for version in versions
    ]
    snapshot = {"texts": dict(sorted(texts.items())), "versions": entries}
    path.write_text(json.dumps(snapshot, indent=1, ensure_ascii=False) + "\n", "utf-8")


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, encoding="utf-8", check=True
    ).stdout


def history_versions() -> list[Version]:
    """Every distinct set of migration files in the history of HEAD, in the
    order they first appeared. ``--full-history`` keeps the commits that
    added 0009 and deleted it, which a simplified history hides (they cancel
    out)."""
    try:
        if git("rev-parse", "--is-shallow-repository").strip() != "false":
            raise HistoryUnavailable("a shallow clone: git fetch --unshallow")
        revs = git("rev-list", "--full-history", "--reverse", "HEAD", "--", MIGRATIONS).split()
        first_commit_of_tree: dict[str, str] = {}
        for rev in revs:
            if git("ls-tree", rev, f"{MIGRATIONS}/"):
                tree = git("rev-parse", f"{rev}:{MIGRATIONS}").strip()
                first_commit_of_tree.setdefault(tree, rev)
        blobs: dict[str, str] = {}
        return [Version(rev[:8], files_at(rev, blobs)) for rev in first_commit_of_tree.values()]
    except (OSError, subprocess.CalledProcessError) as error:
        raise HistoryUnavailable(f"git cannot read the history of {MIGRATIONS}: {error}") from error


def files_at(rev: str, blobs: dict[str, str]) -> Files:
    """The migrations at ``rev``; ``blobs`` keeps each file text read, by
    blob id, as most files are the same from one set to the next."""
    files = []
    for line in sorted(git("ls-tree", f"{rev}:{MIGRATIONS}").splitlines(), key=file_name):
        name, blob = file_name(line), line.split()[2]  # "<mode> blob <id>\t<name>"
        if name.endswith(".sql"):
            if blob not in blobs:
                blobs[blob] = git("cat-file", "blob", blob)
            files.append((name.removesuffix(".sql"), blobs[blob]))
    return tuple(files)


def file_name(ls_tree_line: str) -> str:
    return ls_tree_line.split("\t", 1)[1]


def released_from_history() -> list[Version]:
    """The history's sets but today's: what the snapshot must hold."""
    today = todays_files()
    return [version for version in history_versions() if version.files != today]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--refresh",
        action="store_true",
        required=True,
        help=f"rewrite {SNAPSHOT.name} from the git history (needs a full clone)",
    )
    parser.parse_args()
    try:
        versions = released_from_history()
    except HistoryUnavailable as error:
        parser.exit(1, f"{error}\n")
    write_snapshot(versions)
    print(f"{SNAPSHOT}: {len(versions)} sets of migration files")


if __name__ == "__main__":
    main()
