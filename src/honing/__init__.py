"""honing: RL post-training for language models (task - environment - verification loop).

    import honing
    honing.train("smoke", ["train.steps=20"], reward_funcs=[my_reward], tasks=my_tasks)
    honing.evaluate("runs/<name>", suite="quick")
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["train", "evaluate", "register_verifier", "register_source", "Summary", "__version__"]


def __getattr__(name: str) -> Any:  # lazy: `import honing` stays cheap (no torch until used)
    if name in ("train", "evaluate", "Summary"):
        from honing import api

        return getattr(api, name)
    if name == "register_verifier":
        from honing.verify import register_verifier

        return register_verifier
    if name == "register_source":
        from honing.tasks import register_source

        return register_source
    raise AttributeError(f"module 'honing' has no attribute {name!r}")
