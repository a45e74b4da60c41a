"""Tasks: the Task type, the TaskSource protocol, and the built-in sources by name."""

from __future__ import annotations

from honing.errors import TaskError
from honing.tasks.gym import GymSource, gym_dataset_names
from honing.tasks.jsonl import JsonlSource
from honing.tasks.types import Message, Task, TaskSource, VerifierSpec, task_from_json, task_to_json
from honing.tasks.user import SOURCES, build_user_source, register_source

__all__ = ["Task", "TaskSource", "VerifierSpec", "Message", "make_source", "GymSource", "JsonlSource",
           "gym_dataset_names", "task_from_json", "task_to_json", "register_source"]
BUILTIN_SOURCES = ("humaneval", "code:functions", "finance", "repair", "repair:dir:<path>", "gym:<dataset>",
                   "jsonl:<path>", "pool:<dir>@<version>")

SOURCE_KINDS = ("gym", "jsonl")


def make_source(name: str, params: dict | None = None, verifier: str | None = None,
                prompt_template: str = "{question}", system_prompt: str | None = None) -> TaskSource:
    """'gym:<dataset>', 'jsonl:<path>', 'humaneval', 'code:functions' or 'finance' -> a TaskSource."""
    if name == "humaneval":
        from honing.tasks.code import HumanEvalSource

        return HumanEvalSource(params, verifier, system_prompt)
    if name == "code:functions":
        from honing.tasks.code import CodeFunctionsSource

        return CodeFunctionsSource(params, verifier, system_prompt)
    if name == "finance":
        from honing.tasks.finance import FinanceSource

        return FinanceSource(params, verifier, system_prompt)
    if name == "repair" or name.startswith("repair:dir:"):
        from honing.tasks.repair import RepairDirSource, RepairSource

        if name == "repair":
            return RepairSource(params, verifier, system_prompt)
        return RepairDirSource(name[len("repair:dir:"):], params, verifier, system_prompt)
    kind, _, rest = name.partition(":")
    if kind == "gym" and rest:
        return GymSource(rest, params, verifier, prompt_template, system_prompt)
    if kind == "pool" and rest:  # a flywheel pool snapshot: pool:<dir>@<version|latest>
        from honing.flywheel.pool import PoolSource

        return PoolSource(rest, params, verifier, system_prompt)
    if kind == "jsonl" and rest:
        if params:
            raise TaskError(f"{name}: jsonl sources take no params (got {sorted(params)})")
        return JsonlSource(rest, verifier, system_prompt, prompt_template)
    return _user_source(name, params, verifier, system_prompt)


def _user_source(name: str, params: dict | None, verifier: str | None, system_prompt: str | None) -> TaskSource:
    """A registered source, user code by reference, an installed package's entry point, or an
    environment package (`env:<name>`)."""
    from honing import plugins

    if name in SOURCES:
        return build_user_source(SOURCES[name], name, params, verifier, system_prompt)
    known = list(BUILTIN_SOURCES) + sorted(SOURCES) + plugins.entry_point_names("source") + \
        [f"env:{n}" for n in plugins.entry_point_names("environment")]
    if plugins.is_reference(name):
        try:
            obj = plugins.resolve(name, plugins.base())
        except plugins.ModuleMissing as e:
            raise plugins.unknown_name("task source", name, known, str(e)) from None
        return build_user_source(obj, name, params, verifier, system_prompt)
    if name.startswith("env:"):
        from honing.envpkg import environment_source

        return environment_source(name[len("env:"):], params, verifier, system_prompt)
    found = plugins.load_entry_point("source", name)
    if found is not None:
        return build_user_source(found, name, params, verifier, system_prompt)
    raise plugins.unknown_name("task source", name, known)
