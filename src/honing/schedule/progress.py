"""A rich progress display for long work: bars for SFT/RL steps, spinners for phases."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, SpinnerColumn, TextColumn, \
    TimeElapsedColumn, TimeRemainingColumn


class _Bar:
    def __init__(self, progress: "Progress", task_id: int | None) -> None:
        self.p, self.id = progress, task_id

    def advance(self, info: str = "") -> None:
        if self.p.rich is not None and self.id is not None:
            self.p.rich.update(self.id, advance=1, info=info)


class Progress:
    def __init__(self, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.rich: RichProgress | None = None
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

    def bar(self, description: str, total: int) -> _Bar:
        if self.rich is None:
            return _Bar(self, None)
        return _Bar(self, self.rich.add_task(description, total=total, info=""))

    @contextlib.contextmanager
    def phase(self, description: str) -> Iterator[None]:
        if self.rich is None:
            yield
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
