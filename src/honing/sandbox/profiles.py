"""Toolchain profiles ("images"): what a box can see and run.

A profile is read-only host paths mounted into the box, a PATH, a fixed environment and a
few generated files (the box's own /etc/passwd, /etc/group, /etc/hosts, /etc/nsswitch.conf:
the host's user names never enter a box). Nothing else of the host is visible: not /home,
/root, /etc/shadow, the project's source or its venv.
"""

from __future__ import annotations

import difflib
import os
import shutil
from dataclasses import dataclass, field

from honing.sandbox.types import SandboxError

BOX_UID = 1000  # the uid (and gid) a box runs as, inside its user namespace
BOX_USER = "box"

# Generated, not the host's: only root, the box user and the overflow id (what files owned by
# host ids that are not mapped into the box show as).
BOX_ETC = {
    "/etc/passwd": (f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                    f"{BOX_USER}:x:{BOX_UID}:{BOX_UID}:{BOX_USER}:/work:/bin/bash\n"
                    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
    "/etc/group": f"root:x:0:\n{BOX_USER}:x:{BOX_UID}:\nnogroup:x:65534:\n",
    "/etc/hosts": "127.0.0.1\tlocalhost box\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "/etc/hostname": "box\n",
    "/etc/nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\n",
}

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
    # generated files bound read-only into the box: box path -> content
    data: dict[str, str] = field(default_factory=lambda: dict(BOX_ETC))
    # host path -> box path, bound read-only (a toolchain directory at a fixed box path, so the
    # box neither sees nor depends on where the checkout lives)
    binds: tuple[tuple[str, str], ...] = ()

    def environment(self) -> dict[str, str]:
        return {**BASE_ENV, **self.env}


def _system_paths() -> tuple[str, ...]:
    """The OS userland (merged-/usr Debian: /bin, /lib are links into /usr) and the bits of
    /etc that programs need to start; never /etc/passwd, /etc/group (generated instead: see
    BOX_ETC), /etc/shadow or other host secrets."""
    keep = ["/usr", "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
            "/etc/localtime"]
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


# The cad toolchain (issue 19): build123d + OCCT installed for the system python3 by
# `make setup-cad` into its own directory (never the project's venv), bound read-only here.
CAD_BOX_DIR = "/opt/honing/cad"
CAD_SETUP_HINT = "run `make setup-cad` (or set HONING_CAD_TOOLCHAIN to a directory holding build123d)"


SYSTEM_CAD_DIR = "/opt/honing/toolchains/cad"  # where `make setup-cad` installs when run as root


def cad_toolchain_dir() -> str:
    """Where the cad toolchain lives on the host: $HONING_CAD_TOOLCHAIN; else the checkout's
    .toolchains/cad (what `make setup-cad` writes for a non-root user) when it holds build123d;
    else SYSTEM_CAD_DIR (what it writes as root: a root checkout often sits under a 0700 directory,
    such as /root or a mktemp folder, which the box's unprivileged host uid cannot traverse)."""
    env = os.environ.get("HONING_CAD_TOOLCHAIN", "").strip()
    if env:
        return os.path.abspath(env)
    local = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".toolchains", "cad"))
    if os.path.isdir(os.path.join(local, "build123d")) or not os.path.isdir(SYSTEM_CAD_DIR):
        return local
    return SYSTEM_CAD_DIR


def _untraversable_ancestor(path: str) -> str | None:
    """As root, boxes run as an unprivileged host uid (bwrap.DEFAULT_HOST_UID): a bound directory must
    be reachable by 'other'. The first ancestor of `path` that is not, or None."""
    if os.geteuid() != 0:
        return None
    p = os.path.abspath(path)
    while True:
        try:
            if not os.stat(p).st_mode & 0o001:
                return p
        except OSError:
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def cad_toolchain_problem() -> str | None:
    """None when the cad toolchain directory looks installed and a box can reach it; else what is
    wrong (one line)."""
    d = cad_toolchain_dir()
    if not os.path.isdir(os.path.join(d, "build123d")):
        return f"the cad toolchain is not installed (no build123d in {d}): {CAD_SETUP_HINT}"
    if (blocked := _untraversable_ancestor(d)) is not None:
        return (f"the cad toolchain {d} is not reachable from a box ({blocked} is not o+x for the box's "
                f"unprivileged host uid): reinstall with `make setup-cad` as root (it writes {SYSTEM_CAD_DIR}) "
                "or point HONING_CAD_TOOLCHAIN at a world-readable copy")
    return None


def builtin_profiles() -> dict[str, Profile]:
    system = _system_paths()
    python_env = {"HONING_PYTHON": "/usr/bin/python3"}
    return {
        "shell": Profile("shell", system, description="bash, coreutils; no interpreters beyond the OS's"),
        "python": Profile("python", system, env=python_env,
                          description="the system python3 and its standard library; no project venv"),
        # The python profile plus the toolchain at a fixed box path. One BLAS/OpenMP thread: a
        # box's CPU is limited anyway, and a warm cell's zygote must stay single-threaded to fork.
        "cad": Profile("cad", system, env={**python_env, "PYTHONPATH": CAD_BOX_DIR, "OMP_NUM_THREADS": "1",
                                           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                           "MPLBACKEND": "Agg"},
                       binds=((cad_toolchain_dir(), CAD_BOX_DIR),),
                       description=f"python + build123d/OCCT (make setup-cad) read-only at {CAD_BOX_DIR}"),
    }


def get_profile(name: str) -> Profile:
    profiles = builtin_profiles()
    if name not in profiles:
        close = difflib.get_close_matches(name, list(profiles), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise SandboxError(f"unknown sandbox profile '{name}'{hint}; profiles: {', '.join(sorted(profiles))}")
    if name in ("python", "cad"):
        _system_python()
    if name == "cad" and (why := cad_toolchain_problem()):
        raise SandboxError(f"sandbox profile 'cad': {why}")
    return profiles[name]
