"""Sandboxed execution of model-written code. See honing.sandbox.bwrap for what a box is
and what it does not protect against (it shares the host kernel)."""

from honing.sandbox.core import Backend, Sandbox, Session, make_backend
from honing.sandbox.profiles import Profile, builtin_profiles, get_profile
from honing.sandbox.types import ExecResult, Limits, SandboxError

__all__ = ["Backend", "ExecResult", "Limits", "Profile", "Sandbox", "SandboxError", "Session",
           "builtin_profiles", "get_profile", "make_backend"]
