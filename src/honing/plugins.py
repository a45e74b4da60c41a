"""User code by name: what a recipe may name besides honing's own parts.

- `package.module:attr` or `./file.py:attr` (a file path, relative to the recipe's folder or the
  working directory) wherever a recipe names a verifier, a task source or a reward function;
- `plugins: [my_pkg.rewards, ./my_rewards.py]`: modules or files imported at start-up, whose
  `register_verifier` / `register_source` / `register_environment` calls make names usable;
- installed packages, found through Python entry points in the groups `honing.verifiers`,
  `honing.sources` and `honing.environments` (an environment package is named `env:<name>`).

A name that resolves nowhere fails with the nearest known names; user code that raises while
being imported fails with the user's own file, line and exception, not honing's traceback.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import sys
import traceback
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from honing.errors import TaskError

ENTRY_GROUPS = {"verifier": "honing.verifiers", "source": "honing.sources", "environment": "honing.environments"}
_HONING_DIR = str(Path(__file__).resolve().parent)
_FILE_MODULES: dict[str, ModuleType] = {}


class PluginError(TaskError):
    """User code that cannot be found or imported; the message names the file and line."""


class ModuleMissing(PluginError):
    """A referenced module that is not installed (the name may simply be a typo)."""


def is_reference(name: str) -> bool:
    """True for `module:attr` / `file.py:attr` (not honing's own `gym:x`, `jsonl:x`, `env:x`)."""
    left, sep, right = name.partition(":")
    if not sep or not right or left in ("gym", "jsonl", "repair", "code", "env", "hf", "openai"):
        return False
    return left.endswith(".py") or "/" in left or all(p.isidentifier() for p in left.split("."))


def _user_frame(exc: BaseException) -> str:
    """'file:line (source)' of the innermost traceback frame outside honing and importlib."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(_HONING_DIR) and "importlib" not in f.filename and "<frozen" not in f.filename]
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    if not frames:
        return "?"
    f = frames[-1]
    return f"{f.filename}:{f.lineno}" + (f" ({f.line.strip()[:80]})" if f.line else "")


def _import_failed(ref: str, exc: BaseException) -> PluginError:
    msg = f"{type(exc).__name__}: {exc}".strip()
    return PluginError(f"plugin '{ref}' failed to import: {_user_frame(exc)}: {msg}")


def _find_file(p: Path, base: Path | None) -> Path | None:
    """`p` against the recipe's folder first, then the working directory."""
    for cand in ([base / p] if base is not None and not p.is_absolute() else []) + [p]:
        if cand.is_file():
            return cand.resolve()
    return None


def _file_path(ref: str, base: Path | None) -> Path | None:
    if not (ref.endswith(".py") or "/" in ref):
        return None
    found = _find_file(Path(ref).expanduser(), base)
    if found is None:
        raise PluginError(f"plugin file not found: {ref}" + (f" (looked in {base} and the working directory)" if base else ""))
    return found


def import_ref(ref: str, base: Path | None = None) -> ModuleType:
    """Import a module by dotted name or a Python file by path (each file once per process)."""
    path = _file_path(ref, base)
    try:
        if path is None:
            return importlib.import_module(ref)
        key = str(path)
        if key in _FILE_MODULES:
            return _FILE_MODULES[key]
        name = f"honing_plugin_{path.stem}_{hashlib.sha1(key.encode()).hexdigest()[:8]}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _FILE_MODULES[key] = module
        return module
    except PluginError:
        raise
    except ModuleNotFoundError as e:
        if path is None and e.name and (ref == e.name or ref.startswith(e.name + ".")):
            raise ModuleMissing(f"plugin module '{ref}' not found (is its package installed, or is it on PYTHONPATH?)") from None
        raise _import_failed(ref, e) from None
    except Exception as e:  # noqa: BLE001 - the user's code raised while importing
        raise _import_failed(ref, e) from None


def resolve(ref: str, base: Path | None = None) -> Any:
    """`module:attr` or `file.py:attr` (attr may be dotted) -> the object."""
    mod_ref, _, attr = ref.rpartition(":")
    module = import_ref(mod_ref, base)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_")]
            close = difflib.get_close_matches(attr, names, n=3, cutoff=0.5)
            hint = f"; closest: {', '.join(close)}" if close else ""
            raise PluginError(f"'{ref}': {mod_ref} has no attribute '{attr}'{hint}")
        obj = getattr(obj, part)
    return obj


def absolute_ref(ref: str, base: Path | None) -> str:
    """`./x.py:attr` (or a plugin path `./x.py`) with the file made absolute against `base`, so a
    run directory's config.yaml still resolves from anywhere (`honing train --resume`)."""
    mod, sep, attr = ref.rpartition(":") if is_reference(ref) else (ref, "", "")
    if not (mod.endswith(".py") or "/" in mod) or Path(mod).expanduser().is_absolute():
        return ref
    found = _find_file(Path(mod).expanduser(), base)
    return f"{found}{sep}{attr}" if found is not None else ref


_BASE: list[Path | None] = [None]  # the recipe's folder, for relative plugin paths


def set_base(base: Path | None) -> None:
    _BASE[0] = base


def base() -> Path | None:
    return _BASE[0]


def load_plugins(refs: Iterable[str], base_dir: Path | None = None) -> list[ModuleType]:
    """Import every `plugins:` entry (module name or file path)."""
    if base_dir is not None:
        set_base(base_dir)
    return [import_ref(r, base_dir if base_dir is not None else base()) for r in refs]


def _entry_points(kind: str) -> list[metadata.EntryPoint]:
    return list(metadata.entry_points(group=ENTRY_GROUPS[kind]))


def entry_point_names(kind: str) -> list[str]:
    return sorted({ep.name for ep in _entry_points(kind)})


def load_entry_point(kind: str, name: str) -> Any | None:
    """The object an installed package registers under `name` in `kind`'s group, or None."""
    for ep in _entry_points(kind):
        if ep.name == name:
            try:
                return ep.load()
            except Exception as e:  # noqa: BLE001 - the package's code raised while importing
                raise _import_failed(f"{ep.group}:{name} = {ep.value}", e) from None
    return None


def unknown_name(kind: str, name: str, known: Iterable[str], note: str = "") -> PluginError:
    """The error for a name that resolves nowhere, listing the nearest known names."""
    options = sorted(set(known))
    close = difflib.get_close_matches(name, options, n=3, cutoff=0.5)
    hint = f"; closest: {', '.join(close)}" if close else (f"; known: {', '.join(options)}" if options else "")
    return PluginError(f"unknown {kind} '{name}'{hint}" + (f"; as a reference: {note}" if note else
                       " (or name one as 'package.module:attr' or './file.py:attr')"))
