"""Environment packages: one installable package = one domain.

A package declares an `Environment` object and points the entry point group
`honing.environments` at it:

    # pyproject.toml
    [project.entry-points."honing.environments"]
    word_sort = "honing_word_sort:ENV"

    # honing_word_sort/__init__.py
    ENV = honing.envpkg.Environment(name="word_sort", version="0.1.0", description="...",
                                    tasks=make_tasks, verifier=score, reference=solve)

A recipe then names its tasks `env:word_sort`; their verifier is the package's (registered as
`env:word_sort`), its tools are registered under their own names and its multi-turn environment
factory, if any, under the kind `env:word_sort`. `honing env list` shows installed packages,
`honing env check NAME` runs the self-test (`check_environment`), `honing env new NAME`
scaffolds one (docs/environments.md).

`reference(task)` is the package's reference solver, used by the self-test: for a single-turn
task it returns the reference completion (default: `str(task.hidden["answer"])`); for a
multi-turn task, the assistant turns of a reference episode, each a reply's raw text or a tool
call `{"name": ..., "arguments": {...}}` (default: the task's hidden `reference_patch` /
`solution` replay of `honing rollout --policy reference`).

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
    reference: Callable[[Any], Any] | None = None
    """Reference solver `fn(task)`: a completion (single-turn) or a list of assistant turns, each
    raw text or `{"name": tool, "arguments": {...}}` (multi-turn); see the module docstring."""

    @property
    def verifier_name(self) -> str:
        return f"env:{self.name}"


_LOADED: dict[str, Environment] = {}
_TOOL_OWNER: dict[str, tuple[str, Any]] = {}  # tool name -> (package, Tool): tool names are global


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
        raise unknown_environment(name)
    env = obj() if callable(obj) and not isinstance(obj, Environment) else obj
    if not isinstance(env, Environment):
        raise TaskError(f"environment package '{name}': its entry point gives a {type(env).__name__}, "
                        "not a honing.envpkg.Environment")
    if env.name != name:
        raise TaskError(f"environment package '{name}': its Environment is named '{env.name}'; the entry point "
                        "name and Environment.name must match")
    return register(env)


def register(env: Environment) -> Environment:
    """Make `env:<env.name>` usable in this process (its tasks, verifier, tools and environment
    kind) without installing it; `load_environment` calls this for installed packages."""
    if not isinstance(env, Environment):
        raise TaskError(f"expected a honing.envpkg.Environment, got {type(env).__name__}")
    if env.package_dir is None:
        env.package_dir = _package_dir_of(env.name) or _module_dir(env.tasks) or _module_dir(env.verifier)
    _register(env)
    _LOADED[env.name] = env
    return env


def _module_dir(obj: Any) -> Path | None:
    import inspect

    mod = inspect.getmodule(obj)
    f = getattr(mod, "__file__", None)
    return Path(f).resolve().parent if f else None


def unknown_environment(name: str) -> TaskError:
    """The error for an environment package that is not installed: the nearest installed names."""
    import difflib

    from honing import plugins

    installed = sorted(set(plugins.entry_point_names("environment")) | set(_LOADED))
    close = difflib.get_close_matches(name, installed, n=3, cutoff=0.5)
    hint = (f"; closest: {', '.join(close)}" if close else
            f"; installed: {', '.join(installed)}" if installed else "; none is installed")
    return plugins.PluginError(f"unknown environment package '{name}'{hint} (`honing env list` shows the installed "
                               "ones; `pip install` a package, or scaffold one with `honing env new NAME`)")


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
        owner = _TOOL_OWNER.get(getattr(tool, "name", ""))
        if owner is not None and owner[0] != env.name and owner[1] is not tool:
            raise TaskError(f"environment package '{env.name}': its tool '{tool.name}' clashes with the tool of the "
                            f"same name from package '{owner[0]}' (tool names are global; rename one)")
        register_tool(tool)
        _TOOL_OWNER[tool.name] = (env.name, tool)
    if env.environment is not None:
        register_environment(env.verifier_name, env.environment)


def environment_source(name: str, params: Mapping[str, Any] | None, verifier: str | None,
                       system_prompt: str | None) -> Any:
    """The TaskSource of `env:<name>`, graded by the package's verifier unless the recipe says otherwise."""
    return source_of(load_environment(name), params, verifier, system_prompt)


def source_of(env: Environment, params: Mapping[str, Any] | None = None, verifier: str | None = None,
              system_prompt: str | None = None) -> Any:
    """The TaskSource of a (registered) Environment: its tasks checked field by field as they stream."""
    from honing.tasks.user import build_user_source

    name = env.name
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
