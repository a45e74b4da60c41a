"""Tool-call parsing, argument checks and the patch appliers (pure functions: no sandbox)."""

from __future__ import annotations

import difflib
import json

import pytest

from honing.rollout.tools import (
    CALL_OPEN,
    PatchError,
    apply_hunks,
    apply_search_replace,
    cap_text,
    closest_lines,
    check_arguments,
    get_tools,
    parse_call,
    parse_unified_diff,
    tools_prompt,
)

TOOLS = get_tools()


def test_parse_call_reads_the_first_call_and_tolerates_a_missing_closing_tag():
    text = 'I will look.\n<tool_call>{"name": "read_file", "arguments": {"path": "a.py", "start_line": 2}}</tool_call>'
    c = parse_call(text, TOOLS)
    assert (c.name, c.arguments, c.error, c.n_calls) == ("read_file", {"path": "a.py", "start_line": 2}, "", 1)
    c = parse_call('<tool_call>{"name": "submit", "arguments": {}}', TOOLS)
    assert c.name == "submit" and not c.error
    two = parse_call('<tool_call>{"name": "run_tests"}</tool_call> then <tool_call>{"name": "submit"}</tool_call>', TOOLS)
    assert two.name == "run_tests" and two.n_calls == 2 and two.arguments == {}
    # arguments sent JSON-encoded as a string (some models do this) are decoded
    assert parse_call('<tool_call>{"name": "list_files", "arguments": "{\\"path\\": \\".\\"}"}</tool_call>',
                      TOOLS).arguments == {"path": "."}


@pytest.mark.parametrize("text, needle", [
    ("I think the bug is in line 3.", "no tool call found"),
    ("<tool_call>{name: read_file}</tool_call>", "not valid JSON"),
    ('<tool_call>["read_file"]</tool_call>', '{"name": ..., "arguments": {...}}'),
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown tool 'rm_rf'"),
])
def test_malformed_calls_get_an_error_that_teaches_the_format(text, needle):
    c = parse_call(text, TOOLS)
    assert c.error and needle in c.error
    assert CALL_OPEN in c.error and "Available tools: list_files, read_file" in c.error


def test_check_arguments_is_a_strict_schema_subset():
    schema = {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["path"]}
    assert check_arguments(schema, {"path": "x", "n": 3}) == ""
    assert "missing argument(s) path" in check_arguments(schema, {"n": 3})
    assert "unknown argument(s) mode" in check_arguments(schema, {"path": "x", "mode": "w"})
    assert "must be of type integer" in check_arguments(schema, {"path": "x", "n": "3"})
    assert "must be of type integer" in check_arguments(schema, {"path": "x", "n": True})  # bool is not an int
    assert "JSON object" in check_arguments(schema, ["x"])


def test_tools_prompt_declares_every_tool_and_the_format():
    text = tools_prompt(TOOLS)
    for t in TOOLS:
        assert f'"name": "{t.name}"' in text
    assert CALL_OPEN in text and "submit" in text


SRC = "def f(x):\n    y = x + 1\n    return y * 2\n\n\ndef g():\n    return 0\n"


def test_unified_diff_from_difflib_applies_and_ignores_stale_line_numbers():
    new = SRC.replace("x + 1", "x - 1").replace("return 0", "return 1")
    patch = "".join(difflib.unified_diff(SRC.splitlines(True), new.splitlines(True), "a/m.py", "b/m.py"))
    [(old_path, new_path, hunks)] = parse_unified_diff(patch)
    assert (old_path, new_path) == ("m.py", "m.py")
    assert apply_hunks(SRC, hunks) == new
    shifted = "# a header line\n" + SRC  # the hunk's line numbers are now off by one
    assert apply_hunks(shifted, hunks) == "# a header line\n" + new
    with pytest.raises(PatchError, match="does not apply"):
        apply_hunks(SRC.replace("y * 2", "y * 3"), parse_unified_diff(patch)[0][2])


def test_a_hunk_that_misses_shows_the_closest_lines_of_the_file():
    """A policy that guessed a line gets the file's real lines in the error, numbered like read_file."""
    src = "\n".join(["import os", "", "", "def scale(x, factor):", "    return x * factor - 3", "", "",
                     "def safe_ratio(a, b):", "    return a / b if b else 0.0"]) + "\n"
    guess = "--- a/m.py\n+++ b/m.py\n@@ -4,2 +4,2 @@\n def scale(x, factor):\n-    return x * factor - 7\n+    return x * factor + 7\n"
    with pytest.raises(PatchError) as e:
        apply_hunks(src, parse_unified_diff(guess)[0][2])
    msg = str(e.value)
    assert "these lines were not found:\ndef scale(x, factor):\n    return x * factor - 7\n" in msg  # then the real ones
    assert "the closest lines in the file (4-5):\n   4| def scale(x, factor):\n   5|     return x * factor - 3" in msg
    assert closest_lines(src.splitlines(), ["completely different text here"]) == ""  # nothing alike: no hint
    assert closest_lines([], ["x"]) == ""


def test_new_and_deleted_files_in_a_diff():
    patch = "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+A = 1\n+B = 2\n--- a/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-X\n"
    files = parse_unified_diff(patch)
    assert [(o, n) for o, n, _ in files] == [(None, "new.py"), ("old.py", None)]
    assert apply_hunks("", files[0][2]) == "A = 1\nB = 2\n"
    with pytest.raises(PatchError, match="header"):
        parse_unified_diff("just some text\n")


def test_search_replace_needs_exactly_one_match():
    block = "<<<<<<< SEARCH\n    y = x + 1\n=======\n    y = x - 1\n>>>>>>> REPLACE"
    assert apply_search_replace(SRC, block) == SRC.replace("x + 1", "x - 1")
    with pytest.raises(PatchError, match="occurs 0 times"):
        apply_search_replace(SRC, block.replace("x + 1", "x + 7"))
    with pytest.raises(PatchError, match="occurs 2 times"):
        apply_search_replace(SRC, "<<<<<<< SEARCH\n    return\n=======\n    yield\n>>>>>>> REPLACE")
    with pytest.raises(PatchError, match="no SEARCH/REPLACE block"):
        apply_search_replace(SRC, "replace x with y")


def test_cap_text_keeps_head_and_tail():
    text = "HEAD" + "x" * 10_000 + "TAIL"
    out = cap_text(text, 200)
    assert len(out) < 300 and out.startswith("HEAD") and out.endswith("TAIL") and "characters cut" in out
    assert cap_text("short", 200) == "short"


def test_the_format_help_names_a_tool_the_episode_has() -> None:
    """The error observation's example call is one of the episode's own tools: a fixed read_file
    example in an episode without read_file (CAD: build, render, submit) was copied by the base model
    and refused as an unknown tool, three turns running."""
    from honing.rollout.tools import Tool, example_call, format_help, get_tools

    build = Tool("build", "build a part", {"type": "object", "properties": {"code": {"type": "string"},
                                                                         "scale": {"type": "number"}},
                                           "required": ["code"]}, lambda ctx, code: code)
    tools = [build, *get_tools(["submit"])]
    ex = example_call(tools)
    assert ex == {"name": "build", "arguments": {"code": "..."}}
    assert parse_call(f"<tool_call>{json.dumps(ex)}</tool_call>", tools).error == ""  # the example itself parses
    assert "read_file" not in parse_call("no call here", tools).error
    assert '"name": "read_file"' in format_help(get_tools(["read_file", "submit"]))  # where it exists, as before
