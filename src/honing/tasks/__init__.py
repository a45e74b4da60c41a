"""Tasks: the Task type, the TaskSource protocol, and the built-in sources by name."""

from __future__ import annotations

from honing.errors import TaskError
from honing.tasks.gym import GymSource, gym_dataset_names
from honing.tasks.jsonl import JsonlSource
from honing.tasks.types import Message, Task, TaskSource, VerifierSpec, task_from_json, task_to_json

__all__ = ["Task", "TaskSource", "VerifierSpec", "Message", "make_source", "GymSource", "JsonlSource",
           "gym_dataset_names", "task_from_json", "task_to_json"]

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
    if kind == "jsonl" and rest:
        if params:
            raise TaskError(f"{name}: jsonl sources take no params (got {sorted(params)})")
        return JsonlSource(rest, verifier, system_prompt, prompt_template)
    raise TaskError(f"unknown task source '{name}': expected one of "
                    + ", ".join(f"'{k}:<name>'" for k in SOURCE_KINDS) + ", 'humaneval', 'code:functions', 'finance'"
                    + ", 'repair', 'repair:dir:<path>'")
