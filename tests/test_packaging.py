"""The README's commands and the package's data files."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _block_after(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(re.escape(marker) + r"\s*```sh\n(.*?)\n```", text, re.S)
    assert m, f"README.md has no command after {marker}"
    return m.group(1)


def test_readme_has_exactly_two_setup_commands() -> None:
    main, test = _block_after("<!-- main-command -->"), _block_after("<!-- test-command -->")
    assert "hwprofile" in main and "pip install" in main
    assert "pytest" in test and "pip install" in test
    assert "test-command" in (ROOT / ".ci" / "run").read_text()


def test_wheel_ships_profiles_and_templates(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("hwprofile-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [
        p
        for d in ("profiles", "templates")
        for p in (ROOT / d).iterdir()
        if p.is_file() and p.suffix in (".yaml", ".j2")
    ]
    for p in data:
        assert f"hwprofile/{p.parent.name}/{p.name}" in names, p
    assert "hwprofile/detect/nvml.py" in names
    for p in (ROOT / "hwprofile" / "data").glob("*.yaml"):
        assert f"hwprofile/data/{p.name}" in names, p
