"""vLLM's model registry (``vllm/model_executor/models/registry.py``) read off its source, never
imported, so that any release's wheel on any platform will do: the architecture classes its
``_*_MODELS`` tables list, and the ones ``_PREVIOUSLY_SUPPORTED_MODELS`` says it removed. Shared by
tools/vllm_first_listed.py and tools/vllm_removed.py."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

REMOVED = "_PREVIOUSLY_SUPPORTED_MODELS"
REGISTRY = ("model_executor", "models", "registry.py")


def assignments(path: Path) -> list[tuple[str, ast.expr]]:
    """Every module-level ``NAME = value`` (or ``NAME: type = value``) of ``path``, in order."""
    found: list[tuple[str, ast.expr]] = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            found.append((node.targets[0].id, node.value))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found.append((node.target.id, node.value))
    return found


def listed(path: Path) -> set[str]:
    """The architecture classes one registry.py lists: the keys of every ``_*_MODELS`` dict but the
    removed ones, every assignment of each."""
    names: set[str] = set()
    for name, value in assignments(path):
        if (
            name.startswith("_")
            and name.endswith("_MODELS")
            and name != REMOVED
            and isinstance(value, ast.Dict)
        ):
            names.update(
                k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            )
    if not names:
        raise SystemExit(f"{path}: no _*_MODELS table (not a registry.py?)")
    return names


def removed(path: Path) -> dict[str, str]:
    """``_PREVIOUSLY_SUPPORTED_MODELS`` of one registry.py (its first assignment): architecture -> the
    last release serving it."""
    value = next((v for name, v in assignments(path) if name == REMOVED), None)
    if value is None:
        raise SystemExit(f"{path}: no {REMOVED} (a release before the list, or it moved: read the file)")
    found = ast.literal_eval(value)
    if not isinstance(found, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in found.items()
    ):
        raise SystemExit(f"{path}: {REMOVED} is not a dict of names to versions")
    return found


def installed() -> tuple[str, Path] | None:
    """(release, registry.py) of the vLLM installed beside this Python, without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    version = importlib.metadata.version("vllm").split("+")[0]
    return version, Path(next(iter(spec.submodule_search_locations)), *REGISTRY)


def sources(items: list[str]) -> list[tuple[str, Path]]:
    """``RELEASE=PATH`` arguments as (release, registry.py) pairs."""
    pairs = [(r.split("=", 1)[0], Path(r.split("=", 1)[1])) for r in items if "=" in r]
    if len(pairs) != len(items):
        raise SystemExit("each registry is RELEASE=PATH")
    return pairs
