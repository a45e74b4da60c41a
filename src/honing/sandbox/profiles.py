"""Toolchain profiles ("images"): what a box can see and run.

A profile is read-only host paths mounted into the box, a PATH, and a fixed environment.
Nothing else of the host is visible: not /home, /root, the project's source or its venv.
"""

from __future__ import annotations

import difflib
import os
import shutil
from dataclasses import dataclass, field

from honing.sandbox.types import SandboxError

# Fixed so that the same files + same profile give the same result.
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/work",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "TMPDIR": "/tmp",
}


@dataclass(frozen=True)
class Profile:
    name: str
    ro_paths: tuple[str, ...]  # host paths bound read-only at the same place
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""

    def environment(self) -> dict[str, str]:
        return {**BASE_ENV, **self.env}


def _system_paths() -> tuple[str, ...]:
    """The OS userland (merged-/usr Debian: /bin, /lib are links into /usr) and the bits of
    /etc that programs need to start; never /etc/shadow or host secrets."""
    keep = ["/usr", "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
            "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf"]
    for p in ("/bin", "/lib", "/lib64", "/sbin", "/lib32"):
        if os.path.exists(p) and not os.path.islink(p):
            keep.append(p)
    return tuple(p for p in keep if os.path.exists(p))


def _system_python() -> str:
    """An interpreter outside any venv/pyenv: the distribution's /usr/bin/python3."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand):
            return cand
    found = shutil.which("python3")
    raise SandboxError(f"profile 'python' needs a system python3 in /usr/bin (found {found!r} only)")


def builtin_profiles() -> dict[str, Profile]:
    system = _system_paths()
    return {
        "shell": Profile("shell", system, description="bash, coreutils; no interpreters beyond the OS's"),
        "python": Profile("python", system, env={"HONING_PYTHON": "/usr/bin/python3"},
                          description="the system python3 and its standard library; no project venv"),
    }


def get_profile(name: str) -> Profile:
    profiles = builtin_profiles()
    if name not in profiles:
        close = difflib.get_close_matches(name, list(profiles), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise SandboxError(f"unknown sandbox profile '{name}'{hint}; profiles: {', '.join(sorted(profiles))}")
    if name == "python":
        _system_python()
    return profiles[name]
