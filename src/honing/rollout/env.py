"""Environments for multi-turn episodes (DESIGN.md: `reset(task, session) -> observation`,
`step(action) -> (observation, done)`).

The loop (honing.rollout.multiturn) owns turn limits, the context budget and stop
conditions; an environment only turns one assistant reply into one observation. The
`ToolEnvironment` is built from `Tool`s: it parses the reply's tool call, runs the tool in
the sandbox session and reports the result, and counts what the scheduler wants to know
(failed calls, test runs, correction rounds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from honing.rollout.tools import Tool, ToolContext, ToolResult, cap_text, get_tools, parse_call, tools_prompt
from honing.sandbox import Limits, SandboxError, Session


@runtime_checkable
class Environment(Protocol):
    def reset(self, task: Any, session: Session) -> str:
        """Prepare the session for `task`; return the first observation (system text for the prompt)."""
        ...

    def step(self, action: str) -> tuple[str, bool]:
        """Act on one assistant reply; return (observation, done)."""
        ...


@dataclass
class StepInfo:
    """What the last step was, for the loop's stop conditions and the trajectory record."""

    tool: str | None = None
    ok: bool = True
    parse_error: bool = False
    kind: str = ""
    infra_error: str | None = None


class ToolEnvironment:
    """Tools over a sandbox session. `reset` writes `task.environment["files"]` into the session
    and returns the tool instructions; `step` runs the reply's first tool call."""

    def __init__(self, tools: Sequence[Tool] | None = None, limits: Limits | None = None,
                 max_output_chars: int = 4000, instructions: str | None = None) -> None:
        self.tools = list(tools) if tools is not None else get_tools()
        self.limits = limits or Limits(timeout_s=10, cpu_s=10, memory_mb=512)
        self.max_output_chars = max_output_chars
        self.instructions = instructions
        self.task: Any = None
        self.session: Session | None = None
        self.last = StepInfo()
        self.stats: dict[str, int] = {}
        self._last_test_failed = False
        self._edited_since_test = False

    def reset(self, task: Any, session: Session) -> str:
        self.task, self.session = task, session
        self.stats = {"tool_calls": 0, "failed_tool_calls": 0, "parse_errors": 0, "test_runs": 0,
                      "failed_test_runs": 0, "edits": 0, "correction_rounds": 0}
        self._last_test_failed = self._edited_since_test = False
        for name, data in dict((task.environment or {}).get("files", {})).items():
            session.write(name, data)
        return self.instructions if self.instructions is not None else tools_prompt(self.tools)

    def step(self, action: str) -> tuple[str, bool]:
        if self.session is None:
            raise RuntimeError("ToolEnvironment.step before reset")
        call = parse_call(action, self.tools)
        self.stats["tool_calls"] += 1
        if call.error:
            self.stats["parse_errors"] += 1
            self.stats["failed_tool_calls"] += 1
            self.last = StepInfo(ok=False, parse_error=True)
            return f"error: {call.error}", False
        tool = next(t for t in self.tools if t.name == call.name)
        ctx = ToolContext(self.session, self.task, self.limits)
        try:
            res = tool.call(ctx, call.arguments)
        except SandboxError as e:
            res = ToolResult(f"error: {tool.name}: {e}", ok=False)
        except Exception as e:  # noqa: BLE001 - a tool bug must not kill the batch; the model sees it
            res = ToolResult(f"error: {tool.name} failed: {type(e).__name__}: {e}", ok=False)
        self._count(res)
        self.last = StepInfo(tool=tool.name, ok=res.ok, kind=res.kind, infra_error=res.infra_error)
        text = cap_text(res.text, self.max_output_chars)
        if call.n_calls > 1:
            text += f"\n(note: only the first of your {call.n_calls} tool calls was run; one call per reply)"
        return text, res.done

    def _count(self, res: ToolResult) -> None:
        if not res.ok and res.kind != "test":
            self.stats["failed_tool_calls"] += 1
        if res.kind == "edit":
            self.stats["edits"] += 1
            if self._last_test_failed and not self._edited_since_test:
                self.stats["correction_rounds"] += 1  # a fix attempt after reading a failure
            self._edited_since_test = True
        elif res.kind == "test":
            self.stats["test_runs"] += 1
            self.stats["failed_test_runs"] += int(not res.ok)
            self._last_test_failed, self._edited_since_test = not res.ok, False


EnvFactory = Callable[[Any], Environment]
ENVIRONMENTS: dict[str, EnvFactory] = {}


def register_environment(name: str, factory: EnvFactory) -> None:
    ENVIRONMENTS[name] = factory


def _tools_env(task: Any) -> Environment:
    env = dict(task.environment or {})
    lim = env.get("limits") or {}
    limits = Limits(timeout_s=10, cpu_s=10, memory_mb=512).replace(**dict(lim)) if lim else None
    return ToolEnvironment(get_tools(env.get("tools")), limits=limits,
                           max_output_chars=int(env.get("max_output_chars", 4000)))


register_environment("tools", _tools_env)


def make_environment(task: Any) -> Environment:
    """The environment a task names in `environment["kind"]` (default "tools")."""
    kind = (task.environment or {}).get("kind", "tools")
    if kind not in ENVIRONMENTS:
        from honing import plugins

        if plugins.is_reference(kind):  # a user factory `fn(task) -> Environment` named by reference
            register_environment(kind, plugins.resolve(kind, plugins.base()))
            return ENVIRONMENTS[kind](task)
        raise ValueError(f"unknown environment kind {kind!r} (known: {', '.join(sorted(ENVIRONMENTS))})")
    return ENVIRONMENTS[kind](task)
