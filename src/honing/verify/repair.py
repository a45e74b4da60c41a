"""The `repair` verifier: runs a task's HIDDEN tests on the candidate's final source files.

Two sets of test files, both from the task (grader-side), never from the workspace:
`hidden["tests"]` (the target: for generated tasks, cases the given buggy repo fails) and the
optional `hidden["regression_tests"]` (for generated tasks, the grader's copy of the original
visible tests and hidden coverage cases of every public function). Score = target pass rate x
regression pass rate (1 when there are none): an unfixed repo still scores 0, and a patch that
fixes the bug but breaks another function scores < 1; `passed` needs every test of both.

What reaches the grading box: only the candidate's *source* files (the task's
`environment["source_files"]` paths or globs, minus anything under a tests directory and any
conftest.py / sitecustomize.py / usercustomize.py / *.pth), taken from the trajectory's final
workspace (`Trajectory.files`), plus the task's test files. The episode's session is not reused:
the agent's test edits, caches, planted files and leftover processes cannot reach the grader.

Who owns what (the ideas of honing.verify.code): a grader-owned runner (`python3 -I -S`, its
source and a nonce arriving on stdin) makes itself non-dumpable, runs each hidden test file in
a child interpreter (`-I -S`: no site, no user site, no PYTHON* env) that reports per-test
results over a private pipe, kills every other process in the box, and prints one result line
prefixed by the nonce. The host counts only the test ids it found itself in the hidden files
(AST), so tests that vanish, are skipped or never ran count as failed; a canary test that must
fail runs after the suite in the same child, so a candidate that patches unittest at import to
make everything pass scores 0. Not covered: source code that tampers with the child's
interpreter in subtler, targeted ways (it runs in the same process as the tests it imports).
Sandbox failures are `Verdict.infra`.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import secrets
import time
from typing import Any

from honing.rollout.types import Trajectory
from honing.sandbox import Limits, SandboxError
from honing.verify.code import BOOT, KILL_OTHERS_SRC, _default_sandbox
from honing.verify.registry import register_verifier
from honing.verify.types import Verdict, VerifyContext

FORBIDDEN_NAMES = ("conftest.py", "sitecustomize.py", "usercustomize.py")

CHILD_SRC = r'''
import os, sys, json, unittest, importlib.util
wfd = os.dup(1)
nul = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(nul, fd)
out = os.fdopen(wfd, "w")
path = sys.argv[1]
sys.path.insert(0, "/work")
os.chdir("/work")
RESULTS = {}

class Rec(unittest.TestResult):
    def addSuccess(self, test):
        RESULTS.setdefault(test.id(), True)
    def addFailure(self, test, err):
        RESULTS[test.id()] = False
    def addError(self, test, err):
        RESULTS[getattr(test, "id", lambda: str(test))()] = False
    def addSkip(self, test, reason):
        RESULTS[test.id()] = False
    def addExpectedFailure(self, test, err):
        RESULTS[test.id()] = False
    def addUnexpectedSuccess(self, test):
        RESULTS[test.id()] = False
    def addSubTest(self, test, subtest, err):
        if err is not None:
            RESULTS[test.id()] = False

class Canary(unittest.TestCase):
    def test_must_fail(self):
        self.assertEqual(1, 2)

err = ""
try:
    spec = importlib.util.spec_from_file_location("hidden_" + os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
    suite.run(Rec())
except BaseException as e:
    err = type(e).__name__ + ": " + str(e)[:300]
canary = {}
RES2 = RESULTS
RESULTS = canary
try:
    unittest.defaultTestLoader.loadTestsFromTestCase(Canary).run(Rec())
except BaseException:
    canary = {"x": False}
RESULTS = RES2
tampered = any(v is not False for v in canary.values()) or not canary
short = {k.split(".", 1)[1] if k.startswith("hidden_") else k: v for k, v in RESULTS.items()}
out.write(json.dumps({"results": short, "error": err, "tampered": tampered}) + "\n")
out.flush()
os._exit(0)
'''

RUNNER_SRC = r'''
import ctypes, json, os, signal, subprocess, sys, time
NONCE = SPEC["nonce"]
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    _dumpable = _libc.prctl(3, 0, 0, 0, 0)
except Exception:
    _dumpable = -1
if _dumpable != 0:
    os.write(1, (NONCE + " " + json.dumps({"infra": "runner cannot make itself non-dumpable"}) + "\n").encode())
    os._exit(0)
del SPEC["nonce"]
DEADLINE = time.monotonic() + float(SPEC["budget"])
report = {"files": {}}
for path in SPEC["tests"]:
    left = DEADLINE - time.monotonic()
    if left <= 0:
        report["files"][path] = {"error": "time budget exhausted"}
        continue
    p = subprocess.Popen([sys.executable, "-I", "-S", "-c", SPEC["child"], "/work/" + path],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         close_fds=True, start_new_session=True, cwd="/work")
    try:
        data, _ = p.communicate(timeout=min(left, float(SPEC["file_timeout"])))
    except subprocess.TimeoutExpired:
        data = b""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    p.kill()
    p.wait()
    line = data.split(b"\n", 1)[0] if data else b""
    try:
        got = json.loads(line)
        if type(got) is not dict:
            raise ValueError
    except ValueError:
        got = {"error": "no result (timeout or the test process died)"}
    report["files"][path] = got

#KILL_OTHERS#

report["clean"] = kill_others()
os.write(1, (NONCE + " " + json.dumps(report) + "\n").encode())
'''
RUNNER_SRC = RUNNER_SRC.replace("#KILL_OTHERS#\n", KILL_OTHERS_SRC)


def expected_test_ids(source: str) -> list[str]:
    """`Class.test_method` for each test method of each top-level class (found without running it)."""
    ids = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            ids += [f"{node.name}.{f.name}" for f in node.body
                    if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test")]
    return ids


def is_source_file(path: str, patterns: list[str], hidden: set[str]) -> bool:
    parts = path.split("/")
    name = parts[-1]
    if path in hidden or name in FORBIDDEN_NAMES or name.endswith(".pth") or "__pycache__" in parts:
        return False
    if any(p in ("tests", "test") for p in parts[:-1]) or name.startswith("test_") or name.endswith("_test.py"):
        return False
    return any(path == p or fnmatch.fnmatch(path, p) or (p.startswith("**/") and fnmatch.fnmatch(path, p[3:]))
               for p in patterns)


class RepairVerifier:
    """Params (task.verifier.params): timeout_s (whole run, 60), file_timeout_s (per hidden test
    file, 30), memory_mb (512). ctx.extra['sandbox'] may supply a Sandbox."""

    needs_sandbox = True

    def verify(self, task: Any, trajectory: Trajectory, ctx: VerifyContext) -> Verdict:
        t0 = time.perf_counter()
        if trajectory.stop_reason == "infra_error":
            return Verdict.infra("the episode hit a sandbox infrastructure error", time.perf_counter() - t0)
        params = dict(task.verifier.params or {})
        tests: dict[str, str] = dict(task.hidden.get("tests") or {})
        regression = {p: c for p, c in dict(task.hidden.get("regression_tests") or {}).items() if p not in tests}
        expected = {p: expected_test_ids(src) for p, src in (tests | regression).items() if p.endswith(".py")}
        n = sum(len(v) for p, v in expected.items() if p in tests)
        n_reg = sum(len(v) for p, v in expected.items() if p in regression)
        if n == 0:
            return Verdict.infra("task has no hidden tests", time.perf_counter() - t0)
        env = task.environment or {}
        patterns = list(env.get("source_files") or ["**/*.py"])
        files = {p: c for p, c in trajectory.files.items() if is_source_file(p, patterns, set(tests) | set(regression))}
        files.update(tests)
        files.update(regression)  # the task's own copies: the workspace's (edited, deleted) tests never arrive
        nonce = secrets.token_hex(16)
        budget = float(params.get("timeout_s", 60.0))
        spec = {"nonce": nonce, "runner": RUNNER_SRC, "child": CHILD_SRC, "budget": budget,
                "file_timeout": float(params.get("file_timeout_s", 30.0)),
                "tests": sorted(p for p in expected if expected[p])}
        limits = Limits(timeout_s=budget + 8, cpu_s=budget + 10, memory_mb=int(params.get("memory_mb", 512)),
                        pids=64, output_bytes=1 << 22)
        sandbox = ctx.extra.get("sandbox") if ctx.extra else None
        try:
            res = (sandbox or _default_sandbox()).exec(["python3", "-I", "-S", "-c", BOOT], files=files,
                                                       profile="python", limits=limits,
                                                       stdin=json.dumps(spec).encode())
        except SandboxError as e:
            return Verdict.infra(f"sandbox: {e}", time.perf_counter() - t0)
        if res.infra_error:
            return Verdict.infra(f"sandbox: {res.infra_error}", time.perf_counter() - t0)
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith(nonce + " ")]
        report: Any = None
        if len(lines) == 1:
            try:
                report = json.loads(lines[0][len(nonce) + 1:])
            except ValueError:
                report = None
        if isinstance(report, dict) and report.get("infra"):
            return Verdict.infra(f"repair runner: {report['infra']}", time.perf_counter() - t0)
        counts, notes = {p: 0 for p in expected}, []
        if not isinstance(report, dict) or not isinstance(report.get("files"), dict):
            notes.append(f"no runner result (exit={res.exit_code}, timed_out={res.timed_out}): {res.stderr[-300:]}")
        else:
            for path, ids in expected.items():
                got = report["files"].get(path)
                if not isinstance(got, dict):
                    notes.append(f"{path}: not run")
                    continue
                if got.get("error"):
                    notes.append(f"{path}: {str(got['error'])[:300]}")
                if got.get("tampered"):
                    notes.append(f"{path}: the test framework was tampered with; no test counts")
                    continue
                results = got.get("results") if isinstance(got.get("results"), dict) else {}
                counts[path] = sum(1 for i in ids if results.get(i) is True)
        passed = sum(c for p, c in counts.items() if p in tests)
        passed_reg = sum(c for p, c in counts.items() if p in regression)
        rate, rate_reg = passed / n, (passed_reg / n_reg if n_reg else 1.0)
        details = f"{passed}/{n} hidden tests passed"
        components = {"hidden_tests": rate}
        if n_reg:
            details += f", {passed_reg}/{n_reg} regression tests passed"
            components["regression_tests"] = rate_reg
        return Verdict(score=rate * rate_reg, passed=passed == n and passed_reg == n_reg, components=components,
                       details=details + (f"; {'; '.join(notes)}"[:1200] if notes else ""),
                       cost_s=time.perf_counter() - t0)


register_verifier("repair", RepairVerifier())
