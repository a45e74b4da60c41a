"""`honing sandbox doctor`'s profile section: every toolchain profile, and whether it works here.

A profile whose toolchain is optional and not installed (cad: `make setup-cad`) is reported as
`missing` with the command that installs it; one that is installed but does not run is `BROKEN`
(the doctor then exits non-zero). Each working profile is proved by a real box.
"""

from __future__ import annotations

from dataclasses import dataclass

from honing.sandbox.profiles import builtin_profiles, cad_toolchain_problem
from honing.sandbox.types import Limits, SandboxError

_PROBES = {
    "shell": (["/bin/sh", "-c", "echo ok"], "ok"),
    "python": (["python3", "-c", "import sys; print('ok', sys.version.split()[0])"], "ok"),
    "cad": (["python3", "-s", "-c", "import time; t = time.time(); import build123d as b; "
             "v = b.Box(1, 2, 3).volume; print('ok build123d', b.__version__, "
             "'import %.1fs' % (time.time() - t), 'box volume', round(v, 6))"], "ok build123d"),
}


@dataclass
class ProfileCheck:
    name: str
    status: str  # ok, missing (optional toolchain not installed), BROKEN
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == "BROKEN"


def check_profiles(sandbox: object) -> list[ProfileCheck]:
    """Run each profile's probe in a real box of `sandbox` (a honing.sandbox.Sandbox)."""
    out = []
    for name, prof in builtin_profiles().items():
        if name == "cad" and (why := cad_toolchain_problem()):
            out.append(ProfileCheck(name, "missing", why))
            continue
        argv, want = _PROBES.get(name, (["/bin/true"], ""))
        try:
            res = sandbox.exec(argv, profile=name,  # type: ignore[attr-defined]
                               limits=Limits(timeout_s=90, cpu_s=90, memory_mb=2048))
        except SandboxError as e:
            out.append(ProfileCheck(name, "BROKEN", str(e)))
            continue
        text = res.stdout.strip()
        if res.infra_error or res.exit_code != 0 or not text.startswith(want):
            why = res.infra_error or (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
            out.append(ProfileCheck(name, "BROKEN", f"{prof.description}: {why[:300]}"))
        else:
            out.append(ProfileCheck(name, "ok", f"{prof.description}; {text} ({res.wall_s:.1f}s box)"))
    return out
