"""The unsafe local backend: only when asked for, loudly, and still limited."""

from __future__ import annotations

import pytest

from honing.sandbox import Limits, Sandbox, SandboxError
from honing.sandbox.core import make_backend


def test_local_backend_warns_and_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.warns(UserWarning, match="NOT ISOLATED"):
        sb = Sandbox("local")
    assert "NOT ISOLATED" in capsys.readouterr().err
    res = sb.exec(["python3", "-c", "print(6 * 7)"])
    assert res.stdout == "42\n" and res.backend == "local-unsafe"
    slow = sb.exec(["sleep", "30"], limits=Limits(timeout_s=0.5))
    assert slow.timed_out and slow.wall_s < 10


def test_unknown_backend_is_refused_not_replaced() -> None:
    with pytest.raises(SandboxError, match="unknown sandbox backend 'docker'"):
        make_backend("docker")
