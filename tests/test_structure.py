"""The structure the redesign of the running wing promised, read off the code's own syntax trees:
one place builds a Supervisor, the instance does not reach into it, NVML is spoken only inside
host/, requests to an instance go through telemetry/http.py. (The layer order itself is checked
against docs/architecture.md by test_docs.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hwprofile"


def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(PACKAGE.parent)): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}


def calls_to(tree: ast.Module, name: str) -> int:
    return sum(
        1
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and ((isinstance(n.func, ast.Name) and n.func.id == name) or (isinstance(n.func, ast.Attribute) and n.func.attr == name))
    )


def imported(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            out.add("." * n.level + (n.module or ""))
            out.update(f"{'.' * n.level}{n.module or ''}.{a.name}" for a in n.names)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
    return out


def test_one_module_builds_supervisors() -> None:
    builders = {path for path, tree in modules().items() if calls_to(tree, "Supervisor")}
    assert builders == {"hwprofile/launch/start.py"}, builders


def test_the_instance_does_not_import_its_supervisor() -> None:
    names = imported(modules()["hwprofile/supervise/instance.py"])
    assert not {n for n in names if "supervisor" in n}, names


def test_nvml_is_spoken_only_inside_host() -> None:
    users = {path for path, tree in modules().items() if any("pynvml" in n for n in imported(tree))}
    assert users and all(p.startswith("hwprofile/host/") for p in users), users


def test_http_is_spoken_in_one_module() -> None:
    """Every request to a server goes through telemetry/http.py (no proxy, a deadline, a cap)."""
    clients = {
        path for path, tree in modules().items()
        if {"urllib.request", "http.client", "http.client.HTTPConnection"} & imported(tree)
        or any(n.startswith("urllib.request") for n in imported(tree))
    }  # fmt: skip
    assert clients <= {"hwprofile/telemetry/http.py", "hwprofile/telemetry/scrape.py"}, clients


def test_run_time_files_are_named_in_one_module() -> None:
    names = ('"state.json"', '"last.json"', '"launch.json"', '"daemon.json"', '"supervisor.lock"')
    where = {
        p for p in (PACKAGE.rglob("*.py")) for name in names if name in p.read_text()
    }
    assert {str(p.relative_to(PACKAGE.parent)) for p in where} == {"hwprofile/runfiles.py"}
