"""The structure the redesign of the running wing promised, read off the code's own syntax trees:
one place builds a Supervisor, the instance does not reach into it, NVML is spoken only inside
host/, requests to an instance go through telemetry/http.py, no import circle. (The layer order is checked
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
        and (
            (isinstance(n.func, ast.Name) and n.func.id == name)
            or (isinstance(n.func, ast.Attribute) and n.func.attr == name)
        )
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
        path
        for path, tree in modules().items()
        if {"urllib.request", "http.client", "http.client.HTTPConnection"} & imported(tree)
        or any(n.startswith("urllib.request") for n in imported(tree))
    }
    assert clients <= {"hwprofile/telemetry/http.py", "hwprofile/telemetry/scrape.py"}, clients


def test_run_time_files_are_named_in_one_module() -> None:
    names = ('"state.json"', '"last.json"', '"launch.json"', '"daemon.json"', '"supervisor.lock"')
    where = {p for p in (PACKAGE.rglob("*.py")) for name in names if name in p.read_text()}
    assert {str(p.relative_to(PACKAGE.parent)) for p in where} == {"hwprofile/supervise/runfiles.py"}


def import_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports (at the top or inside a function, or only for type
    checking: on the safe side), relative imports resolved; ``from pkg import name`` is the submodule
    ``pkg.name`` where one exists, and every package above an imported module counts as imported."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = graph.setdefault(name, set())
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import):
                out.update(a.name for a in n.names if a.name in names)
            elif isinstance(n, ast.ImportFrom):
                base = package.rsplit(".", n.level - 1)[0] if n.level > 1 else package if n.level else ""
                target = ".".join(p for p in (base, n.module or "") if p)
                subs = {f"{target}.{a.name}" for a in n.names} & names.keys()
                out.update(subs or ({target} & names.keys()))
        # importing a.b.c runs the __init__ of a.b first (but a module's own packages are already running)
        own = {name.rsplit(".", i)[0] for i in range(name.count(".") + 1)}
        out.update(
            {t.rsplit(".", i)[0] for t in out for i in range(1, t.count(".") + 1)} & names.keys() - own
        )
        out.discard(name)
    return graph


def test_no_import_circle() -> None:
    """No two modules of the package import each other, directly or round a circle (Tarjan's
    strongly connected components of the import graph, lazy imports included)."""
    graph, index, low, stack, on, circles = import_graph(), {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert len(graph) > 100 and any(graph.values())  # the graph was read
    assert not circles, circles
