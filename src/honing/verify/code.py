"""The `code` verifier: runs a model-written function against hidden tests in the sandbox.

Trust layout (who can touch what):

* The host (this module) holds the hidden material. For `code:functions` tasks the expected
  values never leave the host: the box only gets the arguments, and comparison happens here,
  type-strictly, on decoded plain data.
* In the box, a trusted *runner* process (`python3 -I -S -c BOOT`, its source and the secrets
  arriving on stdin, which it drains and closes) makes itself non-dumpable (so no other box
  process can read its memory or reopen its fds through /proc), then spawns the *candidate*
  process: a fresh interpreter (no copy of the runner's memory) that imports the candidate
  file and answers call requests over pipes. Each return value is encoded with exact-type
  tags (int/float/str/bool/None/list/tuple/dict/set/bytes only); the runner decodes it into
  genuine builtin values. Candidate code never runs in the runner, so an object whose __eq__
  is always True, patched builtins/json, SkipTest, sys.exit or os._exit only affect the
  candidate process: the call fails.
* Per-call timeouts are enforced by the runner with SIGKILL (a try/except around an infinite
  loop cannot swallow it); a killed candidate is restarted for the next call, a bounded
  number of times. Before reporting, the runner SIGKILLs every other process in the box.
* The runner writes one result line, prefixed by a random nonce that only it and the host
  know, on stdout; the candidate's stdout/stderr go to /dev/null. The host requires exactly
  one such line with exactly the expected number of cases: anything else scores 0.
* HumanEval: the dataset's `check(candidate)` is trusted code. Each non-trivial `assert` in it
  becomes one case; the runner evaluates them itself (with `candidate` a proxy into the
  candidate process), so only plain data ever reaches the comparison.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import re
import secrets
import threading
import time
from typing import Any, Sequence

from honing.rollout.types import Trajectory
from honing.sandbox import Limits, Sandbox, SandboxError
from honing.verify.registry import register_verifier
from honing.verify.types import Verdict, VerifyContext

RESULT_TAG = "HONING-CODE-RESULT"

# --- extraction --------------------------------------------------------------------------------
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_program(text: str) -> tuple[str, bool]:
    """The last ```python (or ```py) block; else the last unlabelled block; else the whole text.
    The flag says whether a python fence was found (the format layer)."""
    blocks = _FENCE.findall(text)
    py = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if py:
        return py[-1], True
    plain = [body for lang, body in blocks if not lang]
    if plain:
        return plain[-1], False
    return text, False


# --- value encoding: these two functions also run inside the box (see CODEC_SRC) -----------
def encode_value(x: Any, depth: int = 0) -> Any:
    if depth > 200:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None:
        return ["N"]
    if t is bool:
        return ["b", x]
    if t is int:
        return ["i", hex(x)]
    if t is float:
        return ["f", x.hex()]
    if t is str:
        return ["s", x]
    if t is bytes:
        return ["B", x.hex()]
    if t in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[t]
        return [tag, [encode_value(v, depth + 1) for v in x]]
    if t is dict:
        return ["d", [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in x.items()]]
    raise TypeError(f"unsupported type {t.__name__}")


def decode_value(e: Any, depth: int = 0) -> Any:
    if depth > 200 or type(e) is not list or not e or type(e[0]) is not str:
        raise ValueError("bad encoding")
    tag = e[0]
    if tag == "N" and len(e) == 1:
        return None
    if len(e) != 2:
        raise ValueError("bad encoding")
    v = e[1]
    if tag == "b" and type(v) is bool:
        return v
    if tag == "i" and type(v) is str:
        return int(v, 16)
    if tag == "f" and type(v) is str:
        return float.fromhex(v)
    if tag == "s" and type(v) is str:
        return v
    if tag == "B" and type(v) is str:
        return bytes.fromhex(v)
    if tag in ("l", "t", "S", "F") and type(v) is list:
        items = [decode_value(i, depth + 1) for i in v]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d" and type(v) is list:
        out = {}
        for pair in v:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("bad encoding")
            out[decode_value(pair[0], depth + 1)] = decode_value(pair[1], depth + 1)
        return out
    raise ValueError("bad encoding")


# The box gets the very same source (with `Any` defined), so host and box cannot drift apart.
CODEC_SRC = ("Any = object\n" + inspect.getsource(encode_value) + "\n" + inspect.getsource(decode_value)
             + "\nenc, dec = encode_value, decode_value\n")


def same_value(got: Any, want: Any, rel_tol: float = 1e-9, abs_tol: float = 1e-9) -> bool:
    """Type-strict equality of plain data (an int is accepted where a float is expected;
    bool and int are never interchangeable)."""
    tw, tg = type(want), type(got)
    if tw is float:
        if tg not in (float, int):
            return False
        if math.isnan(want):
            return tg is float and math.isnan(got)
        return math.isclose(float(got), want, rel_tol=rel_tol, abs_tol=abs_tol)
    if tg is not tw:
        return False
    if tw in (list, tuple):
        return len(got) == len(want) and all(same_value(g, w, rel_tol, abs_tol) for g, w in zip(got, want))
    if tw is dict:
        return got.keys() == want.keys() and all(same_value(got[k], want[k], rel_tol, abs_tol) for k in want)
    return bool(got == want)


# --- the in-box programs --------------------------------------------------------------------------
# The bootstrap is the only thing on the runner's command line (not secret).
BOOT = ("import sys,json;d=json.loads(sys.stdin.buffer.read().decode());sys.stdin.close();"
        "exec(compile(d['runner'],'<runner>','exec'),{'__name__':'__runner__','SPEC':d})")

CHILD_SRC = r'''
import os, sys, json, resource
rfd, wfd = os.dup(0), os.dup(1)
nul = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(nul, fd)
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
rin, wout = os.fdopen(rfd, "rb"), os.fdopen(wfd, "wb")
#CODEC#
def send(obj):
    wout.write(json.dumps(obj).encode() + b"\n")
    wout.flush()
cfg = json.loads(rin.readline())
sys.setrecursionlimit(3000)
try:
    src = open(cfg["path"], encoding="utf-8").read()
    ns = {"__name__": "__candidate__", "__builtins__": __builtins__}
    exec(compile(src, "candidate.py", "exec"), ns)
    fn = ns[cfg["function"]]
    if not callable(fn):
        raise TypeError("not callable")
except BaseException as e:
    send({"ready": False, "error": type(e).__name__ + ": " + str(e)[:300]})
    os._exit(0)
send({"ready": True})
while True:
    line = rin.readline()
    if not line:
        os._exit(0)
    req = json.loads(line)
    try:
        out = {"id": req["id"], "ok": True, "value": enc(fn(*dec(req["args"])))}
    except BaseException as e:
        out = {"id": req["id"], "ok": False, "error": type(e).__name__ + ": " + str(e)[:200]}
    send(out)
'''

CHILD_SRC = CHILD_SRC.replace("#CODEC#\n", CODEC_SRC)

# Run by a grader's runner as the box's last act: kill every other process of the box, reap them,
# and say whether the box is clean (used by the code and repair runners).
KILL_OTHERS_SRC = r'''
def kill_others():
    me = os.getpid()
    for _ in range(20):
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        alive = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (1, me):
                try:
                    with open("/proc/%s/stat" % name) as f:
                        if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                            alive.append(name)
                except OSError:
                    pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if not alive:
            return True
        time.sleep(0.01)
    return False
'''

RUNNER_SRC = r'''
import ctypes, json, os, select, signal, subprocess, sys, time, ast, math, copy
NONCE = SPEC["nonce"]
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0: no /proc/<runner>/{mem,environ,fd} for the candidate
    _dumpable = _libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
except Exception:
    _dumpable = -1
if _dumpable != 0:  # fail closed: an infrastructure problem, never a grade
    os.write(1, (NONCE + " " + json.dumps({"infra": "runner cannot make itself non-dumpable"}) + "\n").encode())
    os._exit(0)
del SPEC["nonce"]
CALL_T = float(SPEC["call_timeout"])
DEADLINE = time.monotonic() + float(SPEC["budget"])
MAX_SPAWNS = int(SPEC["max_spawns"])
MAX_LINE = int(SPEC["max_bytes"])
NOTES = []

class CandidateFailed(Exception):
    pass

#CODEC#

class Child:
    def __init__(self):
        self.proc = None
        self.spawns = 0
        self.dead = False  # import failed (deterministic) or too many restarts
        self.next_id = 0
        self.buf = b""

    def _readline(self, until):
        while b"\n" not in self.buf:
            left = until - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.proc.stdout], [], [], left)
            if not r:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
            if len(self.buf) > MAX_LINE:
                return None
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def kill(self):
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.kill()
            except OSError:
                pass
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
            self.proc = None
            self.buf = b""

    def start(self):
        if self.spawns >= MAX_SPAWNS:
            self.dead = True
            NOTES.append("too many candidate restarts")
            return False
        self.spawns += 1
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", SPEC["child"]], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
                                         start_new_session=True, cwd="/work")
        except OSError as e:  # e.g. the candidate's leftovers hold every pid
            NOTES.append("cannot start the candidate: %s" % e)
            self.dead = True
            return False
        try:
            self.proc.stdin.write(json.dumps({"path": "/work/candidate.py", "function": SPEC["function"]}).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            pass
        line = self._readline(min(time.monotonic() + SPEC["import_timeout"], DEADLINE))
        try:
            msg = json.loads(line) if line is not None else None
        except ValueError:
            msg = None
        if not (type(msg) is dict and msg.get("ready") is True):
            NOTES.append("candidate did not load: " + (str(msg.get("error"))[:300] if type(msg) is dict else "no reply"))
            self.kill()
            self.dead = True
            return False
        return True

    def call(self, args):
        if self.dead or time.monotonic() >= DEADLINE:
            raise CandidateFailed("not run")
        if self.proc is None and not self.start():
            raise CandidateFailed("candidate unavailable")
        cid = self.next_id
        self.next_id += 1
        try:
            self.proc.stdin.write(json.dumps({"id": cid, "args": enc(list(args))}).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            self.kill()
            raise CandidateFailed("candidate died")
        line = self._readline(min(time.monotonic() + CALL_T, DEADLINE))
        if line is None:
            NOTES.append("call %d: timeout or candidate died" % cid)
            self.kill()
            raise CandidateFailed("timeout")
        try:
            msg = json.loads(line)
            if type(msg) is not dict or msg.get("id") != cid or msg.get("ok") is not True:
                raise ValueError(str(msg.get("error") if type(msg) is dict else "bad reply")[:200])
            return dec(msg["value"])
        except (ValueError, KeyError, TypeError, RecursionError, OverflowError, AttributeError) as e:
            if len(NOTES) < 20:
                NOTES.append("call %d: %s" % (cid, str(e)[:200]))
            raise CandidateFailed("bad reply")

CHILD = Child()

def candidate(*args):
    return CHILD.call(args)

#KILL_OTHERS#

result = {}
if SPEC["mode"] == "calls":
    out = []
    for args in SPEC["cases"]:
        try:
            out.append(enc(candidate(*dec(args))))
        except CandidateFailed:
            out.append(None)
        except Exception as e:
            NOTES.append("encode: %s" % e)
            out.append(None)
    result["values"] = out
else:
    n = SPEC["n_cases"]
    seen = [False] * n
    failed = [False] * n
    def __hc_record__(i, ok):
        seen[i] = True
        if not ok:
            failed[i] = True
    ns = {"__name__": "__hc_test__", "__hc_record__": __hc_record__}
    try:
        exec(compile(SPEC["prompt"], "<prompt>", "exec"), ns)
        ns[SPEC["function"]] = candidate  # tests that name the function itself (HumanEval/33) get the candidate
        exec(compile(SPEC["test"], "<test>", "exec"), ns)
        ns["check"](candidate)
    except CandidateFailed:
        pass
    except BaseException as e:
        NOTES.append("check aborted: %s: %s" % (type(e).__name__, str(e)[:200]))
    result["cases"] = [seen[i] and not failed[i] for i in range(n)]
CHILD.kill()
result["clean"] = kill_others()
result["notes"] = NOTES[:20]
os.write(1, (NONCE + " " + json.dumps(result) + "\n").encode())
'''
RUNNER_SRC = RUNNER_SRC.replace("#CODEC#\n", CODEC_SRC).replace("#KILL_OTHERS#\n", KILL_OTHERS_SRC)


# --- HumanEval test transformation ---------------------------------------------------------------
class _AssertRewriter(ast.NodeTransformer):
    """`assert T, msg` -> record(i, T) guarded by try/except; constant asserts are dropped."""

    def __init__(self) -> None:
        self.n = 0

    def visit_Assert(self, node: ast.Assert) -> Any:
        if isinstance(node.test, ast.Constant):
            return ast.Pass()
        i = self.n
        self.n += 1
        ok = ast.Name("__hc_ok__", ast.Store())
        new = ast.Try(
            body=[ast.Assign([ok], ast.Call(ast.Name("bool", ast.Load()), [node.test], []))],
            handlers=[ast.ExceptHandler(ast.Name("Exception", ast.Load()), None,
                                        [ast.Assign([ast.Name("__hc_ok__", ast.Store())], ast.Constant(False))])],
            orelse=[], finalbody=[])
        rec = ast.Expr(ast.Call(ast.Name("__hc_record__", ast.Load()),
                                [ast.Constant(i), ast.Name("__hc_ok__", ast.Load())], []))
        return [new, rec]


def split_asserts(test_src: str) -> tuple[str, int]:
    """The test source with each non-trivial assert turned into a recorded case, and the count."""
    tree = ast.parse(test_src)
    rw = _AssertRewriter()
    tree = rw.visit(tree)
    ast.fix_missing_locations(tree)
    return ast.unparse(tree), rw.n


def humaneval_program(prompt: str, code: str, entry_point: str) -> str:
    """What the candidate file holds: the prompt (its imports and helpers) plus the code, which
    is either a whole function definition (it then replaces the prompt's stub) or a body."""
    try:
        tree = ast.parse(code)
        defines = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry_point
                      for n in tree.body)
    except SyntaxError:
        defines = False
    if defines:
        return prompt + "    pass\n\n\n" + code
    return prompt + code


# --- the verifier ---------------------------------------------------------------------------------
_sandbox: Sandbox | None = None
_sandbox_lock = threading.Lock()


def _default_sandbox() -> Sandbox:
    global _sandbox
    with _sandbox_lock:
        if _sandbox is None:
            _sandbox = Sandbox("bwrap")
        return _sandbox


class CodeVerifier:
    """Params (task.verifier.params): call_timeout_s (5), budget_s (30), max_spawns (8),
    memory_mb (512), rel_tol (1e-9). ctx.extra['sandbox'] may supply a Sandbox."""

    needs_sandbox = True

    def verify(self, task: Any, trajectory: Trajectory, ctx: VerifyContext) -> Verdict:
        t0 = time.perf_counter()
        hidden = task.hidden
        params = dict(task.verifier.params or {})
        code, format_ok = extract_program(trajectory.completion_text)
        nonce = secrets.token_hex(16)
        call_t = float(params.get("call_timeout_s", 5.0))
        budget = float(params.get("budget_s", 30.0))
        spec: dict[str, Any] = {"nonce": nonce, "runner": RUNNER_SRC, "child": CHILD_SRC, "call_timeout": call_t,
                                "budget": budget, "import_timeout": min(budget, 10.0),
                                "max_spawns": int(params.get("max_spawns", 8)), "max_bytes": 16 << 20}
        if "test" in hidden:  # HumanEval style: assert-based check(candidate)
            test_src, n = split_asserts(hidden["test"])
            spec.update(mode="asserts", prompt=hidden["prompt"], test=test_src, n_cases=n,
                        function=hidden["entry_point"])
            program = humaneval_program(hidden["prompt"], code, hidden["entry_point"])
        else:  # (args, expected) cases, compared here
            cases = list(hidden["cases"])
            n = len(cases)
            spec.update(mode="calls", function=hidden["function"],
                        cases=[encode_value(list(args)) for args, _ in cases])
            program = code
        if n == 0:
            return Verdict.infra("task has no test cases", time.perf_counter() - t0)
        sandbox = ctx.extra.get("sandbox") if ctx.extra else None
        limits = Limits(timeout_s=budget + 8, cpu_s=budget + 10, memory_mb=int(params.get("memory_mb", 512)),
                        pids=64, output_bytes=1 << 22)
        try:
            res = (sandbox or _default_sandbox()).exec(
                ["python3", "-I", "-S", "-c", BOOT], files={"candidate.py": program}, profile="python",
                limits=limits, stdin=json.dumps(spec).encode())
        except SandboxError as e:
            return Verdict.infra(f"sandbox: {e}", time.perf_counter() - t0)
        if res.infra_error:
            return Verdict.infra(f"sandbox: {res.infra_error}", time.perf_counter() - t0)
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith(nonce + " ")]
        report: dict[str, Any] | None = None
        if len(lines) == 1:
            try:
                report = json.loads(lines[0][len(nonce) + 1:])
            except ValueError:
                report = None
        ok: list[bool] = [False] * n
        why = ""
        if isinstance(report, dict) and report.get("infra"):
            return Verdict.infra(f"code runner: {report['infra']}", time.perf_counter() - t0)
        if not isinstance(report, dict):
            why = (f"no runner result (exit={res.exit_code}, timed_out={res.timed_out}, oom={res.oom}): "
                   f"{res.stderr[-300:]}")
        elif spec["mode"] == "asserts":
            got = report.get("cases")
            if isinstance(got, list) and len(got) == n:
                ok = [c is True for c in got]
            else:
                why = "malformed runner result"
        else:
            vals = report.get("values")
            if isinstance(vals, list) and len(vals) == n:
                tol = float(params.get("rel_tol", 1e-9))
                for i, ((_, want), enc) in enumerate(zip(cases, vals)):
                    if enc is None:
                        continue
                    try:
                        ok[i] = same_value(decode_value(enc), want, tol, tol)
                    except (ValueError, TypeError, RecursionError, OverflowError):
                        ok[i] = False
            else:
                why = "malformed runner result"
        if isinstance(report, dict):
            why = why or "; ".join(str(x) for x in report.get("notes", []))[:1000]
        correct = sum(ok) / n
        w = ctx.format_weight
        fmt = 1.0 if format_ok else 0.0
        return Verdict(score=(1.0 - w) * correct + w * fmt, passed=all(ok),
                       components={"correct": correct, "format": fmt},
                       details=f"{sum(ok)}/{n} cases passed" + (f"; {why}" if why else ""),
                       cost_s=time.perf_counter() - t0)


def run_cases(code: str, function: str, cases: Sequence[tuple[Any, Any]]) -> Verdict:
    """Convenience for tests and tools: grade `code` on (args, expected) cases."""
    from honing.tasks.types import Task, VerifierSpec

    task = Task(id="adhoc", domain="code", prompt=(), verifier=VerifierSpec("code"),
                hidden={"function": function, "cases": list(cases)})
    return CodeVerifier().verify(task, Trajectory.from_text("adhoc", "code", code), VerifyContext())


register_verifier("code", CodeVerifier())
