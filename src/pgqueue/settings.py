"""One settings object, read from arguments and PGQUEUE_* environment variables."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from typing import Any, Self

from .errors import InvalidSettings

__all__ = ["Settings"]

ENV_PREFIX = "PGQUEUE_"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything tunable, validated at construction.

    ``database_url`` empty means the embedded server in ``data_dir``.
    """

    database_url: str = ""
    data_dir: str = ".pgqueue"
    # Claiming and leases.
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    skip_locked: bool = True
    # Retries: base * 2^(attempt-1), capped, half fixed and half random.
    backoff_base_seconds: float = 1.0
    backoff_cap_seconds: float = 3600.0
    default_max_attempts: int = 5
    # Maintenance.
    reap_interval_seconds: float = 5.0
    reap_batch: int = 1000
    retention_seconds: float = 7 * 24 * 3600.0
    prune_interval_seconds: float = 60.0
    prune_batch: int = 5000
    # Connections.
    pool_min_size: int = 1
    pool_max_size: int = 10
    pool_timeout_seconds: float = 5.0
    notify_finished: bool = True
    # Worker.
    concurrency: int = 100
    poll_interval_seconds: float = 1.0
    shutdown_timeout_seconds: float = 30.0
    # HTTP API. Tokens: admin tokens may do everything, read tokens only GETs.
    # With none configured the API binds to 127.0.0.1 unless told otherwise.
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    api_tokens: tuple[str, ...] = ()
    api_read_tokens: tuple[str, ...] = ()
    api_max_body_bytes: int = 1_048_576
    api_max_batch: int = 1000
    # Without tokens, Host names the API answers to besides IP addresses,
    # localhost and api_host (a page on any other name is DNS rebinding).
    api_allowed_hosts: tuple[str, ...] = ()
    # Upper bounds of the enqueue-to-start histogram, in seconds.
    latency_buckets: tuple[float, ...] = field(
        default=(
            0.001,
            0.0025,
            0.005,
            0.01,
            0.025,
            0.05,
            0.1,
            0.25,
            0.5,
            1.0,
            2.5,
            5.0,
            10.0,
            30.0,
            60.0,
            300.0,
        )
    )

    def __post_init__(self) -> None:
        for name in (
            "lease_seconds",
            "heartbeat_seconds",
            "backoff_base_seconds",
            "backoff_cap_seconds",
            "reap_interval_seconds",
            "retention_seconds",
            "prune_interval_seconds",
            "pool_timeout_seconds",
            "poll_interval_seconds",
        ):
            if not getattr(self, name) > 0:
                raise InvalidSettings(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in (
            "reap_batch",
            "prune_batch",
            "pool_max_size",
            "concurrency",
            "default_max_attempts",
            "api_max_body_bytes",
            "api_max_batch",
        ):
            if getattr(self, name) < 1:
                raise InvalidSettings(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.pool_min_size < 0 or self.pool_min_size > self.pool_max_size:
            raise InvalidSettings("pool_min_size must be between 0 and pool_max_size")
        if self.heartbeat_seconds >= self.lease_seconds:
            raise InvalidSettings(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be shorter than "
                f"lease_seconds ({self.lease_seconds}), or leases expire between heartbeats"
            )
        if list(self.latency_buckets) != sorted(set(self.latency_buckets)):
            raise InvalidSettings("latency_buckets must be strictly increasing")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> Self:
        """Defaults, then PGQUEUE_* variables (and DATABASE_URL), then ``overrides``."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        if env.get("DATABASE_URL"):
            values["database_url"] = env["DATABASE_URL"]
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(f.name, f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)


def _parse(name: str, kind: Any, raw: str) -> Any:
    kind = str(kind)
    try:
        if kind == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind.startswith("tuple[str"):
            return tuple(x.strip() for x in raw.split(",") if x.strip())
        if kind.startswith("tuple[float"):
            return tuple(float(x) for x in raw.split(","))
        return raw
    except ValueError:
        raise InvalidSettings(
            f"{ENV_PREFIX}{name.upper()}: cannot read {raw!r} as {kind}"
        ) from None
