"""Environment packages end to end, through the real CLI: the two examples install (pip -e,
offline), `honing env list` shows them, `honing env check` passes for both, each trains with
`honing train` and evaluates with `honing eval`; `honing env new` scaffolds a package whose own
test and self-test pass; bad names fail with one clear line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import DISTS, EXAMPLES, HAVE_BWRAP, env_vars, honing, needs_bwrap, pip

pytestmark = pytest.mark.slow
SUITES = {"word_sort": EXAMPLES / "word_sort/honing_env_word_sort/suite.yaml",
          "calc_tool": EXAMPLES / "calc_tool/honing_env_calc_tool/suite.yaml"}


def test_env_list_shows_both_examples(installed: Path) -> None:
    proc = honing("env", "list", tmp=installed)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    for name in DISTS:
        assert name in rows, proc.stdout
        assert " 0.1.0 " in rows[name] and f"honing_env_{name}:ENV" in rows[name]
    assert "Sort 3-5 words alphabetically" in rows["word_sort"]
    assert "sandboxed calculator" in rows["calc_tool"]


@pytest.mark.parametrize("name", ["word_sort", pytest.param("calc_tool", marks=needs_bwrap)])
def test_env_check_passes(installed: Path, name: str) -> None:
    proc = honing("env", "check", name, tmp=installed)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines()[2:-1]}
    assert results == {"package": "ok", "fields": "ok", "splits": "ok", "hidden": "ok", "reference": "ok",
                       "junk": "ok", "suite": "ok"}, proc.stdout
    assert proc.stdout.splitlines()[-1] == f"env:{name} 0.1.0: passed"
    if name == "calc_tool":
        assert "multi-turn episodes" in proc.stdout


@pytest.mark.parametrize("name", ["word_sort", pytest.param("calc_tool", marks=needs_bwrap)])
def test_example_trains_and_evaluates_through_the_cli(installed: Path, tmp_path: Path, name: str) -> None:
    recipe = EXAMPLES / name / "recipe.yaml"
    run = tmp_path / "run"
    proc = honing("train", "--config", str(recipe), "--out", str(run), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == yaml.safe_load(recipe.read_text())["train"]["steps"]
    for when in ("heldout_before", "heldout_after"):
        assert summary[when]["n_tasks"] > 0 and summary[when]["infra_errors"] == 0
        assert f"env:{name}" in summary[when]["per_domain_pass@1"]
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "train/reward" in r]
    assert steps and all(r["rollout/infra_errors"] == 0 for r in steps)
    assert all(f"reward/env:{name}/total" in r for r in steps)
    if name == "calc_tool":  # multi-turn: the episodes ran turns in the sandbox
        assert all(r["train/completion_len"] > 0 for r in steps)

    out = tmp_path / "eval.json"
    proc = honing("eval", "--model", str(run), "--suite", f"env:{name}", "--out", str(out), "--no-progress",
                  tmp=tmp_path)  # the package's own suite, by the package's name
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    dom = result["domains"][f"env:{name}"]
    assert dom["n_tasks"] > 0 and dom["infra_errors"] == 0 and 0.0 <= dom["pass@1"] <= 1.0


@pytest.fixture
def demo_package(installed: Path, tmp_path: Path):
    """`honing env new demo_env` in a temporary directory, pip-installed; uninstalled afterwards."""
    proc = honing("env", "new", "demo_env", "--dir", str(tmp_path), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pkg = tmp_path / "demo_env"
    pip("install", "-e", str(pkg), env=env_vars(tmp_path))
    try:
        yield pkg
    finally:
        pip("uninstall", "-y", "honing-env-demo-env")


def test_env_new_scaffolds_a_package_whose_test_and_check_pass(demo_package: Path, tmp_path: Path) -> None:
    for rel in ("pyproject.toml", "honing_env_demo_env/__init__.py", "tests/test_env.py", "recipe.yaml", "README.md"):
        assert (demo_package / rel).is_file(), rel
    assert 'demo_env = "honing_env_demo_env:ENV"' in (demo_package / "pyproject.toml").read_text()
    recipe = yaml.safe_load((demo_package / "recipe.yaml").read_text())
    assert recipe["model"]["name"] == "tiny-random" and recipe["tasks"]["sources"][0]["name"] == "env:demo_env"
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(demo_package)],
                          capture_output=True, text=True, env=env_vars(tmp_path), cwd=demo_package, timeout=300)
    assert test.returncode == 0 and "2 passed" in test.stdout, test.stdout[-3000:] + test.stderr[-2000:]
    check = honing("env", "check", "demo_env", tmp=tmp_path)
    assert check.returncode == 0 and check.stdout.splitlines()[-1] == "env:demo_env 0.1.0: passed", check.stdout
    listed = honing("env", "list", tmp=tmp_path)
    assert "demo_env" in listed.stdout and "word_sort" in listed.stdout
    again = honing("env", "new", "demo_env", "--dir", str(tmp_path), tmp=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr


@needs_bwrap
def test_env_new_multi_turn_scaffold_passes_its_own_test(tmp_path: Path) -> None:
    proc = honing("env", "new", "mt_demo", "--dir", str(tmp_path), "--multi-turn", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pkg = tmp_path / "mt_demo"
    assert '"answer"' in (pkg / "honing_env_mt_demo/__init__.py").read_text()
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pkg)],
                          capture_output=True, text=True, env=env_vars(tmp_path), cwd=pkg, timeout=300)
    assert test.returncode == 0 and "1 passed" in test.stdout, test.stdout[-3000:] + test.stderr[-2000:]


def test_bad_inputs_fail_with_one_clear_line(installed: Path, tmp_path: Path) -> None:
    proc = honing("env", "check", "nosuch", tmp=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "unknown environment package 'nosuch'" in proc.stderr
    assert "calc_tool" in proc.stderr and "word_sort" in proc.stderr  # names the installed ones
    proc = honing("env", "check", "word_sortt", tmp=tmp_path)
    assert proc.returncode == 2 and "closest: word_sort" in proc.stderr
    proc = honing("env", "new", "bad-name", "--dir", str(tmp_path), tmp=tmp_path)
    assert proc.returncode == 2 and "not a valid Python identifier" in proc.stderr and "'bad_name'" in proc.stderr
    assert not (tmp_path / "bad-name").exists()


def test_examples_own_tests_pass(installed: Path, tmp_path: Path) -> None:
    for name in DISTS:
        if name == "calc_tool" and not HAVE_BWRAP:
            continue
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLES / name)],
                              capture_output=True, text=True, env=env_vars(tmp_path), cwd=EXAMPLES / name, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("name", ["word_sort", pytest.param("calc_tool", marks=needs_bwrap)])
def test_cli_and_python_api_train_identically(installed: Path, tmp_path: Path, name: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The same recipe through `honing train` and through `honing.train` (deterministic mode):
    the same completions with the same rewards, step by step, and the same held-out numbers."""
    import torch

    import honing as api
    from honing.schedule.trajstore import read_shard

    monkeypatch.syspath_prepend(str(EXAMPLES / name))  # the editable install's .pth is read at start-up only
    recipe = str(EXAMPLES / name / "recipe.yaml")
    proc = honing("train", "--config", recipe, "--out", str(tmp_path / "cli"), "run.deterministic=true", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # as the CLI run had (OMP_NUM_THREADS=1)
    try:
        summary = api.train(recipe, ["run.deterministic=true"], out=tmp_path / "api")
    finally:
        torch.set_num_threads(old)

    def samples(run: Path) -> list[tuple[str, str, float]]:
        return [(t.task_id, t.completion_text, t.reward) for shard in sorted((run / "trajectories").glob("*.parquet"))
                for t in read_shard(shard)]

    cli, py = samples(tmp_path / "cli"), samples(tmp_path / "api")
    assert cli and cli == py
    cli_summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    for when in ("heldout_before", "heldout_after"):
        assert cli_summary[when] == summary[when]
    # and evaluating: `honing eval` on the CLI's run, honing.evaluate on the API's run
    out = tmp_path / "cli-eval.json"
    proc = honing("eval", "--model", str(tmp_path / "cli"), "--suite", str(SUITES[name]), "--out", str(out),
                  "--no-progress", "--samples", "2", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch.set_num_threads(1)
    try:
        res = api.evaluate(str(tmp_path / "api"), suite=str(SUITES[name]), samples=2)
    finally:
        torch.set_num_threads(old)
    cli_res = json.loads(out.read_text())
    assert cli_res["overall"] == res["overall"] and cli_res["domains"] == res["domains"]


@pytest.mark.parametrize("name", ["word_sort", pytest.param("calc_tool", marks=needs_bwrap)])
def test_rollout_replays_the_packages_reference(installed: Path, tmp_path: Path, name: str) -> None:
    """`honing rollout --policy reference` uses the package's own reference solver / episode."""
    proc = honing("rollout", "--task", f"env:{name}", "--n", "2", "--policy", "reference", "--model", "tiny-random",
                  "--json", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(rows) == 2 and all(r["passed"] for r in rows), proc.stdout
