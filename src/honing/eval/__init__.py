"""Evaluation. Held-out pass@1 now; pass@k, suites and contamination guards come later."""

from honing.eval.heldout import evaluate

__all__ = ["evaluate"]
