"""Contamination guard: does an evaluation task (or something very like it) appear in training data?

Two checks per evaluation task, on normalised words (lower-cased alphanumeric runs):

- **n-gram overlap** (13-grams by default, as in GPT-3's contamination study): the fraction of
  the task's n-grams that also occur in some training document. A text shorter than n words is
  one n-gram (the whole text). An exact duplicate of the whole normalised text is counted apart.
- **near duplicates**: MinHash (datasketch) over word 3-shingles, with an LSH index of the
  training documents; the best estimated Jaccard similarity and which training document it was.

Procedural sources share template text between every task ("Your task is to count how many
legs..."). n-grams and shingles that occur in many training documents (more than
`boilerplate_frac` of them, and at least `boilerplate_min_docs`) are boilerplate and are left
out of both checks; otherwise every task of a template would look contaminated. What this does
*not* catch: paraphrases with different wording, translated copies, and duplicates hidden
beyond the first `n_train` training documents of each source.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

_WORD = re.compile(r"[a-z0-9]+")
SHINGLE = 3
NUM_PERM = 128


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def grams(ids: Sequence[int], n: int) -> set[int]:
    """Hashes of the n-grams of a text given as word ids (the whole text when it has fewer than n
    words). Tuples of ints hash the same in every process (str hashing is salted; ints are not)."""
    if not ids:
        return set()
    if len(ids) < n:
        return {hash(tuple(ids))}
    t = tuple(ids)
    return {hash(t[i:i + n]) for i in range(len(t) - n + 1)}


class Vocab(dict):
    """word -> id, shared by the training and evaluation texts of one check."""

    def ids(self, text: str) -> list[int]:
        return [self.setdefault(w, len(self)) for w in words(text)]


def _text_of(item: Any) -> tuple[str, str]:
    """(id, text) of a Task or a plain string. A task's text is its question, plus the text files
    of its environment for multi-turn work (a repair task's question is the same every time:
    the task is in its files)."""
    if isinstance(item, str):
        return "", item
    text = getattr(item, "question", "") or ""
    files = (getattr(item, "environment", None) or {}).get("files")
    if isinstance(files, dict):
        text += "".join(f"\n{k}\n{v}" for k, v in sorted(files.items()) if isinstance(v, str))
    return str(getattr(item, "id", "")), text


@dataclass
class _Doc:
    id: str
    text: str
    exact: int
    ngrams: set[int]
    shingles: set[int]
    source: str = ""


@dataclass
class ContaminationConfig:
    ngram: int = 13
    threshold: float = 0.8  # near-duplicate Jaccard at or above this is contamination
    ngram_threshold: float = 0.5  # fraction of an eval task's n-grams seen in training
    n_train: int = 2000  # training documents scanned per source
    train_seed: int = 0
    boilerplate_frac: float = 0.02
    boilerplate_min_docs: int = 5
    worst: int = 10
    exclude_exact: bool = False  # drop training docs equal to an eval task first (TaskSampler's
    # exclude_heldout_questions does this in training, so only the rest can leak)


def _doc(id_: str, text: str, n: int, vocab: Vocab, source: str = "") -> _Doc:
    ids = vocab.ids(text)
    return _Doc(id_, text, hash(tuple(ids)), grams(ids, n), grams(ids, SHINGLE), source)


def _train_docs(train_sources: Sequence[Any], cfg: ContaminationConfig, vocab: Vocab) -> list[_Doc]:
    docs: list[_Doc] = []
    for src in train_sources:
        if hasattr(src, "tasks") and callable(src.tasks):
            items: Iterable[Any] = src.tasks("train", cfg.train_seed)
            name = str(getattr(src, "domain", type(src).__name__))
        else:
            items, name = src, "texts"
        for i, item in enumerate(items):
            if i >= cfg.n_train:
                break
            id_, text = _text_of(item)
            docs.append(_doc(id_ or f"{name}#{i}", text, cfg.ngram, vocab, name))
    return docs


def _boilerplate(sets: Iterable[set[int]], n_docs: int, cfg: ContaminationConfig) -> set[int]:
    df: Counter[int] = Counter()
    for s in sets:
        df.update(s)
    cut = max(cfg.boilerplate_min_docs, cfg.boilerplate_frac * n_docs)
    return {g for g, c in df.items() if c > cut}


def _minhash(shingles: set[int]) -> Any:
    from datasketch import MinHash

    m = MinHash(num_perm=NUM_PERM, seed=1)
    if shingles:
        m.update_batch([s.to_bytes(8, "little", signed=True) for s in sorted(shingles)])
    return m


def check_contamination(train_sources: Sequence[Any], eval_tasks: Sequence[Any], threshold: float = 0.8,
                        n_train: int = 2000, ngram: int = 13, **kw: Any) -> dict[str, Any]:
    """Overlap of each evaluation task with the training sources.

    `train_sources`: TaskSources (their 'train' split is read, first `n_train` tasks) or iterables
    of Tasks / strings. `eval_tasks`: Tasks or strings. `threshold`: MinHash Jaccard at which a
    near duplicate counts. Returns a JSON-able report: counts, per-domain counts, one row per
    evaluation task and the worst offenders (see `report_table`).
    """
    from datasketch import MinHashLSH

    cfg = ContaminationConfig(ngram=ngram, threshold=threshold, n_train=n_train, **kw)
    vocab = Vocab()
    train = _train_docs(train_sources, cfg, vocab)
    evals = []
    for i, item in enumerate(eval_tasks):
        id_, text = _text_of(item)
        d = _doc(id_ or f"eval#{i}", text, cfg.ngram, vocab)
        d.source = str(getattr(item, "domain", "eval"))
        evals.append(d)
    if cfg.exclude_exact:
        eval_exact = {e.exact for e in evals}
        train = [d for d in train if d.exact not in eval_exact]
    bp_ngrams = _boilerplate((d.ngrams for d in train), len(train), cfg)
    bp_shingles = _boilerplate((d.shingles for d in train), len(train), cfg)
    train_ngrams: dict[int, int] = {}  # n-gram -> the first training document that has it
    exact: dict[int, _Doc] = {}
    for j, d in enumerate(train):
        for g in d.ngrams - bp_ngrams:
            train_ngrams.setdefault(g, j)
        exact.setdefault(d.exact, d)
    lsh = MinHashLSH(threshold=min(max(threshold * 0.8, 0.05), 0.99), num_perm=NUM_PERM)
    hashes = {}
    for j, d in enumerate(train):
        sh = d.shingles - bp_shingles
        if sh:
            hashes[j] = _minhash(sh)
            lsh.insert(str(j), hashes[j])
    rows = []
    for e in evals:
        mine = e.ngrams - bp_ngrams
        shared = [train_ngrams[g] for g in mine if g in train_ngrams]
        overlap = len(shared) / len(mine) if mine else 0.0
        hit = exact.get(e.exact) if e.text.strip() else None
        best, best_doc = 0.0, None
        sh = e.shingles - bp_shingles
        if sh:
            m = _minhash(sh)
            for key in lsh.query(m):
                j = int(key)
                # the exact Jaccard of the filtered shingle sets (the LSH only proposes candidates)
                tsh = train[j].shingles - bp_shingles
                jac = len(sh & tsh) / len(sh | tsh)
                if jac > best:
                    best, best_doc = jac, train[j]
        match = hit or best_doc or (train[Counter(shared).most_common(1)[0][0]] if shared else None)
        bad = hit is not None or overlap >= cfg.ngram_threshold or best >= threshold
        rows.append({
            "id": e.id, "domain": e.source, "exact": hit is not None, "ngram_overlap": round(overlap, 4),
            "ngrams": len(mine), "near_dup": round(best, 4), "contaminated": bad,
            "match_id": match.id if match else None, "match_source": match.source if match else None,
            "text": e.text[:300], "match_text": match.text[:300] if match else None,
        })
    per_domain: dict[str, dict[str, int]] = {}
    for r in rows:
        pd = per_domain.setdefault(r["domain"], {"tasks": 0, "contaminated": 0, "exact": 0, "near_dup": 0,
                                                 "ngram": 0})
        pd["tasks"] += 1
        pd["contaminated"] += r["contaminated"]
        pd["exact"] += r["exact"]
        pd["near_dup"] += r["near_dup"] >= threshold
        pd["ngram"] += r["ngram_overlap"] >= cfg.ngram_threshold
    worst = sorted(rows, key=lambda r: (-r["exact"], -max(r["near_dup"], r["ngram_overlap"]), r["id"]))
    return {
        "ngram": cfg.ngram, "threshold": threshold, "ngram_threshold": cfg.ngram_threshold,
        "train_docs": len(train), "eval_tasks": len(rows), "exclude_exact": cfg.exclude_exact,
        "boilerplate": {"ngrams": len(bp_ngrams), "shingles": len(bp_shingles)},
        "counts": {"contaminated": sum(r["contaminated"] for r in rows), "exact": sum(r["exact"] for r in rows),
                   "ngram": sum(r["ngram_overlap"] >= cfg.ngram_threshold for r in rows),
                   "near_dup": sum(r["near_dup"] >= threshold for r in rows),
                   "any_ngram": sum(r["ngram_overlap"] > 0 for r in rows)},
        "per_domain": per_domain,
        "worst": [r for r in worst[:cfg.worst] if r["contaminated"] or r["ngram_overlap"] > 0 or r["near_dup"] > 0],
        "tasks": rows,
    }


def summary_line(report: dict) -> str:
    c = report["counts"]
    return (f"contamination: {c['contaminated']}/{report['eval_tasks']} evaluation tasks overlap training data "
            f"(exact {c['exact']}, {report['ngram']}-gram >= {report['ngram_threshold']:g}: {c['ngram']}, "
            f"near-duplicate >= {report['threshold']:g}: {c['near_dup']}; {report['train_docs']} training docs)")


def contaminated_fraction(report: dict) -> float:
    return report["counts"]["contaminated"] / max(report["eval_tasks"], 1)


def report_table(report: dict) -> Any:
    from rich.console import Group
    from rich.table import Table

    t = Table(title=summary_line(report), title_justify="left")
    for col in ("domain", "tasks", "contaminated", "exact", f"{report['ngram']}-gram", "near-dup"):
        t.add_column(col, justify="left" if col == "domain" else "right", no_wrap=True)
    for d, c in sorted(report["per_domain"].items()):
        t.add_row(d, str(c["tasks"]), str(c["contaminated"]), str(c["exact"]), str(c["ngram"]), str(c["near_dup"]))
    w = Table(title="worst offenders", title_justify="left")
    for col in ("eval task", "exact", "n-gram", "jaccard", "training doc", "eval text"):
        w.add_column(col, overflow="fold")
    for r in report["worst"]:
        w.add_row(r["id"], "yes" if r["exact"] else "", f"{r['ngram_overlap']:.2f}", f"{r['near_dup']:.2f}",
                  str(r["match_id"]), r["text"][:80].replace("\n", " "))
    return Group(t, w) if report["worst"] else t


def heldout_guard(report: dict, max_fraction: float = 0.0, fail: bool = False) -> Optional[str]:
    """For `honing train` start-up: None when the contaminated fraction is within `max_fraction`,
    else the warning text (raised as a ConfigError when `fail`)."""
    frac = contaminated_fraction(report)
    if frac <= max_fraction:
        return None
    msg = summary_line(report) + "; worst: " + ", ".join(
        f"{r['id']} ~ {r['match_id']}" for r in report["worst"][:3])
    if fail:
        from honing.errors import ConfigError

        raise ConfigError(msg)
    return msg
