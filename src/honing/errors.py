"""User-facing errors: the CLI prints them as one line and exits non-zero."""

from __future__ import annotations


class HoningError(Exception):
    """An error caused by the user's input (config, paths, names). Message names the problem."""


class ConfigError(HoningError):
    """Bad config file, unknown key, wrong type."""


class ModelError(HoningError):
    """A model spec that does not resolve to loadable weights."""


class TaskError(HoningError):
    """Unknown domain, bad task file."""
