"""Verifiers turn completions into rewards. Built-ins register on import."""

from honing.verify import builtin as _builtin  # noqa: F401 - registers the built-ins
from honing.verify import code as _code  # noqa: F401 - registers the "code" verifier
from honing.verify import math as _math  # noqa: F401 - registers "math"
from honing.verify import repair as _repair  # noqa: F401 - registers "repair"
from honing.verify import finance as _finance  # noqa: F401 - registers "extract"
from honing.verify import judge as _judge  # noqa: F401 - registers "judge" (models load lazily)
from honing.verify.registry import FunctionVerifier, get_verifier, grade, register_verifier, verifier_names
from honing.verify.types import Verdict, Verifier, VerifyContext

__all__ = ["Verdict", "Verifier", "VerifyContext", "FunctionVerifier", "get_verifier", "grade",
           "register_verifier", "verifier_names"]
