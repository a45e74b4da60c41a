"""A fault-injecting backend for testing the infrastructure-error paths (retries, deadlines, drops).

`FaultyBackend(inner, fail, hang, hang_s, seed)` wraps another backend's `run`. Each call draws
one number from a seeded, lock-guarded RNG: below `fail` it raises RuntimeError("injected sandbox
failure") (the Sandbox facade turns that into an `infra_error` result); below `fail + hang` it
first sleeps `hang_s` (a stalled box) and then runs the inner backend as usual, so a hang is an
infrastructure error only when a deadline or timeout cuts it short. `close()` wakes sleepers;
a call woken that way returns an `infra_error` result without running. The draw sequence is
reproducible; which call gets which draw follows call order.

By name: `faulty:<inner>[:key=value,...]` with keys fail, hang, hang_s, seed, e.g.
`faulty:bwrap:fail=0.1,hang=0.02,hang_s=5,seed=0`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from honing.sandbox.profiles import Profile
from honing.sandbox.types import ExecResult, Limits, SandboxError

KEYS = {"fail": float, "hang": float, "hang_s": float, "seed": int}


class FaultyBackend:
    """Injects failures and hangs into `inner.run`; `injected` counts them (and all calls)."""

    def __init__(self, inner: Any, fail: float = 0.0, hang: float = 0.0, hang_s: float = 5.0, seed: int = 0) -> None:
        if not (0 <= fail <= 1 and 0 <= hang <= 1 and fail + hang <= 1 and hang_s >= 0):
            raise SandboxError(f"faulty backend: need 0 <= fail, hang, fail + hang <= 1 and hang_s >= 0 "
                               f"(got fail={fail}, hang={hang}, hang_s={hang_s})")
        self.inner, self.fail, self.hang, self.hang_s = inner, fail, hang, hang_s
        self.name = f"faulty:{inner.name}"
        self.injected = {"fail": 0, "hang": 0, "calls": 0}
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._busy = 0

    def mechanisms(self) -> dict[str, str]:
        return {**self.inner.mechanisms(),
                "faults": f"injected: fail={self.fail:g}, hang={self.hang:g} ({self.hang_s:g}s)"}

    def run(self, argv: Sequence[str], workspace: Path, profile: Profile, limits: Limits,
            stdin: bytes | None = None, extra_ro: Sequence[tuple[str, str]] = ()) -> ExecResult:
        with self._lock:
            u = self._rng.random()
            self.injected["calls"] += 1
            kind = "fail" if u < self.fail else "hang" if u < self.fail + self.hang else None
            if kind:
                self.injected[kind] += 1
            self._busy += 1
        try:
            if kind == "fail":
                raise RuntimeError("injected sandbox failure")
            if kind == "hang" and self._stop.wait(self.hang_s):
                return ExecResult(-1, "", "", backend=self.name, infra_error="injected hang (backend closed)")
            return self.inner.run(argv, workspace, profile, limits, stdin, extra_ro)
        finally:
            with self._lock:
                self._busy -= 1

    def busy(self) -> int:
        """Calls in progress (hung ones included)."""
        with self._lock:
            return self._busy

    def close(self) -> None:
        """Wake every hung call (they return an infra_error result)."""
        self._stop.set()

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until no call is in progress; False if some still are after `timeout` seconds."""
        end = time.monotonic() + timeout
        while self.busy():
            if time.monotonic() > end:
                return False
            time.sleep(0.01)
        return True

    def __getattr__(self, attr: str) -> Any:  # backend-specific extras (bwrap path, cgroup version)
        if attr.startswith("_") or attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)


def parse_faulty(name: str) -> tuple[str, dict[str, Any]]:
    """'faulty:<inner>[:k=v,...]' -> (inner name, keyword arguments)."""
    parts = name.split(":", 2)
    if len(parts) < 2 or not parts[1]:
        raise SandboxError(f"faulty backend needs an inner backend: 'faulty:<inner>[:key=value,...]', got '{name}'")
    kwargs: dict[str, Any] = {}
    for item in filter(None, (parts[2] if len(parts) > 2 else "").split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in KEYS:
            raise SandboxError(f"faulty backend: bad option '{item}' in '{name}' (known: {', '.join(KEYS)})")
        try:
            kwargs[key] = KEYS[key](value.strip())
        except ValueError:
            raise SandboxError(f"faulty backend: '{key}' needs a number, got '{value}'") from None
    return parts[1], kwargs
