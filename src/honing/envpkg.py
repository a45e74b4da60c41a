"""Environment packages: one installable package = one domain.

A package declares an `Environment` object and points the entry point group
`honing.environments` at it:

    # pyproject.toml
    [project.entry-points."honing.environments"]
    word_sort = "honing_word_sort:ENV"

    # honing_word_sort/__init__.py
    ENV = honing.envpkg.Environment(name="word_sort", version="0.1.0", description="...",
                                    tasks=make_tasks, verifier=score)

A recipe then names its tasks `env:word_sort`; their verifier is the package's (registered as
`env:word_sort`), its tools are registered under their own names and its multi-turn environment
factory, if any, under the kind `env:word_sort`. `honing env list` shows installed packages,
`honing env check NAME` runs the self-test (`check_environment`), `honing env new NAME`
scaffolds one.

User code runs where it belongs: the verifier is trusted grader code on the host (one that
executes model output must do so through the sandbox, e.g. `ctx.extra["sandbox"]`, and say
`needs_sandbox = True`); tools act on the episode's sandbox session (`ctx.session`), so what
the model writes runs in the box, never on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from honing.errors import TaskError


@dataclass
class Environment:
    """What an environment package provides (see the module docstring)."""

    name: str
    tasks: Any
    """A TaskSource, a class/factory taking the recipe's params, a `fn(split, seed, **params)`, or a
    path to a JSONL task file (relative to the package)."""
    verifier: Any
    """A reward function, a Verifier or a Verifier class; graded tasks name it `env:<name>`."""
    version: str = "0.0.0"
    description: str = ""
    tools: Sequence[Any] = ()
    """honing.rollout.tools.Tool objects the tasks' `environment["tools"]` may name."""
    environment: Callable[[Any], Any] | None = None
    """A multi-turn environment factory `fn(task) -> Environment` (tasks use kind `env:<name>`)."""
    eval_suite: str | None = None
    """Path (relative to the package) of an eval suite YAML."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Default source params (a recipe's params override them)."""
    package_dir: Path | None = None

    @property
    def verifier_name(self) -> str:
        return f"env:{self.name}"


_LOADED: dict[str, Environment] = {}


def installed_environments() -> dict[str, str]:
    """name -> entry point value of every installed environment package."""
    from importlib import metadata

    return {ep.name: ep.value for ep in metadata.entry_points(group="honing.environments")}


def load_environment(name: str) -> Environment:
    """Load an installed environment package and register its verifier, tools and environment."""
    if name in _LOADED:
        return _LOADED[name]
    from honing import plugins

    obj = plugins.load_entry_point("environment", name)
    if obj is None:
        raise plugins.unknown_name("environment package", f"env:{name}",
                                   [f"env:{n}" for n in plugins.entry_point_names("environment")])
    env = obj() if callable(obj) and not isinstance(obj, Environment) else obj
    if not isinstance(env, Environment):
        raise TaskError(f"environment package '{name}': its entry point gives a {type(env).__name__}, "
                        "not a honing.envpkg.Environment")
    if env.package_dir is None:
        env.package_dir = _package_dir_of(name)
    _register(env)
    _LOADED[name] = env
    return env


def _package_dir_of(name: str) -> Path | None:
    import importlib

    for n, value in installed_environments().items():
        if n == name:
            mod = importlib.import_module(value.split(":")[0])
            return Path(mod.__file__).parent if getattr(mod, "__file__", None) else None
    return None


def _register(env: Environment) -> None:
    from honing.rollout.env import register_environment
    from honing.rollout.tools import register_tool
    from honing.verify import register_verifier

    register_verifier(env.verifier_name, env.verifier)
    for tool in env.tools:
        register_tool(tool)
    if env.environment is not None:
        register_environment(env.verifier_name, env.environment)


def environment_source(name: str, params: Mapping[str, Any] | None, verifier: str | None,
                       system_prompt: str | None) -> Any:
    """The TaskSource of `env:<name>`, graded by the package's verifier unless the recipe says otherwise."""
    from honing.tasks.user import build_user_source

    env = load_environment(name)
    merged = {**dict(env.params), **dict(params or {})}
    tasks = env.tasks
    if isinstance(tasks, (str, Path)):
        from honing.tasks.jsonl import JsonlSource

        path = Path(tasks)
        if not path.is_absolute() and env.package_dir is not None:
            path = env.package_dir / path
        if merged:
            raise TaskError(f"env:{name}: a task file takes no params (got {sorted(merged)})")
        tasks = JsonlSource(str(path), verifier or env.verifier_name, system_prompt)
        merged = {}
    src = build_user_source(tasks, f"env:{name}", merged, verifier or env.verifier_name, system_prompt)
    src.domain = f"env:{name}" if src.domain in ("", f"env:{name}") else src.domain
    return src
