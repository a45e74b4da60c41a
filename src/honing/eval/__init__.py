"""Evaluation: held-out pass@1 during training, suites (`honing eval`), comparisons, contamination
guards and reports. The suite/report modules are imported lazily (matplotlib, datasketch)."""

from __future__ import annotations

from typing import Any

from honing.eval.heldout import evaluate

__all__ = ["evaluate", "evaluate_suite", "load_suite", "suite_tasks", "check_contamination",
           "write_report"]

_LAZY = {"evaluate_suite": "runner", "load_suite": "suite", "suite_tasks": "suite",
         "check_contamination": "contamination", "write_report": "report"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"honing.eval.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'honing.eval' has no attribute {name!r}")
