"""Versioned releases (issue 20): `create` a release from a run, `promote` it (gated by eval
compare), `rollback`; the registry keeps lineage and the `current` pointer `honing serve` follows."""

from honing.release.build import create as create_release, export
from honing.release.ops import PromoteRefused, diff, promote, rollback, show
from honing.release.registry import Registry, Release

__all__ = ["PromoteRefused", "Registry", "Release", "create_release", "diff", "export", "promote", "rollback", "show"]
