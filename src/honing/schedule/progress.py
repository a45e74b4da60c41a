"""A rich progress display for long work: bars for SFT/RL steps, spinners for phases."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, SpinnerColumn, TextColumn, \
    TimeElapsedColumn, TimeRemainingColumn


def force_progress() -> bool:
    """HONING_PROGRESS=1 shows bars even when stderr is not a terminal (a log file, a test)."""
    return os.environ.get("HONING_PROGRESS", "") == "1"


def bars_wanted(disabled: bool) -> bool:
    """Whether a command shows progress bars: never when the user turned them off (--no-progress,
    --quiet), else on a terminal or where HONING_PROGRESS=1 asks for them."""
    return not disabled and (sys.stderr.isatty() or force_progress())


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class _Bar:
    def __init__(self, progress: "Progress", task_id: int | None, description: str = "", total: int = 0,
                 completed: int = 0, every_s: float = 0.0) -> None:
        self.p, self.id = progress, task_id
        self.description, self.total, self.done, self.every_s = description, total, completed, every_s
        self.t0 = self.last = time.monotonic()
        self.start = completed

    def advance(self, info: str = "") -> None:
        self.done += 1
        if self.p.rich is not None and self.id is not None:
            self.p.rich.update(self.id, advance=1, info=info)
        elif self.p.plain:
            now = time.monotonic()
            if now - self.last < self.every_s and self.done < self.total:
                return
            self.last = now
            rate = (now - self.t0) / max(1, self.done - self.start)
            eta = _duration(rate * max(0, self.total - self.done))
            parts = [f"{self.description}: step {self.done}/{self.total}", info, f"eta {eta}"]
            print("  ".join(x for x in parts if x), file=sys.stderr, flush=True)


class Progress:
    """Rich bars on a terminal (`enabled`); else, with `plain`, one plain line per bar step on
    stderr (for nohup, CI, cluster jobs: no ANSI, no carriage returns); else silent bars."""

    def __init__(self, enabled: bool = True, plain: bool = False) -> None:
        self.console = Console(stderr=True)
        self.rich: RichProgress | None = None
        self.plain = plain and not enabled
        if enabled:
            self.rich = RichProgress(
                SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                console=self.console, transient=False, refresh_per_second=4,
            )

    def __enter__(self) -> "Progress":
        if self.rich is not None:
            self.rich.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.rich is not None:
            self.rich.__exit__(*exc)

    def bar(self, description: str, total: int, completed: int = 0, every_s: float = 0.0) -> _Bar:
        """A bar of `total` steps, `completed` of them done already (a resume). Plain lines come
        at most every `every_s` seconds (and at the last step)."""
        if self.rich is None:
            return _Bar(self, None, description, total, completed, every_s)
        return _Bar(self, self.rich.add_task(description, total=total, completed=completed, info=""))

    @contextlib.contextmanager
    def phase(self, description: str) -> Iterator[None]:
        """A spinner while the block runs; plain: a line when it starts and one with its duration."""
        if self.rich is None:
            if not self.plain:
                yield
                return
            print(f"{description}: started", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            yield
            print(f"{description}: done in {_duration(time.monotonic() - t0)}", file=sys.stderr, flush=True)
            return
        tid = self.rich.add_task(description, total=None, info="")
        try:
            yield
        finally:
            self.rich.remove_task(tid)

    def note(self, text: str) -> None:
        if self.rich is not None:
            self.rich.console.print(text)
        else:
            print(text, file=sys.stderr)
