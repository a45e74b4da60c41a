"""`honing env ...`: environment packages (docs/environments.md).

- `honing env new NAME [--dir DIR] [--multi-turn]` scaffolds a package in DIR/NAME: pyproject.toml
  (entry point `honing.environments`), `honing_env_NAME/__init__.py` (procedural tasks, a reward
  function, a reference solver), tests/test_env.py (runs the self-test), recipe.yaml (the tiny
  model, a few steps) and a README;
- `honing env list` shows the installed packages with their version and description;
- `honing env check NAME [--n N]` runs a package's self-test (`honing.envcheck`) and exits 1 on failure.
"""

from __future__ import annotations

import keyword
from pathlib import Path
import typer

from honing.errors import HoningError

env_app = typer.Typer(no_args_is_help=True,
                      help="Environment packages: scaffold one, list the installed ones, run a package's self-test.")


@env_app.command("new")
def env_new(
    name: str = typer.Argument(..., help="Package name, a Python identifier (recipes name it env:NAME)"),
    dir: Path = typer.Option(Path("."), "--dir", help="Parent directory; the package goes in DIR/NAME"),
    multi_turn: bool = typer.Option(False, "--multi-turn", help="A multi-turn example (workspace file, a custom tool)"),
) -> None:
    """Scaffold an environment package whose own test passes (pip install -e it, then `honing env check NAME`)."""
    target = dir / name
    files = scaffold(name, target, multi_turn)
    typer.echo(f"created environment package '{name}' in {target}/")
    for f in files:
        typer.echo(f"  {f.relative_to(target)}")
    typer.echo("next:\n"
               f"  pip install -e {target}\n"
               f"  honing env check {name}\n"
               f"  pytest {target}\n"
               f"  honing train --config {target / 'recipe.yaml'}")


@env_app.command("list")
def env_list() -> None:
    """Show the installed environment packages (entry point group `honing.environments`)."""
    from honing.envpkg import installed_environments, load_environment

    found = installed_environments()
    if not found:
        typer.echo("no environment packages installed (scaffold one with `honing env new NAME`)")
        return
    rows = [("NAME", "VERSION", "DESCRIPTION", "ENTRY POINT")]
    for name in sorted(found):
        try:
            env = load_environment(name)
            rows.append((name, env.version, env.description, found[name]))
        except Exception as e:  # noqa: BLE001 - a broken package is listed, not fatal
            rows.append((name, "?", f"error: {e}"[:160], found[name]))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        typer.echo(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}".rstrip())
    typer.echo("recipes name them env:NAME; `honing env check NAME` runs a package's self-test")


@env_app.command("check")
def env_check(
    name: str = typer.Argument(..., help="Installed package name (or env:NAME)"),
    n: int = typer.Option(8, "--n", min=1, help="Tasks graded per split"),
    model: str = typer.Option("tiny-random", "--model", help="Tokenizer that renders the multi-turn episodes"),
    backend: str = typer.Option("bwrap", "--backend", help="Sandbox backend for multi-turn tasks"),
) -> None:
    """Self-test a package: reference answers score 1, junk scores 0, no hidden field reaches a prompt,
    train and held-out tasks are disjoint, every task is well-formed."""
    from honing.envcheck import check_environment

    report = check_environment(name, n, model=model, backend=backend)
    typer.echo(report.table())
    if not report.ok:
        raise typer.Exit(1)


# --- the scaffold -------------------------------------------------------------------------------
def check_name(name: str) -> None:
    if not name.isidentifier() or keyword.iskeyword(name) or not name.isascii():
        suggestion = "".join(c if c.isalnum() or c == "_" else "_" for c in name).strip("_") or "my_env"
        if suggestion[0].isdigit():
            suggestion = "env_" + suggestion
        if keyword.iskeyword(suggestion) or not suggestion.isascii():
            suggestion = "my_env"
        raise HoningError(f"environment name {name!r} is not a valid Python identifier (ASCII letters, digits and _, "
                          f"not starting with a digit, not a keyword); e.g. {suggestion!r}")


def scaffold(name: str, target: Path, multi_turn: bool = False) -> list[Path]:
    """Write the package; refuses an existing directory. Returns the files written."""
    check_name(name)
    if target.exists():
        raise HoningError(f"{target} already exists; not overwriting it (choose another name or --dir)")
    pkg = f"honing_env_{name}"
    subs = {"NAME": name, "PKG": pkg, "DIST": f"honing-env-{name.replace('_', '-')}"}
    body = MULTI_INIT if multi_turn else SINGLE_INIT
    contents = {
        "pyproject.toml": PYPROJECT,
        f"{pkg}/__init__.py": body,
        "tests/test_env.py": MULTI_TEST if multi_turn else SINGLE_TEST,
        "recipe.yaml": MULTI_RECIPE if multi_turn else SINGLE_RECIPE,
        "README.md": README,
    }
    written = []
    target.mkdir(parents=True)
    for rel, text in contents.items():
        p = target / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        for k, v in subs.items():
            text = text.replace("{{" + k + "}}", v)
        p.write_text(text.lstrip("\n"))
        written.append(p)
    return written


PYPROJECT = '''
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{{DIST}}"
version = "0.1.0"
description = "honing environment package {{NAME}}"
requires-python = ">=3.10"
dependencies = ["honing"]

[project.entry-points."honing.environments"]
{{NAME}} = "{{PKG}}:ENV"

[tool.setuptools]
packages = ["{{PKG}}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
pythonpath = ["."]
'''

SINGLE_INIT = '''
"""{{NAME}}: a honing environment package (single-turn). Replace the example domain with yours.

The example: reverse a made-up word. `make_tasks(split, seed, **params)` yields task dicts
{id, prompt, answer | hidden, ...}; `score` is the reward function (it gets the task's fields by
name: completion, answer, any hidden field); `solve` is the reference solver `honing env check`
uses. A task's split is a hash of its question, so train and held-out tasks never coincide.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from typing import Any, Iterator

from honing.envpkg import Environment

__version__ = "0.1.0"
PROMPT = "Reverse the letters of the word {word}. Reply with the reversed word only."


def split_of(question: str) -> str:
    """About 20% of questions are held out, by a hash of the text."""
    return "heldout" if int(hashlib.sha256(question.encode()).hexdigest(), 16) % 5 == 0 else "train"


def make_tasks(split: str, seed: int, min_len: int = 4, max_len: int = 7) -> Iterator[dict[str, Any]]:
    rng = random.Random(f"{{NAME}}/{seed}")
    for i in itertools.count():
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(min_len, max_len)))
        question = PROMPT.format(word=word)
        if word[::-1] in question or split_of(question) != split:
            continue  # the answer must not be readable in the question (a palindrome would be)
        yield {"id": f"{{NAME}}/{split}/{seed}/{i}", "prompt": question, "answer": word[::-1],
               "difficulty": (len(word) - min_len) / max(max_len - min_len, 1)}


def score(completion: str, answer: str) -> float:
    """1 if the reply's last word is the reversed word, else 0."""
    words = completion.strip().split()
    return float(bool(words) and words[-1].strip(".!\\"'`").lower() == answer)


def solve(task: Any) -> str:
    word = task.question.split("word ", 1)[1].split(".", 1)[0]
    return word[::-1]


ENV = Environment(
    name="{{NAME}}",
    version=__version__,
    description="Reverse a made-up word (example domain from `honing env new`)",
    tasks=make_tasks,
    verifier=score,
    reference=solve,
)
'''

MULTI_INIT = '''
"""{{NAME}}: a honing environment package (multi-turn). Replace the example domain with yours.

The example: the workspace holds numbers.txt; the model reads it with the built-in `read_file`
tool and submits the sum of the numbers above a threshold with this package's `answer` tool.
Tools run on the host with a ToolContext and act on the episode's sandbox session
(`ctx.session.read/write/exec`): anything model-written that must run goes through
`ctx.session.exec`, in the box. `score` is trusted
grader code on the host; `reference` gives the reference episode `honing env check` replays
(each turn raw text or a tool call {"name", "arguments"}).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from typing import Any, Iterator

from honing.envpkg import Environment
from honing.rollout.tools import Tool, ToolContext, ToolResult, parse_call

__version__ = "0.1.0"
PROMPT = ("numbers.txt in your workspace lists {k} numbers. Read it, then call answer with the sum of the "
          "numbers greater than {threshold}.")


def answer(ctx: ToolContext, value: int) -> ToolResult:
    return ToolResult(f"answered {value}", done=True, kind="submit")


ANSWER = Tool("answer", "Give your final answer (an integer) and end the task.",
              {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]}, answer)


def split_of(key: str) -> str:
    return "heldout" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 5 == 0 else "train"


def make_tasks(split: str, seed: int, min_numbers: int = 3, max_numbers: int = 6) -> Iterator[dict[str, Any]]:
    rng = random.Random(f"{{NAME}}/{seed}")
    for i in itertools.count():
        numbers = [rng.randint(10, 99) for _ in range(rng.randint(min_numbers, max_numbers))]
        threshold = rng.randint(10, 80)
        total = sum(x for x in numbers if x > threshold)
        text = "\\n".join(map(str, numbers)) + "\\n"
        question = PROMPT.format(k=len(numbers), threshold=threshold)
        if not total or str(total) in text + question or split_of(question) != split:
            continue  # the answer must not be readable; the question decides the split
        yield {"id": f"{{NAME}}/{split}/{seed}/{i}", "prompt": question, "hidden": {"answer": total},
               "environment": {"files": {"numbers.txt": text}, "tools": ["read_file", "answer"], "max_turns": 4}}


def score(answer: int, trajectory: Any, completion: str) -> float:
    """1 if the episode ended with a successful `answer` call giving the sum."""
    turns = trajectory.turns
    if not turns or turns[-1].tool != "answer" or not turns[-1].ok:
        return 0.0
    call = parse_call(turns[-1].action_text, [ANSWER])
    return float(not call.error and call.arguments.get("value") == answer)


def reference(task: Any) -> list[Any]:
    return [{"name": "read_file", "arguments": {"path": "numbers.txt"}},
            {"name": "answer", "arguments": {"value": task.hidden["answer"]}}]


ENV = Environment(
    name="{{NAME}}",
    version=__version__,
    description="Sum the numbers in a workspace file (multi-turn example from `honing env new`)",
    tasks=make_tasks,
    verifier=score,
    tools=[ANSWER],
    reference=reference,
)
'''

SINGLE_TEST = '''
"""The package's tests; `honing env check {{NAME}}` runs the same self-test."""

from honing.envcheck import check_environment

from {{PKG}} import ENV, score


def test_score() -> None:
    assert score("Sure: dcba", "dcba") == 1.0
    assert score("I don't know", "dcba") == 0.0


def test_environment_self_test_passes() -> None:
    report = check_environment(ENV, n=8)
    assert report.ok, report.table()
'''

MULTI_TEST = '''
"""The package's tests; `honing env check {{NAME}}` runs the same self-test (episodes in the sandbox)."""

import shutil

import pytest

from honing.envcheck import check_environment

from {{PKG}} import ENV


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_environment_self_test_passes() -> None:
    report = check_environment(ENV, n=4)
    assert report.ok, report.table()
'''

SINGLE_RECIPE = '''
# {{NAME}} with the tiny in-code model: a few GRPO steps (pip install -e this package first).
model:
  name: tiny-random
  bf16_autocast: false
tasks:
  sources:
    - name: env:{{NAME}}
  prompts_per_step: 4
  samples_per_prompt: 4
generation:
  max_new_tokens: 12
train:
  steps: 3
  learning_rate: 1.0e-3
  micro_batch_size: 16
eval:
  heldout_tasks: 8
checkpoint:
  every_steps: 0
'''

MULTI_RECIPE = '''
# {{NAME}} with the tiny in-code model: a few GRPO steps of sandboxed episodes (needs bwrap).
model:
  name: tiny-random
  bf16_autocast: false
tasks:
  sources:
    - name: env:{{NAME}}
  prompts_per_step: 2
  samples_per_prompt: 2
generation:
  max_new_tokens: 24
rollout:
  max_turns: 3
  context_tokens: 4096
train:
  steps: 2
  learning_rate: 1.0e-3
  micro_batch_size: 8
eval:
  heldout_tasks: 4
checkpoint:
  every_steps: 0
'''

README = '''
# {{NAME}}: a honing environment package

```bash
pip install -e .                     # registers env:{{NAME}} (entry point honing.environments)
honing env check {{NAME}}            # self-test: reference scores 1, junk 0, no hidden leaks
pytest                               # the package's own tests
honing train --config recipe.yaml    # a few steps with the tiny model
```

Edit `{{PKG}}/__init__.py`: the task generator, the reward function and the reference solver.
See honing's docs/environments.md for the package format.
'''
