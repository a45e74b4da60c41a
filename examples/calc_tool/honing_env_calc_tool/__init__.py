"""calc_tool: price an order with tools (a multi-turn honing environment package).

Each task's workspace holds `catalog.txt` (item: unit price). The model looks prices up with
the `lookup` tool, computes the total with the `calculator` tool and ends the episode with
`submit_answer`. The verifier checks the submitted total.

Where the code runs: `lookup` reads the workspace file through the episode's sandbox session
(`ctx.session.read`, which never follows links the box planted); `calculator` evaluates the
model-written expression *inside the box* (`ctx.session.exec`, under the session's limits), never
on the host; the verifier (`score`) is trusted grader code on the host and only reads the
trajectory.

Params: `min_items`, `max_items` (items in an order, default 2..3), `max_qty` (default 9),
`catalog_size` (items in the catalog, default 6). A task's split is a hash of its question (the
order), so no question is in both splits.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from typing import Any, Iterator

from honing.envpkg import Environment
from honing.rollout.env import ToolEnvironment
from honing.rollout.tools import Tool, ToolContext, ToolResult, parse_call
from honing.sandbox import Limits, SandboxError

__version__ = "0.1.0"

ITEMS = ("bolt", "bracket", "clamp", "gadget", "gear", "hinge", "lever", "nut", "pipe", "pulley",
         "rivet", "spring", "valve", "washer", "widget", "sprocket")
HELDOUT_PERCENT = 20
CATALOG = "catalog.txt"
INSTRUCTIONS = (
    "Tools: lookup(item) gives an item's unit price from catalog.txt; calculator(expression) evaluates "
    "arithmetic; submit_answer(value) ends the task with your answer. One call per reply, e.g.\n"
    '<tool_call>{"name": "lookup", "arguments": {"item": "gear"}}</tool_call>')
PROMPT = "Order: {order}. Look up the unit prices, compute the total cost with calculator, then submit_answer it."

# Runs in the sandbox (python3 -c CALC EXPR): numbers, + - * / // % ** and parentheses only.
CALC = r"""
import ast, operator, sys
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
       ast.USub: operator.neg, ast.UAdd: operator.pos}
def ev(n):
    if isinstance(n, ast.Constant) and type(n.value) in (int, float):
        return n.value
    if isinstance(n, ast.BinOp) and type(n.op) in OPS:
        a, b = ev(n.left), ev(n.right)
        if isinstance(n.op, ast.Pow) and abs(b) > 100:
            raise ValueError("exponent too large")
        return OPS[type(n.op)](a, b)
    if isinstance(n, ast.UnaryOp) and type(n.op) in OPS:
        return OPS[type(n.op)](ev(n.operand))
    raise ValueError("only numbers, + - * / // % ** and parentheses are allowed")
try:
    v = ev(ast.parse(sys.argv[1].strip(), mode="eval").body)
except Exception as e:
    print(f"error: {type(e).__name__}: {e}")
    sys.exit(1)
print(int(v) if isinstance(v, float) and v.is_integer() else v)
"""


# --- tools --------------------------------------------------------------------------------------
def lookup(ctx: ToolContext, item: str) -> ToolResult:
    try:
        text = ctx.session.read(CATALOG).decode("utf-8", "replace")
    except SandboxError as e:
        return ToolResult(f"error: lookup: {e}", ok=False)
    for line in text.splitlines():
        name, sep, price = line.partition(":")
        if sep and name.strip().lower() == item.strip().lower():
            return ToolResult(f"{name.strip()}: {price.strip()}")
    return ToolResult(f"error: lookup: no item {item!r} in {CATALOG}", ok=False)


def calculator(ctx: ToolContext, expression: str) -> ToolResult:
    if len(expression) > 200:
        return ToolResult("error: calculator: expression longer than 200 characters", ok=False)
    limits = ctx.limits.replace(timeout_s=min(5.0, ctx.limits.timeout_s), cpu_s=min(5.0, ctx.limits.cpu_s))
    res = ctx.session.exec(["python3", "-c", CALC, expression], limits=limits)
    if res.infra_error:
        return ToolResult(f"error: calculator: {res.infra_error}", ok=False, infra_error=res.infra_error)
    if res.timed_out or res.oom:
        return ToolResult("error: calculator: the expression took too long", ok=False)
    out = (res.stdout.strip() or res.stderr.strip())[:200]
    return ToolResult(out if res.ok else f"error: calculator: {out.removeprefix('error: ')}", ok=res.ok)


def submit_answer(ctx: ToolContext, value: float) -> ToolResult:
    return ToolResult(f"submitted {value}", done=True, kind="submit")


def _schema(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


LOOKUP = Tool("lookup", "An item's unit price from catalog.txt.", _schema({"item": {"type": "string"}}), lookup)
CALCULATOR = Tool("calculator", "Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses).",
                  _schema({"expression": {"type": "string"}}), calculator)
SUBMIT = Tool("submit_answer", "Submit your final answer (a number) and end the task.",
              _schema({"value": {"type": "number"}}), submit_answer)
TOOLS = (LOOKUP, CALCULATOR, SUBMIT)


def make_environment(task: Any) -> ToolEnvironment:
    """The episode's environment: the three tools, with short instructions (fits a small context)."""
    return ToolEnvironment(list(TOOLS), limits=Limits(timeout_s=10, cpu_s=10, memory_mb=256),
                           max_output_chars=400, instructions=INSTRUCTIONS)


# --- tasks --------------------------------------------------------------------------------------
def split_of(key: str) -> str:
    return "heldout" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT else "train"


def make_tasks(split: str, seed: int, min_items: int = 2, max_items: int = 3, max_qty: int = 9,
               catalog_size: int = 6) -> Iterator[dict[str, Any]]:
    """Task dicts of `split`, forever, deterministic for `seed`."""
    if not 1 <= min_items <= max_items <= catalog_size <= len(ITEMS):
        raise ValueError(f"need 1 <= min_items <= max_items <= catalog_size <= {len(ITEMS)}")
    if max_qty < 2:
        raise ValueError("max_qty must be at least 2")
    rng = random.Random(f"calc_tool/{seed}")
    for i in itertools.count():
        names = rng.sample(ITEMS, catalog_size)
        prices = {n: rng.randint(11, 99) for n in names}
        order = [(n, rng.randint(2, max_qty)) for n in rng.sample(names, rng.randint(min_items, max_items))]
        total = sum(prices[n] * q for n, q in order)
        catalog = "".join(f"{n}: {p}\n" for n, p in prices.items())
        question = PROMPT.format(order=", ".join(f"{q} {n}" for n, q in order))
        if str(total) in catalog or str(total) in question:
            continue  # the answer must not be readable anywhere
        if split_of(question) != split:
            continue  # the question decides the split: no question is in both
        yield {
            "id": f"calc_tool/{split}/{seed}/{i}",
            "prompt": question,
            "hidden": {"answer": total, "prices": prices},
            "metadata": {"order": order},
            "difficulty": round(len(order) / max(max_items, 1), 3),
            "environment": {"kind": "env:calc_tool", "files": {CATALOG: catalog}, "max_turns": 3 + 2 * len(order),
                            "tools": [t.name for t in TOOLS]},
        }


# --- grading and the reference episode ------------------------------------------------------------
def submitted_value(trajectory: Any) -> float | None:
    """The value of the episode's final, successful submit_answer call (None: there was none)."""
    turns = getattr(trajectory, "turns", ()) or ()
    if not turns or turns[-1].tool != "submit_answer" or not turns[-1].ok:
        return None
    call = parse_call(turns[-1].action_text, [SUBMIT])
    value = call.arguments.get("value") if not call.error else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def score(completion: str, answer: float, trajectory: Any) -> float:
    """1 if the submitted total equals the order's total, else 0."""
    got = submitted_value(trajectory)
    return float(got is not None and abs(got - float(answer)) < 1e-6)


def reference_episode(task: Any) -> list[Any]:
    """Look every item up, compute the total with the calculator, submit it."""
    order = task.metadata["order"]
    turns: list[Any] = [{"name": "lookup", "arguments": {"item": n}} for n, _ in order]
    prices = task.hidden["prices"]
    turns.append({"name": "calculator", "arguments": {"expression": " + ".join(f"{q}*{prices[n]}" for n, q in order)}})
    turns.append({"name": "submit_answer", "arguments": {"value": task.hidden["answer"]}})
    return turns


ENV = Environment(
    name="calc_tool",
    version=__version__,
    description="Price an order: look prices up in a workspace file, compute with a sandboxed calculator, submit",
    tasks=make_tasks,
    verifier=score,
    tools=TOOLS,
    environment=make_environment,
    reference=reference_episode,
    params={"min_items": 2, "max_items": 3},
    eval_suite="suite.yaml",
)
