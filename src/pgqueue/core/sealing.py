"""Payloads encrypted at rest: what is sealed, how, and how keys rotate
(docs/howto/encryption.md).

A task named in ``Settings.encrypted_tasks`` has its payload sealed by the
producer before anything is sent to the database, with the first of
``Settings.encryption_keys`` (Fernet from ``cryptography``: AES-128-CBC and
an HMAC-SHA256, so an altered payload is refused, not misread); the worker
opens it with whichever of its keys has the id the payload names, just
before the handler runs. The row holds only the envelope::

    {"pgqueue:sealed": 1, "key": "2026-12", "token": "gAAAAAB..."}

Rotation: put a new key first and keep the old ones after it (workers open
either), then ``reseal`` rewrites, page by page, every stored payload sealed
with another key than the first; once none is left the old keys can go.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import InvalidSettings, PayloadNotOpened
from .flows import Flow, Statement
from .job_spec import JobSpec
from .rules import SEALED_KEY

if TYPE_CHECKING:
    from cryptography.fernet import Fernet

__all__ = ["ALL_TASKS", "SEALED", "Sealing", "generate_key", "is_sealed", "reseal"]

SEALED = SEALED_KEY
# In encrypted_tasks: every task's payload.
ALL_TASKS = "*"
_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
_INSTALL = "payload encryption needs the cryptography package: pip install 'pgqueue[encryption]'"


def is_sealed(payload: Any) -> bool:
    """Whether a payload as read from the database is a sealed envelope
    (what the worker checks on every job: two cheap tests)."""
    return type(payload) is dict and SEALED in payload


def _fernet(key_id: str, key: str) -> Fernet:
    try:
        from cryptography.fernet import Fernet
    except ImportError:  # pragma: no cover - the extra is part of pgqueue[all]
        raise InvalidSettings(_INSTALL) from None
    try:
        return Fernet(key.encode())
    except (ValueError, TypeError):
        raise InvalidSettings(
            f"encryption_keys: the key {key_id!r} is not a Fernet key (32 bytes in url-safe "
            "base64); make one with `pgqueue keys generate`"
        ) from None


def generate_key(key_id: str) -> str:
    """A new ``ID:KEY`` entry for ``encryption_keys``."""
    if not _KEY_ID.match(key_id):
        raise InvalidSettings(f"a key id is 1 to 32 of A-Z a-z 0-9 _ . -, got {key_id!r}")
    try:
        from cryptography.fernet import Fernet
    except ImportError:  # pragma: no cover
        raise InvalidSettings(_INSTALL) from None
    return f"{key_id}:{Fernet.generate_key().decode()}"


@dataclass(frozen=True, slots=True)
class Sealing:
    """The keys by id (the first seals) and the tasks whose payloads are
    sealed (None: every task). ``Sealing()`` seals nothing and opens nothing."""

    keys: tuple[tuple[str, Fernet], ...] = ()
    tasks: frozenset[str] | None = frozenset()

    @classmethod
    def of(cls, keys: Sequence[str], tasks: Sequence[str]) -> Sealing:
        """From the settings' entries; InvalidSettings names a bad one."""
        parsed: list[tuple[str, Fernet]] = []
        for entry in keys:
            key_id, sep, key = entry.partition(":") if isinstance(entry, str) else ("", "", "")
            if not sep or not _KEY_ID.match(key_id):
                raise InvalidSettings(
                    "encryption_keys: each entry is ID:KEY (an id of 1 to 32 of A-Z a-z 0-9 _ . -, "
                    "then the key); make one with `pgqueue keys generate`"
                )
            if any(key_id == known for known, _ in parsed):
                raise InvalidSettings(f"encryption_keys: the id {key_id!r} is given twice")
            parsed.append((key_id, _fernet(key_id, key)))
        names = frozenset(tasks)
        if names and not parsed:
            raise InvalidSettings(
                "encrypted_tasks needs encryption_keys: the key that seals their payloads"
            )
        return cls(tuple(parsed), None if ALL_TASKS in names else names)

    @property
    def primary(self) -> str | None:
        """The id of the key that seals (the first)."""
        return self.keys[0][0] if self.keys else None

    def applies(self, task: str) -> bool:
        return bool(self.keys) and (self.tasks is None or task in self.tasks)

    def seal_specs(self, specs: list[JobSpec]) -> list[JobSpec]:
        """The specs, each payload of a sealed task sealed (once: a spec
        sealed already is left as it is)."""
        if not self.keys:
            return specs
        return [self._sealed_spec(spec) if self.applies(spec.task) else spec for spec in specs]

    def _sealed_spec(self, spec: JobSpec) -> JobSpec:
        if spec.payload_json.startswith('{"' + SEALED):
            return spec
        return spec._replace(payload_json=self._envelope(spec.payload_json))

    def _envelope(self, payload_json: str) -> str:
        key_id, fernet = self.keys[0]
        token = fernet.encrypt(payload_json.encode()).decode()
        return json.dumps({SEALED: 1, "key": key_id, "token": token}, separators=(",", ":"))

    def open(self, job_id: int, payload: dict[str, Any]) -> Any:
        """The payload a sealed envelope holds; PayloadNotOpened when no key
        has its id, or it was altered."""
        key_id, token = payload.get("key"), payload.get("token")
        fernet = next((f for known, f in self.keys if known == key_id), None)
        if fernet is None:
            have = ", ".join(repr(known) for known, _ in self.keys) or "none"
            raise PayloadNotOpened(
                job_id,
                f"it was sealed with the key {key_id!r}, and this worker's "
                f"encryption_keys have {have}",
            )
        from cryptography.fernet import InvalidToken

        try:
            return json.loads(fernet.decrypt(str(token).encode()))
        except (InvalidToken, ValueError):
            raise PayloadNotOpened(
                job_id, f"the key {key_id!r} does not open it (altered, or another key of that id)"
            ) from None

    def resealed(self, job_id: int, payload: dict[str, Any]) -> str:
        """A stored envelope sealed again with the first key."""
        return self._envelope(json.dumps(self.open(job_id, payload), separators=(",", ":")))


# Jobs read and rewritten per statement by a rotation.
RESEAL_PAGE = 500


def reseal(sealing: Sealing) -> Flow[int]:
    """Seal again, with the first key, every stored payload sealed with
    another, a page at a time (each its own statement: run it outside a
    transaction, and a rotation cut short resumes where it is run again);
    how many were rewritten. PayloadNotOpened names a job no key opens."""
    if sealing.primary is None:
        raise InvalidSettings("rotating keys needs encryption_keys (the new key first)")
    after, total = 0, 0
    while True:
        rows = yield Statement(
            "job_sealed_page",
            {"after": after, "primary": sealing.primary, "limit": RESEAL_PAGE},
        )
        if not rows:
            return total
        ids = [row["id"] for row in rows]
        payloads = [sealing.resealed(row["id"], row["payload"]) for row in rows]
        written = yield Statement(
            "job_reseal", {"ids": ids, "payloads": payloads, "primary": sealing.primary}
        )
        after, total = ids[-1], total + len(written)
