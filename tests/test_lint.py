"""The package type-checks and lints clean, in the normal suite (so CI, which runs the README's test
command, runs both): mypy with pyproject.toml's ``[tool.mypy]`` (packages, strictness, the per-module
exceptions) finds no error, ``ruff check`` with ``[tool.ruff]`` finds nothing (its bounds included: no
function of the package above complexity 15 or 60 statements), and ``ruff format`` would change nothing. A type-checker
silencing (``# type: ignore``) names its error code (mypy enforces that: ``ignore-without-code``) and
says why after it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# generous: mypy from a cold cache takes ~25 s of one core, and the suite shares two cores
TIMEOUT_S = 900


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def test_mypy_finds_no_error_in_the_package() -> None:
    r = _run("mypy")  # what to check and how strictly: [tool.mypy] in pyproject.toml
    assert r.returncode == 0, f"mypy (exit {r.returncode}):\n{r.stdout}{r.stderr}"
    checked = re.search(r"Success: no issues found in (\d+) source files", r.stdout)
    assert checked is not None, r.stdout
    ours = sum(1 for _ in (ROOT / "hwprofile").rglob("*.py"))
    assert int(checked.group(1)) >= ours, f"mypy checked {checked.group(1)} files, hwprofile/ has {ours}"


def test_ruff_check_finds_nothing() -> None:
    r = _run("ruff", "check", "--no-cache", ".")
    assert r.returncode == 0, f"ruff check (exit {r.returncode}):\n{r.stdout}{r.stderr}"


def test_ruff_format_would_change_nothing() -> None:
    """The tree is as ``ruff format`` writes it (no ``# fmt: skip`` left: a table the formatter spreads
    over lines reads as well)."""
    r = _run("ruff", "format", "--check", "--no-cache", ".")
    assert r.returncode == 0, f"ruff format --check (exit {r.returncode}):\n{r.stdout}{r.stderr}"


def test_every_type_ignore_names_its_code_and_says_why() -> None:
    bare = []
    for path in sorted((ROOT / "hwprofile").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "type: ignore" in line and not re.search(r"# type: ignore\[[a-z-]+(, [a-z-]+)*\]  # \S", line):
                bare.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bare, "a type: ignore without its code or its reason:\n" + "\n".join(bare)


# Functions over MAX_FUNCTION_LINES lines (``def`` to last line, docstring included) that are still to be
# split, each with the area that owns it and its length when listed: none may grow, none may join the
# list, and one split below the bound leaves it (its entry is then stale: remove it). Issue 34: no
# function over ~60 lines in the planner, renderer and daemon.
MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS: dict[str, tuple[str, int]] = {}


def function_lengths(root: Path = ROOT / "hwprofile") -> dict[str, int]:
    """``path:Class.function`` (nested functions by their parent's name too) -> lines, every function
    and method of the package."""
    import ast

    out: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                out[f"{where}:{name}"] = (child.end_lineno or child.lineno) - child.lineno + 1
                walk(child, name + ".", where)
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".", where)
            else:
                walk(child, prefix, where)

    for path in sorted(root.rglob("*.py")):
        walk(ast.parse(path.read_text()), "", path.relative_to(root.parent).as_posix())
    return out


def test_no_function_grows_over_60_lines() -> None:
    lengths = function_lengths()
    new = [
        f"{k}: {n} lines" for k, n in lengths.items() if n > MAX_FUNCTION_LINES and k not in LONG_FUNCTIONS
    ]
    grown = [
        f"{k} ({area}): {lengths[k]} lines, listed at {was}"
        for k, (area, was) in LONG_FUNCTIONS.items()
        if lengths.get(k, 0) > was
    ]
    stale = [k for k in LONG_FUNCTIONS if lengths.get(k, 0) <= MAX_FUNCTION_LINES]
    assert not new, f"functions over {MAX_FUNCTION_LINES} lines: split them into named helpers\n" + "\n".join(
        new
    )
    assert not grown, "listed long functions grew: split them instead\n" + "\n".join(grown)
    assert not stale, "split or gone: take these off LONG_FUNCTIONS\n" + "\n".join(stale)


def test_the_function_length_check_sees_what_it_should(tmp_path: Path) -> None:
    """The walker names methods and nested functions and counts docstrings and bodies."""
    pkg = tmp_path / "hwprofile"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (pkg / "m.py").write_text(
        f'class A:\n    def f(self):\n        def g():\n            pass\n        """doc"""\n\n\ndef h():\n{body}\n'
    )
    got = {k.split(":", 1)[1]: n for k, n in function_lengths(pkg).items()}
    assert got == {"A.f": 4, "A.f.g": 2, "h": 62}
