"""cad: model a part with build123d, build it in a sandbox, graded by geometry (a multi-turn honing
environment package with its own sandbox toolchain; issue 19).

The model writes a build123d script that leaves one solid in `result`. It runs in the `cad` sandbox
profile (the system python3 plus build123d/OCCT from `make setup-cad`, read-only; no network, an
unprivileged uid, limits), in warm cells whose zygote has build123d preloaded. The verifier exports
the part as BREP through its own runner, measures it in a second box against the hidden reference
program and scores in layers: build gate, validity, bbox, volume, IoU by OCCT booleans, feature
counts (grader.py). Tasks: families.py (parts) and tasks.py (source, split by structure);
tools and the verifier: env.py; the in-box programs: boxcode.py.
"""

from __future__ import annotations

from honing.envpkg import Environment

from honing_env_cad.env import TOOLS, CadVerifier, make_environment, reference_episode
from honing_env_cad.tasks import make_tasks

__version__ = "0.1.0"

ENV = Environment(
    name="cad",
    version=__version__,
    description="Script a part in build123d; a sandbox builds it; bbox, volume, IoU and feature counts grade it",
    tasks=make_tasks,
    verifier=CadVerifier(),
    tools=TOOLS,
    environment=make_environment,
    reference=reference_episode,
    eval_suite="suite.yaml",
)
