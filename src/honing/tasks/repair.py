"""Repository-repair tasks (domain "repair"), graded by the `repair` verifier.

* `RepairSource` ("repair"): procedural small Python packages (a core module and a module that
  imports it, a visible unittest file) with injected bugs of graded difficulty: level 1 wrong
  operator, 2 off-by-one, 3 wrong branch, 4 missing edge case, 5 two bugs in two files (the
  dependent module and the one it imports). Expected values of every test are computed on
  the host by running the reference code. Visible tests cover every function; hidden tests are
  only cases the given buggy repo fails (an unfixed repo scores 0), and both sets are chosen so
  that each injected bug on its own makes at least one case fail (the generator's solvability
  proof is checked in tests/rollout/test_repair_tasks.py in the sandbox). Regression tests
  (`hidden["regression_tests"]`): the grader's own copy of the visible test file and a hidden
  coverage file with fresh cases of every public function, so a patch that fixes the bug and
  breaks another function scores < 1 (the verifier multiplies the two pass rates). Hidden: those
  test files, the reference files and the reference patch (unified diff, which
  `apply_patch` accepts: a scripted policy can replay it). Params: `levels` (subset of 1..5),
  `families` (subset of shop, text, num, grades, stock, clock: repair_families.py; default all),
  `split_by`, `max_turns` (default 12), `hidden_cases` (in all, default 6), `visible_cases` and
  `coverage_cases` (per function, default 2 each). Train and held-out tasks are disjoint by
  construction. `split_by: structure` (default): a task's split is a hash of its structure (family,
  package, constants, bug sites), so no structure appears in both, but every bug site does (level 1
  has 1-2 operator sites per family), so held-out asks for known fixes in new packages.
  `split_by: site`: ~20% of each level's bug sites (family, bug indices) are held out whole, so a
  held-out task asks for a fix that no training task shows, in a family the model has seen.
* `RepairDirSource` ("repair:dir:<path>"): user tasks in a directory (see docs/multiturn.md):
  `<task>/task.yaml` (instruction, ...), `<task>/repo/` (the starting files), `<task>/tests/`
  (hidden tests), optional `<task>/solution.patch`; close to Terminal-Bench's layout.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import random
from pathlib import Path
from typing import Any, Iterator

from honing.errors import TaskError
from honing.rollout.tools import CODING_TOOLS
from honing.tasks.repair_families import FAMILIES, Family
from honing.tasks.types import SPLITS, Task, VerifierSpec

TEST_COMMAND = "python3 -m unittest discover -s tests -t . 2>&1"
HELDOUT_FRACTION = 0.2
LEVEL_KINDS = {1: "operator", 2: "off_by_one", 3: "branch", 4: "edge", 5: "two_files"}
PACKAGES = ("shopkit", "ledger", "textkit", "toolbox", "mathlib", "acme", "utilpkg", "corelib")
INSTRUCTIONS = ("Your workspace holds a Python package and its tests (tests/test_visible.py, run with "
                "run_tests or `{cmd}`). Find and fix the bug(s) in the package source so that the tests "
                "pass. Do not change the tests: the package is graded with further hidden tests. "
                "Call submit when you are done.")
SPLIT_BY = ("structure", "site")


def _namespace(core: str, dep: str) -> dict[str, Any]:
    """Run our own generated sources on the host (trusted code) to compute expected values."""
    ns: dict[str, Any] = {}
    exec(compile(core, "core", "exec"), ns)  # noqa: S102 - generated reference code
    exec(compile("\n".join(ln for ln in dep.splitlines() if not ln.startswith("from .")), "dep", "exec"), ns)
    return ns


def _call(ns: dict[str, Any], fn: str, args: tuple) -> tuple[bool, Any]:
    try:
        return True, ns[fn](*copy.deepcopy(args))
    except Exception as e:  # noqa: BLE001
        return False, type(e).__name__


def _render_tests(pkg: str, core: str, dep: str, fns: dict[str, list[str]],
                  cases: dict[str, list[tuple[tuple, Any]]], title: str) -> str:
    out = [f'"""{title}"""', "import unittest", ""]
    for mod, m in ((core, "core"), (dep, "dep")):
        used = sorted(f for f in fns[m] if f in cases)
        if used:
            out.append(f"from {pkg}.{mod} import {', '.join(used)}")
    out += ["", ""]
    for fn, cs in cases.items():
        out.append(f"class Test{''.join(p.title() for p in fn.split('_'))}(unittest.TestCase):")
        for i, (args, want) in enumerate(cs):
            call = f"{fn}({', '.join(repr(a) for a in args)})"
            check = "assertAlmostEqual" if isinstance(want, float) else "assertEqual"
            out.append(f"    def test_{i}(self):\n        self.{check}({call}, {want!r})\n")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _diff(old: dict[str, str], new: dict[str, str]) -> str:
    out = []
    for path in sorted(new):
        if old.get(path) != new[path]:
            out += difflib.unified_diff(old.get(path, "").splitlines(True), new[path].splitlines(True),
                                        f"a/{path}", f"b/{path}")
    return "".join(out)


def _hash(key: str) -> float:
    """A stable number in [0, 1) for a structure key."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0x100000000


def _bugs(fam: Family, level: int) -> list[list[int]]:
    """The bug indices a task of `level` chooses among, one list per bug it gets: level 5 one bug
    in each module, levels 1-4 one bug of the level's kind."""
    if level == 5:
        return [[i for i, b in enumerate(fam.bugs) if b.module == m] for m in ("core", "dep")]
    return [[i for i, b in enumerate(fam.bugs) if b.kind == LEVEL_KINDS[level]]]


def _level_sites(families: tuple[Family, ...], level: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every (family, bug indices) a task of `level` can have."""
    return [(fam.name, sites) for fam in families for sites in itertools.product(*_bugs(fam, level))]


class RepairSource:
    domain = "repair"

    def __init__(self, params: dict[str, Any] | None = None, verifier: str | None = None,
                 system_prompt: str | None = None) -> None:
        params = dict(params or {})
        valid = {"levels", "families", "split_by", "max_turns", "hidden_cases", "visible_cases", "coverage_cases"}
        if set(params) - valid:
            raise TaskError(f"repair: unknown parameters {sorted(set(params) - valid)} (valid: {', '.join(sorted(valid))})")
        self.levels = sorted(int(x) for x in params.get("levels", (1, 2, 3, 4, 5)))
        if not self.levels or any(lv not in LEVEL_KINDS for lv in self.levels):
            raise TaskError(f"repair: levels must be a non-empty subset of 1..5, got {self.levels}")
        names = [f.name for f in FAMILIES]
        chosen = list(params.get("families", names))
        unknown = [f for f in chosen if f not in names]
        if not chosen or unknown:
            raise TaskError(f"repair: families must be a non-empty subset of {names}, got {chosen}")
        self.families = tuple(f for f in FAMILIES if f.name in chosen)
        self.split_by = str(params.get("split_by", "structure"))
        if self.split_by not in SPLIT_BY:
            raise TaskError(f"repair: split_by must be one of {', '.join(SPLIT_BY)}, got '{self.split_by}'")
        self.heldout_sites = self._heldout_sites() if self.split_by == "site" else set()
        self.max_turns = int(params.get("max_turns", 12))
        self.hidden_cases = int(params.get("hidden_cases", 6))
        self.visible_cases = int(params.get("visible_cases", 2))
        self.coverage_cases = int(params.get("coverage_cases", 2))
        if self.coverage_cases < 1:
            raise TaskError(f"repair: coverage_cases must be >= 1, got {self.coverage_cases}")
        self.verifier = verifier or "repair"
        self.system_prompt = system_prompt

    def structure(self, n: int) -> dict[str, Any]:
        """The structural choices of candidate `n` (what the split hashes)."""
        rng = random.Random(f"repair/{n}")
        level = rng.choice(self.levels)
        fam = rng.choice(self.families)
        sites = [rng.choice(options) for options in _bugs(fam, level)]
        return {"level": level, "family": fam.name, "package": rng.choice(PACKAGES), "constants": fam.constants(rng),
                "sites": sites, "rng": rng}

    def split_of(self, st: dict[str, Any]) -> str:
        if self.split_by == "site":
            return "heldout" if (st["family"], tuple(st["sites"])) in self.heldout_sites else "train"
        key = repr((st["family"], st["package"], sorted(st["constants"].items()), st["sites"]))
        return "heldout" if _hash(key) < HELDOUT_FRACTION else "train"

    def _heldout_sites(self) -> set[tuple[str, tuple[int, ...]]]:
        """split_by: site. The bug sites (family, bug indices) that only held-out tasks have: ~20% of
        each level's sites by hash, at least one per level and never all of them, so a held-out task
        asks for a fix no training task showed, in a family the model has seen."""
        held: set[tuple[str, tuple[int, ...]]] = set()
        for level in self.levels:
            sites = sorted(_level_sites(self.families, level), key=lambda s: _hash(repr(s)))
            if len(sites) < 2:
                raise TaskError(f"repair: split_by site needs two or more bug sites at level {level}, "
                                f"families {[f.name for f in self.families]} have {len(sites)}")
            k = min(len(sites) - 1, max(1, sum(_hash(repr(s)) < HELDOUT_FRACTION for s in sites)))
            held.update(sites[:k])
        return held

    def make(self, split: str, n: int) -> Task:
        st = self.structure(n)
        rng: random.Random = st["rng"]
        fam = next(f for f in self.families if f.name == st["family"])
        pkg, consts = st["package"], st["constants"]
        ref = {"core": fam.core[1].format(**consts), "dep": fam.dep[1].format(**consts)}
        bugs = [fam.bugs[i] for i in st["sites"]]
        buggy = dict(ref)
        for b in bugs:
            assert b.old in buggy[b.module], (fam.name, b)
            buggy[b.module] = buggy[b.module].replace(b.old, b.new, 1)
        ref_ns = _namespace(ref["core"], ref["dep"])
        single_ns = []  # each bug alone: every one must be caught by visible and hidden tests
        for b in bugs:
            one = dict(ref)
            one[b.module] = one[b.module].replace(b.old, b.new, 1)
            single_ns.append(_namespace(one["core"], one["dep"]))
        fns = {m: [f for f in fam.args if f"def {f}(" in ref[m]] for m in ("core", "dep")}
        visible: dict[str, list[tuple[tuple, Any]]] = {f: [] for f in fam.args}
        hidden: dict[str, list[tuple[tuple, Any]]] = {f: [] for f in fam.args}
        buggy_ns = _namespace(buggy["core"], buggy["dep"])
        caught_v, caught_h = [False] * len(bugs), [False] * len(bugs)
        n_hidden = 0
        for _ in range(600):
            fn = rng.choice(list(fam.args))
            args = fam.args[fn](rng)
            ok, want = _call(ref_ns, fn, args)
            if not ok:
                continue
            differs = [_call(ns, fn, args) != (True, want) for ns in single_ns]
            # visible: a few cases of every function, plus at least one case exposing each bug
            if not any(args == a for a, _ in visible[fn]) and (
                    len(visible[fn]) < self.visible_cases
                    or (any(d and not c for d, c in zip(differs, caught_v)) and len(visible[fn]) < self.visible_cases + 2)):
                visible[fn].append((args, want))
                caught_v = [c or d for c, d in zip(caught_v, differs)]
                continue
            # hidden: only cases the given (buggy) repo fails, so an unfixed repo scores 0
            if (_call(buggy_ns, fn, args) != (True, want) and not any(args == a for a, _ in hidden[fn])
                    and (n_hidden < self.hidden_cases or any(d and not c for d, c in zip(differs, caught_h)))):
                hidden[fn].append((args, want))
                n_hidden += 1
                caught_h = [c or d for c, d in zip(caught_h, differs)]
            if all(caught_v) and all(caught_h) and n_hidden >= self.hidden_cases and all(
                    len(v) >= self.visible_cases for v in visible.values()):
                break
        if not (all(caught_v) and all(caught_h)):  # e.g. two bugs that cancel out: the candidate is skipped
            raise TaskError(f"repair: could not find cases that expose the bug(s) of candidate {n}")
        # hidden coverage: every public function, checked against the reference on fresh inputs (not
        # only where the given repo fails), so a patch that breaks another function loses score
        coverage: dict[str, list[tuple[tuple, Any]]] = {f: [] for f in fam.args}
        for fn in fam.args:
            seen = [a for a, _ in visible[fn] + hidden[fn]]
            for _ in range(200):
                if len(coverage[fn]) >= self.coverage_cases:
                    break
                args = fam.args[fn](rng)
                ok, want = _call(ref_ns, fn, args)
                if ok and args not in seen:
                    coverage[fn].append((args, want))
                    seen.append(args)
            if not coverage[fn]:
                raise TaskError(f"repair: no coverage case for {fn} in candidate {n}")
        # ... plus, best effort, a case for each of the family's known mutations (applied alone to the
        # reference) that the visible and coverage cases do not expose yet: the usual ways to break
        # another function while fixing this one
        mutants = []
        for b in fam.bugs:
            one = dict(ref)
            one[b.module] = one[b.module].replace(b.old, b.new, 1)
            ns = _namespace(one["core"], one["dep"])
            if not any(_call(ns, f, a) != (True, w) for f in fam.args for a, w in visible[f] + coverage[f]):
                mutants.append(ns)
        for _ in range(1000 if mutants else 0):
            fn = rng.choice(list(fam.args))
            args = fam.args[fn](rng)
            ok, want = _call(ref_ns, fn, args)
            left = [m for m in mutants if _call(m, fn, args) == (True, want)] if ok else mutants
            if len(left) < len(mutants) and not any(args == a for a, _ in visible[fn] + hidden[fn] + coverage[fn]):
                coverage[fn].append((args, want))
                mutants = left
                if not mutants:
                    break
        hidden = {f: cs for f, cs in hidden.items() if cs}
        core, dep = fam.core[0], fam.dep[0]
        path = {"core": f"{pkg}/{core}.py", "dep": f"{pkg}/{dep}.py"}
        visible_src = _render_tests(pkg, core, dep, fns, visible, "Visible tests.")
        files = {f"{pkg}/__init__.py": f'"""The {pkg} package."""\n', path["core"]: buggy["core"],
                 path["dep"]: buggy["dep"], "tests/__init__.py": "", "tests/test_visible.py": visible_src}
        solution = {path[m]: ref[m] for m in ("core", "dep") if ref[m] != buggy[m]}
        failing = sorted({f for f, cs in visible.items() for a, w in cs
                          if any(_call(ns, f, a) != (True, w) for ns in single_ns)})
        statement = (f"Bug report: `{'`, `'.join(failing)}` in the `{pkg}` package return wrong results or crash "
                     f"on some inputs (see the failing tests).\n\n" + INSTRUCTIONS.format(cmd=TEST_COMMAND))
        msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        msgs.append({"role": "user", "content": statement})
        level = st["level"]
        return Task(
            id=f"repair/{split}/{n}", domain=self.domain, prompt=tuple(msgs),
            verifier=VerifierSpec(self.verifier),
            hidden={"tests": {"tests/test_hidden.py": _render_tests(pkg, core, dep, fns, hidden, "Hidden tests.")},
                    # the grader's own copy of the visible tests (the workspace copy is the agent's to edit)
                    "regression_tests": {"tests/test_visible.py": visible_src,
                                         "tests/test_hidden_coverage.py": _render_tests(
                                             pkg, core, dep, fns, coverage, "Hidden coverage tests.")},
                    "solution": solution, "reference_patch": _diff({path[m]: buggy[m] for m in path}, solution),
                    "bugs": [{"kind": b.kind, "file": path[b.module], "old": b.old, "new": b.new} for b in bugs]},
            difficulty=level / 5, tags=(f"level{level}", LEVEL_KINDS[level], fam.name),
            metadata={"level": level, "family": fam.name, "seed": n},
            environment={"kind": "tools", "files": files, "tools": list(CODING_TOOLS), "max_turns": self.max_turns,
                         "test_command": TEST_COMMAND, "source_files": sorted(path.values()) + [f"{pkg}/__init__.py"]})

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        if split not in SPLITS:
            raise TaskError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)})")
        n = seed
        while True:
            if self.split_of(self.structure(n)) == split:
                try:
                    task = self.make(split, n)
                except TaskError:  # no test set exposes every bug of this candidate
                    n += 1
                    continue
                yield task
            n += 1


# --- user task directories --------------------------------------------------------------------
def _load_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TaskError(f"{path}: cannot read task.yaml: {e}") from None
    if not isinstance(data, dict):
        raise TaskError(f"{path}: expected a mapping")
    return data


def _read_tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts:
            out[str(p.relative_to(root))] = p.read_text(encoding="utf-8")
    return out


class RepairDirSource:
    """Tasks from `<path>` (one task dir, or a dir of task dirs); see docs/multiturn.md."""

    domain = "repair"

    def __init__(self, path: str | Path, params: dict[str, Any] | None = None, verifier: str | None = None,
                 system_prompt: str | None = None) -> None:
        self.root = Path(path).expanduser()
        params = dict(params or {})
        self.heldout_fraction = float(params.pop("heldout_fraction", HELDOUT_FRACTION))
        self.max_turns = int(params.pop("max_turns", 12))
        if params:
            raise TaskError(f"repair:dir: unknown parameters {sorted(params)} (valid: heldout_fraction, max_turns)")
        if not self.root.is_dir():
            raise TaskError(f"repair:dir: {self.root} is not a directory")
        self.verifier = verifier or "repair"
        self.system_prompt = system_prompt

    def task_dirs(self) -> list[Path]:
        if (self.root / "task.yaml").is_file():
            return [self.root]
        dirs = sorted(p for p in self.root.iterdir() if (p / "task.yaml").is_file())
        if not dirs:
            raise TaskError(f"repair:dir: no task.yaml in {self.root} or its subdirectories")
        return dirs

    def load(self, d: Path) -> Task:
        meta = _load_yaml(d / "task.yaml")
        instruction = meta.get("instruction") or meta.get("statement")
        if not isinstance(instruction, str) or not instruction.strip():
            raise TaskError(f"{d / 'task.yaml'}: missing 'instruction'")
        if not (d / "repo").is_dir() or not (d / "tests").is_dir():
            raise TaskError(f"{d}: a task needs a repo/ directory (starting files) and a tests/ directory (hidden tests)")
        files = _read_tree(d / "repo")
        tests_dir = str(meta.get("hidden_tests_dir", "tests"))
        hidden_tests = {f"{tests_dir}/{k}": v for k, v in _read_tree(d / "tests").items()}
        cmd = str(meta.get("test_command", TEST_COMMAND))
        sources = meta.get("source_files") or ["**/*.py"]
        msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        msgs.append({"role": "user", "content": instruction.strip() + "\n\nRun the visible tests with run_tests "
                     f"(`{cmd}`). Call submit when you are done."})
        hidden: dict[str, Any] = {"tests": hidden_tests}
        if (d / "solution.patch").is_file():
            hidden["reference_patch"] = (d / "solution.patch").read_text()
        diff = meta.get("difficulty")
        return Task(id=f"repair:dir/{d.name}", domain=self.domain, prompt=tuple(msgs),
                    verifier=VerifierSpec(self.verifier, {"timeout_s": float(meta.get("max_test_timeout_sec", 60))}),
                    hidden=hidden, difficulty={"easy": 0.2, "medium": 0.5, "hard": 0.8}.get(diff, None)
                    if not isinstance(diff, (int, float)) else float(diff),
                    tags=tuple(meta.get("tags") or ()), metadata={"dir": str(d)},
                    environment={"kind": "tools", "files": files, "tools": list(CODING_TOOLS),
                                 "max_turns": int(meta.get("max_turns", self.max_turns)), "test_command": cmd,
                                 "source_files": list(sources)})

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        if split not in SPLITS:
            raise TaskError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)})")
        dirs = self.task_dirs()
        if len(dirs) > 1:
            dirs = [d for d in dirs if (int(hashlib.sha256(d.name.encode()).hexdigest()[:8], 16)
                                        < self.heldout_fraction * 0xFFFFFFFF) == (split == "heldout")]
        elif split == "heldout":
            dirs = []
        random.Random(seed).shuffle(dirs)
        for d in dirs:
            yield self.load(d)
