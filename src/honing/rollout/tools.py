"""Tools for multi-turn episodes: the `Tool` type, the text call format, and the built-ins.

Call format (works with any chat template; it is also the Hermes/Qwen native format):

    <tool_call>{"name": "read_file", "arguments": {"path": "pkg/core.py"}}</tool_call>

One call per assistant turn; text around it is free (reasoning). Only the first call of a
turn runs. A reply without a parseable call gets an error observation that shows the format
again; it does not end the episode (the loop stops after `max_parse_errors` of them).

Built-ins: list_files, read_file (line ranges), write_file, apply_patch (unified diff, or
SEARCH/REPLACE blocks), run (a shell command in the session, with limits), run_tests (the
task's visible test command), submit. Tools act on a sandbox `Session`; host-side reads and
writes go through the session's workspace, which never follows links the box planted.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from honing.sandbox import Limits, SandboxError, Session

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CALL_CLOSE) + r"|\Z)", re.S)
DEFAULT_TEST_COMMAND = "python3 -m unittest discover -s tests -t . 2>&1"
SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache"}


@dataclass
class ToolResult:
    """What a tool returns: the observation text, whether the episode ends, and what kind of
    step it was (counted for information density: test runs, edits, failures)."""

    text: str
    ok: bool = True
    done: bool = False
    kind: str = ""  # "test", "edit", "submit", "" (other)
    infra_error: str | None = None


@dataclass
class ToolContext:
    session: Session
    task: Any
    limits: Limits


@dataclass(frozen=True)
class Tool:
    """A named function with a JSON schema (an object schema: `properties`, `required`)."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., ToolResult | str]

    def call(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolResult:
        problem = check_arguments(self.parameters, arguments)
        if problem:
            return ToolResult(f"error: {self.name}: {problem}", ok=False)
        out = self.fn(ctx, **arguments)
        return out if isinstance(out, ToolResult) else ToolResult(str(out))

    def schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}


_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                            "boolean": (bool,), "object": (dict,), "array": (list,)}


def check_arguments(schema: Mapping[str, Any], args: Any) -> str:
    """A small JSON-schema subset: object with typed properties, required keys, no extras."""
    if not isinstance(args, dict):
        return "'arguments' must be a JSON object"
    props = schema.get("properties", {})
    missing = [k for k in schema.get("required", ()) if k not in args]
    if missing:
        return f"missing argument(s) {', '.join(missing)}"
    extra = [k for k in args if k not in props]
    if extra:
        return f"unknown argument(s) {', '.join(extra)} (known: {', '.join(props) or 'none'})"
    for k, v in args.items():
        want = props[k].get("type")
        types = _JSON_TYPES.get(want, (object,))
        if not isinstance(v, types) or (want in ("integer", "number") and isinstance(v, bool)):
            return f"argument '{k}' must be of type {want}"
    return ""


@dataclass
class ParsedCall:
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # non-empty: the reply held no usable call
    n_calls: int = 0


_PLACEHOLDER = {"string": "...", "integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}


def example_call(tools: Sequence[Tool]) -> dict[str, Any]:
    """A call of one of *these* tools (an example naming a tool the episode lacks gets copied, and then
    refused): read_file where there is one, else the first tool, its required arguments as placeholders."""
    if not tools:
        return {"name": "submit", "arguments": {}}
    if any(t.name == "read_file" for t in tools):
        return {"name": "read_file", "arguments": {"path": "README.md"}}
    t = tools[0]
    props = t.parameters.get("properties", {})
    return {"name": t.name, "arguments": {k: _PLACEHOLDER.get(props.get(k, {}).get("type", "string"), "...")
                                          for k in t.parameters.get("required", ())}}


def format_help(tools: Sequence[Tool]) -> str:
    return (f"Call exactly one tool per reply, like this:\n{CALL_OPEN}{json.dumps(example_call(tools))}{CALL_CLOSE}\n"
            f"Available tools: {', '.join(t.name for t in tools)}.")


def parse_call(text: str, tools: Sequence[Tool]) -> ParsedCall:
    """The first <tool_call> of an assistant reply (a missing closing tag is tolerated)."""
    found = _CALL.findall(text)
    if not found:
        return ParsedCall(error="no tool call found in your reply. " + format_help(tools))
    body = found[0].strip()
    if body.startswith("```"):  # a fenced JSON body inside the tags
        body = body.strip("`").removeprefix("json").strip()
    try:
        obj = json.loads(body)
    except ValueError as e:
        return ParsedCall(error=f"the tool call is not valid JSON ({e}). " + format_help(tools), n_calls=len(found))
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ParsedCall(error='a tool call is a JSON object {"name": ..., "arguments": {...}}. '
                          + format_help(tools), n_calls=len(found))
    names = [t.name for t in tools]
    if obj["name"] not in names:
        return ParsedCall(error=f"unknown tool '{obj['name']}'. " + format_help(tools), n_calls=len(found))
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models send the arguments JSON-encoded
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return ParsedCall(name=obj["name"], arguments=args if args is not None else {}, n_calls=len(found))


def tools_prompt(tools: Sequence[Tool]) -> str:
    """The system text that declares the tools and the call format."""
    lines = ["You can act in a sandboxed workspace with these tools (JSON schemas):"]
    lines += [json.dumps(t.schema()) for t in tools]
    lines.append(format_help(tools))
    lines.append("Each tool result comes back in the next message. Call submit when you are done.")
    return "\n".join(lines)


def cap_text(text: str, max_chars: int) -> str:
    """Keep the head and the tail (errors are usually at the end) of a long output."""
    if len(text) <= max_chars:
        return text
    half = max(max_chars // 2 - 30, 1)
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


# --- patches ---------------------------------------------------------------------------------------
class PatchError(ValueError):
    pass


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _strip_prefix(path: str) -> str:
    path = path.split("\t")[0].strip()
    return path[2:] if path.startswith(("a/", "b/")) else path


def parse_unified_diff(patch: str) -> list[tuple[str | None, str | None, list[list[str]]]]:
    """[(old path, new path, hunks)]; a hunk is its body lines (' ', '-', '+' prefixed)."""
    files: list[tuple[str | None, str | None, list[list[str]]]] = []
    lines = patch.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _strip_prefix(lines[i][4:]), _strip_prefix(lines[i + 1][4:])
            files.append((None if old == "/dev/null" else old, None if new == "/dev/null" else new, []))
            i += 2
            continue
        if _HUNK.match(lines[i]):
            if not files:
                raise PatchError("hunk before any '--- a/file' / '+++ b/file' header")
            body: list[str] = []
            i += 1
            while i < len(lines) and not _HUNK.match(lines[i]) and not lines[i].startswith("--- "):
                ln = lines[i]
                if ln.startswith("\\"):  # "\ No newline at end of file"
                    i += 1
                    continue
                body.append(ln if ln[:1] in (" ", "-", "+") else " " + ln)
                i += 1
            files[-1][2].append(body)
            continue
        i += 1
    if not files:
        raise PatchError("no '--- a/file' / '+++ b/file' header found")
    return files


def closest_lines(lines: Sequence[str], wanted: Sequence[str], max_lines: int = 12) -> str:
    """The file's stretch most like the lines a hunk expected, numbered as read_file numbers them,
    for the error a policy corrects from (the workspace's own file: nothing hidden). '' when
    nothing is alike (ratio < 0.5) or the file is empty."""
    if not lines or not wanted:
        return ""
    n = min(len(wanted), max_lines, len(lines))
    target = "\n".join(wanted[:n])
    best, at = 0.0, 0
    for k in range(min(len(lines), 5000) - n + 1):
        m = difflib.SequenceMatcher(None, target, "\n".join(lines[k:k + n]), autojunk=False)
        if m.real_quick_ratio() <= best or m.quick_ratio() <= best:
            continue
        r = m.ratio()
        if r > best:
            best, at = r, k
    if best < 0.5:
        return ""
    body = "\n".join(f"{i + 1:4d}| {lines[i]}" for i in range(at, at + n))
    return f"\nthe closest lines in the file ({at + 1}-{at + n}):\n{body}"


def apply_hunks(text: str, hunks: list[list[str]]) -> str:
    """Apply hunks by matching their old lines exactly (line numbers are only a hint)."""
    lines = text.splitlines()
    for h in hunks:
        old = [ln[1:] for ln in h if ln[:1] in (" ", "-")]
        new = [ln[1:] for ln in h if ln[:1] in (" ", "+")]
        while old and new and old[-1] == new[-1] == "" and old[-1:] != lines[-1:]:
            old, new = old[:-1], new[:-1]  # a trailing empty context line an editor added
        if not old:
            lines = lines + new
            continue
        at = [k for k in range(len(lines) - len(old) + 1) if lines[k:k + len(old)] == old]
        if not at:
            raise PatchError("hunk does not apply; these lines were not found:\n" + "\n".join(old[:8])
                             + closest_lines(lines, old))
        k = at[0]
        lines[k:k + len(old)] = new
    return "\n".join(lines) + "\n" if lines else ""


_SR = re.compile(r"<<<<<<< SEARCH\n(.*?)\n?=======\n(.*?)\n?>>>>>>> REPLACE", re.S)


def apply_search_replace(text: str, patch: str) -> str:
    blocks = _SR.findall(patch)
    if not blocks:
        raise PatchError("no SEARCH/REPLACE block found")
    for search, replace in blocks:
        n = text.count(search)
        if n != 1:
            raise PatchError(f"the SEARCH text must occur exactly once in the file; it occurs {n} times:\n{search[:300]}")
        text = text.replace(search, replace, 1)
    return text


# --- built-in tools -----------------------------------------------------------------------------
def _read_text(ctx: ToolContext, path: str) -> str:
    return ctx.session.read(path).decode("utf-8", "replace")


def list_files(ctx: ToolContext, path: str = ".") -> ToolResult:
    root = os.path.realpath(ctx.session.ws.path)
    base = os.path.realpath(os.path.join(root, path))  # a link the box planted must not lead out
    if os.path.commonpath([root, base]) != root or not os.path.isdir(base):
        return ToolResult(f"error: list_files: {path!r} is not a directory in the workspace", ok=False)
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base):  # os.walk does not follow links by default
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        out += [os.path.relpath(os.path.join(dirpath, f), root) for f in sorted(filenames)]
        if len(out) > 500:
            out.append("[... more files ...]")
            break
    return ToolResult("\n".join(out) if out else "(no files)")


def read_file(ctx: ToolContext, path: str, start_line: int = 1, end_line: int | None = None) -> ToolResult:
    try:
        lines = _read_text(ctx, path).splitlines()
    except SandboxError as e:
        return ToolResult(f"error: read_file: {e}", ok=False)
    start = max(start_line, 1)
    end = len(lines) if end_line is None else min(end_line, len(lines))
    body = "\n".join(f"{i:4d}| {lines[i - 1]}" for i in range(start, end + 1))
    return ToolResult(f"{path} (lines {start}-{end} of {len(lines)}):\n{body}")


def write_file(ctx: ToolContext, path: str, content: str) -> ToolResult:
    try:
        ctx.session.write(path, content)
    except SandboxError as e:
        return ToolResult(f"error: write_file: {e}", ok=False)
    return ToolResult(f"wrote {len(content)} characters to {path}", kind="edit")


def apply_patch(ctx: ToolContext, patch: str, path: str | None = None) -> ToolResult:
    try:
        if "<<<<<<< SEARCH" in patch:
            if not path:
                raise PatchError("a SEARCH/REPLACE patch needs the 'path' argument")
            ctx.session.write(path, apply_search_replace(_read_text(ctx, path), patch))
            return ToolResult(f"patched {path}", kind="edit")
        changed = []
        for old, new, hunks in parse_unified_diff(patch):
            target = new or old
            if target is None:
                raise PatchError("a diff between /dev/null and /dev/null")
            if new is None:
                ctx.session.exec(["rm", "-f", "--", old or ""])
            else:
                src = _read_text(ctx, old) if old is not None else ""
                ctx.session.write(new, apply_hunks(src, hunks))
            changed.append(target)
        return ToolResult(f"patched {', '.join(changed)}", kind="edit")
    except (PatchError, SandboxError) as e:
        return ToolResult(f"error: apply_patch: {e}", ok=False)


def _exec_text(res: Any) -> str:
    status = "timed out" if res.timed_out else ("out of memory" if res.oom else f"exit code {res.exit_code}")
    parts = [status]
    if res.stdout:
        parts.append("--- stdout ---\n" + res.stdout.rstrip("\n"))
    if res.stderr:
        parts.append("--- stderr ---\n" + res.stderr.rstrip("\n"))
    return "\n".join(parts)


def run(ctx: ToolContext, command: str, timeout_s: float = 10.0) -> ToolResult:
    limits = ctx.limits.replace(timeout_s=min(max(float(timeout_s), 0.1), ctx.limits.timeout_s))
    res = ctx.session.exec(command, limits=limits)
    return ToolResult(_exec_text(res), ok=res.ok, infra_error=res.infra_error)


def run_tests(ctx: ToolContext) -> ToolResult:
    env = ctx.task.environment or {}
    res = ctx.session.exec(env.get("test_command", DEFAULT_TEST_COMMAND))
    return ToolResult(("tests passed: " if res.ok else "tests failed: ") + _exec_text(res), ok=res.ok,
                      kind="test", infra_error=res.infra_error)


def submit(ctx: ToolContext) -> ToolResult:
    return ToolResult("submitted", done=True, kind="submit")


def _schema(props: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


_S, _I = {"type": "string"}, {"type": "integer"}
BUILTIN_TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("list_files", "List the files under a directory of the workspace.", _schema({"path": _S}), list_files),
    Tool("read_file", "Read a file with line numbers; optional 1-based inclusive line range.",
         _schema({"path": _S, "start_line": _I, "end_line": _I}, ["path"]), read_file),
    Tool("write_file", "Create or overwrite a file.", _schema({"path": _S, "content": _S}, ["path", "content"]),
         write_file),
    Tool("apply_patch", "Apply a unified diff (--- a/f, +++ b/f, @@ hunks), or SEARCH/REPLACE blocks "
         "('<<<<<<< SEARCH', old, '=======', new, '>>>>>>> REPLACE') to the file given by 'path'.",
         _schema({"patch": _S, "path": _S}, ["patch"]), apply_patch),
    Tool("run", "Run a shell command in the workspace (with time and memory limits).",
         _schema({"command": _S, "timeout_s": {"type": "number"}}, ["command"]), run),
    Tool("run_tests", "Run the visible test suite.", _schema({}), run_tests),
    Tool("submit", "Finish the episode; your files are then graded.", _schema({}), submit),
)}
CODING_TOOLS = tuple(BUILTIN_TOOLS)


USER_TOOLS: dict[str, Tool] = {}


def register_tool(tool: Tool) -> Tool:
    """Make a user Tool nameable in a task's `environment["tools"]`. Its function runs on the host
    with a ToolContext and must act on the episode's sandbox through `ctx.session` (run, read,
    write): what the model wrote never runs outside the box."""
    if not isinstance(tool, Tool):
        raise TypeError(f"register_tool takes a honing Tool, got {type(tool).__name__}")
    if tool.name in BUILTIN_TOOLS:
        raise ValueError(f"tool name {tool.name!r} is a built-in")
    USER_TOOLS[tool.name] = tool
    return tool


def _tool(name: str) -> Tool | None:
    if name in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[name]
    if name in USER_TOOLS:
        return USER_TOOLS[name]
    from honing import plugins

    if plugins.is_reference(name):
        obj = plugins.resolve(name, plugins.base())
        if isinstance(obj, Tool):
            return USER_TOOLS.setdefault(name, obj)
    return None


def get_tools(names: Sequence[str] | None = None) -> list[Tool]:
    names = list(names) if names is not None else list(CODING_TOOLS)
    found = {n: _tool(n) for n in names}
    unknown = [n for n, t in found.items() if t is None]
    if unknown:
        raise ValueError(f"unknown tool(s) {unknown} (built-ins: {', '.join(BUILTIN_TOOLS)}"
                         + (f"; registered: {', '.join(USER_TOOLS)}" if USER_TOOLS else "") + ")")
    return [found[n] for n in names]  # type: ignore[misc]
