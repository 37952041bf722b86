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
