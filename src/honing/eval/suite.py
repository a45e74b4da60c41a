"""Evaluation suites: a named, versioned set of held-out tasks with the sampling settings to run them.

A suite is a YAML file (built-ins in `configs/suites/<name>.yaml`)::

    name: quick
    version: 1
    seed: 1000003            # held-out seed; must lie outside the training seed span (enforced)
    samples_per_task: 8
    sampling: {temperature: 0.7, max_new_tokens: 48}
    extractor: last_number
    sources:
      - name: gym:basic_arithmetic
        params: {max_terms: 2}
        count: 16            # held-out tasks of this source
        domains: [...]       # optional: keep only tasks of these domains (multi-domain sources)

Only the held-out split is ever evaluated. Tasks are materialised once (`suite_tasks`), in
source order, so the same suite and seed always give the same task list.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from honing.errors import ConfigError, TaskError
from honing.tasks.types import Task

SUITES_DIR = Path(__file__).resolve().parents[3] / "configs" / "suites"
DEFAULT_TRAIN_SEED = 0  # TasksConfig.train_seed's default: a suite's seed must stay clear of its span
SCAN_FACTOR = 50  # a domain filter may skip at most this many tasks per kept one before giving up


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingSpec(_Node):
    temperature: float = Field(0.7, ge=0)
    """Sampling temperature (0: greedy; then every sample of a task is the same)."""
    max_new_tokens: int = Field(64, gt=0)
    """Tokens generated per sample (per turn for multi-turn tasks)."""
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)


class SourceSpec(_Node):
    name: str
    """Task source: gym:<dataset>, jsonl:<path>, humaneval, code:functions, finance, repair, repair:dir:<path>."""
    params: dict[str, Any] = Field(default_factory=dict)
    verifier: Optional[str] = None
    """Verifier name (default: the source's own)."""
    count: int = Field(16, gt=0)
    """Held-out tasks taken from this source."""
    domains: Optional[list[str]] = None
    """Keep only tasks of these domains (default: all the source yields)."""
    max_new_tokens: Optional[int] = Field(None, gt=0)
    """Overrides sampling.max_new_tokens for this source (code needs more than arithmetic)."""


class Suite(_Node):
    name: str
    version: int = 1
    description: str = ""
    seed: int = 1_000_003
    """Held-out seed (procedural sources draw evaluation tasks from seeds training never uses)."""
    samples_per_task: int = Field(8, gt=0)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    extractor: str = "auto"
    """Answer extractor for single-turn verifiers and maj@k (auto, answer_tag, boxed, last_number, full)."""
    system_prompt: Optional[str] = None
    prompt_template: str = "{question}"
    sandbox_backend: str = "bwrap"
    """Sandbox for code-running verifiers and multi-turn tasks (bwrap; local is UNSAFE)."""
    batch_tasks: int = Field(8, gt=0)
    """Tasks generated per engine call (fixed: results do not depend on how fast the machine is)."""
    sources: list[SourceSpec] = Field(min_length=1)

    @property
    def label(self) -> str:
        return f"{self.name}@v{self.version}"


def _suite_dirs() -> list[Path]:
    """configs/suites/ of the working directory first (a user's own), then honing's."""
    return [d for d in (Path.cwd() / "configs" / "suites", SUITES_DIR) if d.is_dir()]


def builtin_suites() -> list[str]:
    return sorted({p.stem for d in _suite_dirs() for p in d.glob("*.yaml")})


def _suite_path(name_or_path: str) -> Path:
    if name_or_path.startswith("env:"):  # an installed environment package's own suite
        from honing.envpkg import load_environment

        env = load_environment(name_or_path[len("env:"):])
        if not env.eval_suite:
            raise ConfigError(f"environment package '{name_or_path}' ships no eval suite (Environment.eval_suite)")
        path = Path(env.eval_suite)
        return path if path.is_absolute() or env.package_dir is None else env.package_dir / path
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise ConfigError(f"suite file not found: {p}")
        return p
    for d in _suite_dirs():
        cand = d / f"{name_or_path}.yaml"
        if cand.is_file():
            return cand
    names = builtin_suites()
    close = difflib.get_close_matches(name_or_path, names, n=1, cutoff=0.5)
    raise ConfigError(f"unknown suite '{name_or_path}'" + (f" (did you mean '{close[0]}'?)" if close else "")
                      + f"; built-in suites: {', '.join(names) or '-'}; or give a path to a suite YAML")


def _format_error(where: str, e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        fields = list(SourceSpec.model_fields) if "sources" in loc else list(Suite.model_fields)
        close = difflib.get_close_matches(str(err["loc"][-1]), fields, n=1, cutoff=0.5)
        msg = "unknown key" + (f" (did you mean '{close[0]}'?)" if close else f" (valid: {', '.join(fields)})")
    return f"{where}: {loc}: {msg}"


def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name or a suite YAML by path, validated (errors name the bad key)."""
    path = _suite_path(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a suite must be a mapping with 'name' and 'sources'")
    raw.setdefault("name", path.stem)
    try:
        suite = Suite.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_error(str(path), e)) from None
    from honing.verify.extract import EXTRACTORS

    if suite.extractor not in EXTRACTORS:
        raise ConfigError(f"{path}: extractor '{suite.extractor}' unknown (valid: {', '.join(EXTRACTORS)})")
    _check_seed(suite, str(path))
    return suite


def _check_seed(suite: Suite, where: str) -> None:
    from honing.schedule.sampler import check_seed_ranges

    try:
        check_seed_ranges(DEFAULT_TRAIN_SEED, suite.seed)
    except ConfigError as e:
        raise ConfigError(f"{where}: suite seed {suite.seed} overlaps the default training seeds: {e}") from None


@dataclass
class SuiteTasks:
    tasks: list[Task]
    sources: list[Any]  # the TaskSource objects, in suite order
    source_of: list[int]  # per task: the index of the suite source it came from


def make_sources(suite: Suite) -> list[Any]:
    """The suite's TaskSources; unknown sources, domains, params and verifiers fail here."""
    from honing.tasks import make_source
    from honing.verify import get_verifier

    out = []
    for i, s in enumerate(suite.sources):
        try:
            src = make_source(s.name, s.params, s.verifier, suite.prompt_template, suite.system_prompt)
        except TaskError as e:
            raise TaskError(f"suite {suite.name}: sources[{i}] ({s.name}): {e}") from None
        if s.verifier:
            get_verifier(s.verifier)
        out.append(src)
    return out


def suite_tasks(suite: Suite, limit: Optional[int] = None) -> SuiteTasks:
    """The suite's held-out tasks, `count` per source (at most `limit` per source when given)."""
    sources = make_sources(suite)
    tasks: list[Task] = []
    source_of: list[int] = []
    seen: set[str] = set()
    for i, (spec, src) in enumerate(zip(suite.sources, sources)):
        want = min(spec.count, limit) if limit else spec.count
        got: list[Task] = []
        scanned = 0
        for t in src.tasks("heldout", suite.seed):
            scanned += 1
            if spec.domains is None or t.domain in spec.domains:
                got.append(t)
            if len(got) >= want or scanned >= want * SCAN_FACTOR:
                break
        if spec.domains is not None:
            missing = [d for d in spec.domains if not any(t.domain == d for t in got)]
            if missing:
                raise TaskError(f"suite {suite.name}: source {spec.name} yields no tasks of domain "
                                f"{', '.join(repr(d) for d in missing)} (it yields: "
                                f"{', '.join(sorted({t.domain for t in got})) or 'nothing'})")
        if not got:
            raise TaskError(f"suite {suite.name}: source {spec.name} has no held-out tasks")
        tasks.extend(_unique(got, seen, i))
        source_of.extend([i] * len(got))
    return SuiteTasks(tasks, sources, source_of)


def _unique(tasks: list[Task], seen: set[str], source_index: int) -> list[Task]:
    """The same source twice with other params (finance level 1, then level 2) yields the same
    ids: suffix repeats with '@s<source index>' (as a training run's repeated sources do: TaggedSource)
    so per-task results and comparisons stay keyed."""
    from dataclasses import replace

    from honing.tasks.types import source_suffix

    out = []
    for t in tasks:
        if t.id in seen:
            t = replace(t, id=t.id + source_suffix(source_index))
        seen.add(t.id)
        out.append(t)
    return out
