"""A run directory made without training (the tiny model saved the way the loop saves checkpoints),
a tiny suite, and an in-process CLI runner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

SUITE = {
    "name": "tiny-release", "version": 1, "seed": 1000003, "samples_per_task": 2,
    "sampling": {"temperature": 0.7, "max_new_tokens": 4}, "extractor": "last_number", "batch_tasks": 8,
    "sources": [{"name": "gym:basic_arithmetic", "count": 8,
                 "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
                            "allow_negation": False, "allow_parentheses": False}}],
}


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def make_run(root: Path, seed: int, steps: tuple[int, ...] = (2,), sources: list | None = None) -> Path:
    from honing.models import build_tiny_random
    from honing.schedule.runlog import save_checkpoint

    run = root / f"run-{seed}"
    model, tok = build_tiny_random(seed)
    for s in steps:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.001 * s)
        save_checkpoint(run / "checkpoints" / f"step-{s}", model, tok, {}, s)
    cfg = {"model": {"name": "tiny-random"}, "train": {"steps": max(steps), "learning_rate": 1e-3},
           "tasks": {"sources": sources or [{"name": "gym:basic_arithmetic"}]}}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


@pytest.fixture(scope="session", name="make_run")
def make_run_fixture():  # noqa: ANN201 - a clean clone cannot import tests.* modules: hand the helper over
    return make_run


@pytest.fixture(scope="session")
def suite_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    p = tmp_path_factory.mktemp("suite") / "tiny-release.yaml"
    p.write_text(yaml.safe_dump(SUITE))
    return str(p)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture):  # noqa: ANN201
    """Run `honing ARGS` in this process: (exit code, stdout, stderr)."""
    from honing import cli as honing_cli

    def run(*args: str) -> tuple[int, str, str]:
        old = sys.argv
        sys.argv = ["honing", *args]
        code = 0
        try:
            honing_cli.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            sys.argv = old
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
