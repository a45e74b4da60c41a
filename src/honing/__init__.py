"""honing: RL post-training for language models (task - environment - verification loop)."""

__version__ = "0.1.0"
