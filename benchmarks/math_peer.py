"""honing's `math` verifier against math-verify's own published test cases.

    .venv/bin/python benchmarks/math_peer.py CHECKOUT [--show-agreeing] [--json OUT.json]

CHECKOUT is a checkout of huggingface/Math-Verify. Its `tests/test_*.py` are read at run time
(never copied here): every `pytest.mark.parametrize` case with a `gold` and a `pred` and a 0/1
expectation (`expected` or `result`). Cases whose expectation depends on a comparison flag that
is not math-verify's default (`strict=False`, `allow_set_relation_comp=True`, a `precision`
other than 6) are counted apart, since honing grades with the defaults.

Every case goes through the real command, `honing verify --verifier math --batch` (one
process for all cases), with the reference as `--reference` and the prediction as the
completion. Side by side, plain math-verify (`parse` + `verify` with its default extraction)
grades the same pairs in this process. Prints both agreements and every case where honing
disagrees with the expectation, then `AGREEMENT honing=<n>/<N> math_verify=<m>/<N>`.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_FLAGS = {"strict": True, "allow_set_relation_comp": False, "precision": 6}


def collect_cases(checkout: Path) -> list[dict]:
    """(file, test, gold, pred, expected, flags) for every boolean-expectation case."""
    tests = sorted((checkout / "tests").glob("test_*.py"))
    if not tests:
        raise SystemExit(f"math_peer: {checkout}/tests has no test_*.py (is it a Math-Verify checkout?)")
    cases = []
    for f in tests:
        tree = ast.parse(f.read_text(), str(f))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for deco in fn.decorator_list:
                if not (isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize"):
                    continue
                if not isinstance(deco.args[0], ast.Constant) or not isinstance(deco.args[1], (ast.List, ast.Tuple)):
                    continue
                names = [n.strip() for n in str(deco.args[0].value).split(",")]
                exp_key = next((k for k in ("expected", "result") if k in names), None)
                if "gold" not in names or "pred" not in names or exp_key is None:
                    continue
                for el in deco.args[1].elts:
                    try:
                        row = dict(zip(names, ast.literal_eval(el)))
                    except (ValueError, SyntaxError, TypeError):
                        continue  # built at run time (f-strings, calls): not a literal case
                    exp = row[exp_key]
                    if not (isinstance(exp, (bool, int)) and exp in (0, 1)):
                        continue
                    flags = {k: row[k] for k in DEFAULT_FLAGS if k in row}
                    cases.append({"file": f.name, "test": fn.name, "line": el.lineno, "gold": str(row["gold"]),
                                  "pred": str(row["pred"]), "expected": bool(exp),
                                  "default_flags": all(DEFAULT_FLAGS[k] == v for k, v in flags.items()),
                                  "flags": flags})
    return cases


def honing_verdicts(cases: list[dict]) -> list[dict]:
    honing = Path(sys.executable).parent / "honing"
    with tempfile.TemporaryDirectory() as d:
        batch = Path(d) / "cases.jsonl"
        batch.write_text("".join(json.dumps({"reference": c["gold"], "completion": c["pred"]}) + "\n" for c in cases))
        p = subprocess.run([str(honing), "verify", "--verifier", "math", "--batch", str(batch)],
                           capture_output=True, text=True, timeout=1800)
    out = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if len(out) != len(cases):
        raise SystemExit(f"math_peer: honing verify returned {len(out)} verdicts for {len(cases)} cases "
                         f"(exit {p.returncode}): {p.stderr[-2000:]}")
    return out


def math_verify_verdict(gold: str, pred: str) -> bool:
    from math_verify import parse, verify

    try:
        return bool(verify(parse(gold), parse(pred)))
    except Exception:  # noqa: BLE001 - a crash is a disagreement for the peer too
        return False


def _short(s: str, n: int = 110) -> str:
    return s if len(s) <= n else s[: n // 2 - 2] + " ... " + s[-(n // 2 - 3):]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path, help="a checkout of huggingface/Math-Verify")
    ap.add_argument("--json", type=Path, help="write every case with both verdicts here")
    args = ap.parse_args()
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    cases = collect_cases(args.checkout)
    verdicts = honing_verdicts(cases)
    for c, v in zip(cases, verdicts):
        c["honing"] = bool(v["passed"]) if not v["infra_error"] else None
        c["honing_details"] = v["details"]
        c["math_verify"] = math_verify_verdict(c["gold"], c["pred"])

    def table(subset: list[dict], title: str) -> tuple[int, int]:
        h = sum(c["honing"] == c["expected"] for c in subset)
        m = sum(c["math_verify"] == c["expected"] for c in subset)
        print(f"{title:<44} {len(subset):>5} {h:>8} {m:>12}")
        return h, m

    main_set = [c for c in cases if c["default_flags"]]
    other = [c for c in cases if not c["default_flags"]]
    print(f"{'cases':<44} {'N':>5} {'honing':>8} {'math-verify':>12}")
    by_test: dict[str, list[dict]] = {}
    for c in main_set:
        by_test.setdefault(f"{c['file']}::{c['test']}", []).append(c)
    for name, sub in by_test.items():
        table(sub, "  " + name)
    h, m = table(main_set, "all, default comparison flags")
    if other:
        table(other, "non-default flags (strict/precision/set-rel)")
    print("\nhoning disagrees with the expectation (default flags):")
    for c in main_set:
        if c["honing"] != c["expected"]:
            print(f"- {c['file']}:{c['line']} expected={int(c['expected'])} honing={c['honing']} "
                  f"math-verify={int(c['math_verify'])}\n    gold={_short(c['gold'])!r}\n    pred={_short(c['pred'])!r}\n"
                  f"    {c['honing_details'][:160]}")
    if args.json:
        args.json.write_text(json.dumps(cases, indent=1))
    print(f"\nAGREEMENT honing={h}/{len(main_set)} math_verify={m}/{len(main_set)}")


if __name__ == "__main__":
    main()
