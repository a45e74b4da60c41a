"""Dedupe: exact and near-duplicate (datasketch MinHash LSH) within the pool, and the held-out
guard against every evaluation suite.

The held-out guard is `honing.eval.contamination.check_contamination` run the other way round:
the held-out tasks play the "training documents" and the logged prompts the "evaluation tasks",
so each logged prompt gets an exact / 13-gram / MinHash-Jaccard verdict against all held-out
tasks (Jaccard 0.6 by default, stricter than the 0.8 between pool items; template boilerplate shared by many held-out tasks is left out, as there). A prompt that
is contaminated by that measure is dropped before it is scrubbed or stored. Not covered: the
paraphrases and translations that the contamination guard does not catch either.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

# honing.eval.contamination is imported where used: importing honing.eval loads torch, and
# `honing flywheel --help` should not wait for that.


def heldout_tasks(suites: Sequence[str] | None, sources: Sequence[str] = (), per_source: int = 500,
                  heldout_seed: int = 1_000_003) -> list[Any]:
    """Held-out tasks of the named suites (None: every built-in suite) and of task sources'
    held-out splits (first `per_source` of each). A suite that fails to load is an error: a guard
    with a hole in it must not pass silently."""
    from honing.eval.suite import builtin_suites, load_suite, suite_tasks
    from honing.tasks import make_source

    out: list[Any] = []
    for name in (builtin_suites() if suites is None else suites):
        out.extend(suite_tasks(load_suite(name)).tasks)
    for name in sources:
        for i, t in enumerate(make_source(name).tasks("heldout", heldout_seed)):
            if i >= per_source:
                break
            out.append(t)
    return out


def heldout_matches(heldout: Sequence[Any], texts: Sequence[str], threshold: float = 0.8) -> list[bool]:
    """Per text: does it match a held-out task (exact, 13-gram overlap >= 0.5, or near duplicate)?"""
    if not heldout or not texts:
        return [False] * len(texts)
    from honing.eval.contamination import check_contamination

    report = check_contamination([list(heldout)], list(texts), threshold=threshold, n_train=len(heldout) + 1)
    return [bool(r["contaminated"]) for r in report["tasks"]]


class NearDuplicates:
    """An index of pool questions: `add(key, text)` returns the key of an earlier exact or
    near duplicate (word 3-shingle Jaccard >= threshold, candidates from MinHash LSH and then
    checked exactly), or None after indexing the text."""

    def __init__(self, threshold: float = 0.8) -> None:
        from datasketch import MinHashLSH

        from honing.eval.contamination import NUM_PERM, Vocab

        self.threshold = threshold
        self.vocab = Vocab()
        self.exact: dict[int, str] = {}
        self.shingles: dict[str, set[int]] = {}
        self.lsh = MinHashLSH(threshold=min(max(threshold * 0.8, 0.05), 0.99), num_perm=NUM_PERM)

    def add(self, key: str, text: str) -> str | None:
        from honing.eval.contamination import SHINGLE, _minhash, grams

        ids = self.vocab.ids(text)
        h = hash(tuple(ids))
        if h in self.exact:
            return self.exact[h]
        sh = grams(ids, SHINGLE)
        m = _minhash(sh) if sh else None
        if m is not None:
            for other in self.lsh.query(m):
                o = self.shingles[other]
                if len(sh & o) / len(sh | o) >= self.threshold:
                    return other
        self.exact[h] = key
        if m is not None and key not in self.shingles:
            self.shingles[key] = sh
            self.lsh.insert(key, m)
        return None

    def add_all(self, items: Iterable[tuple[str, str]]) -> None:
        for key, text in items:
            self.add(key, text)
