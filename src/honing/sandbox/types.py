"""Sandbox value types: resource limits and the structured result of one execution."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from honing.errors import HoningError


class SandboxError(HoningError):
    """Bad sandbox input (missing profile, files dir, negative limits) or a missing mechanism."""


@dataclass(frozen=True)
class Limits:
    """Per-job limits. Wall time is enforced from outside the box; the rest by cgroups/rlimits."""

    timeout_s: float = 10.0
    cpu_s: float = 10.0
    memory_mb: int = 512
    pids: int = 64
    file_size_mb: int = 64
    open_files: int = 256
    output_bytes: int = 1 << 20  # per stream (stdout, stderr)
    tmpfs_mb: int = 128  # size of the box's /tmp and /dev/shm

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise SandboxError(f"sandbox limit '{f.name}' must be a positive number, got {value!r}")

    def replace(self, **changes: Any) -> "Limits":
        known = {f.name for f in fields(self)}
        for key in changes:
            if key not in known:
                raise SandboxError(f"unknown sandbox limit '{key}' (known: {', '.join(sorted(known))})")
        return Limits(**{**asdict(self), **{k: v for k, v in changes.items() if v is not None}})


@dataclass
class ExecResult:
    """What happened in the box. Serves as reward signal (exit code, timeouts) and as the
    next observation of a multi-turn episode (stdout/stderr). `infra_error` is set when the
    sandbox itself failed: the job was not judged, and must not be scored."""

    exit_code: int
    stdout: str
    stderr: str
    truncated: bool = False
    timed_out: bool = False
    oom: bool = False
    signal: int | None = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_mb: float = 0.0
    backend: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    infra_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom and self.infra_error is None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["files"] = {k: v.decode("utf-8", "replace") for k, v in self.files.items()}
        return d
