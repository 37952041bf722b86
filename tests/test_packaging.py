"""The README's commands and the package's data files."""

from __future__ import annotations

import re
import shutil
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


def _clean_source(tmp_path: Path) -> Path:
    """The tracked files only, as a fresh clone has them: a build in the working tree would pick up
    the editable install's egg-info and hide a package missing from pyproject.toml."""
    src = tmp_path / "src"
    files = (
        subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for f in filter(None, files):
        dest = src / f
        dest.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / f).is_file():
            shutil.copy2(ROOT / f, dest)
    return src


def test_wheel_ships_profiles_and_templates(tmp_path: Path) -> None:
    src = _clean_source(tmp_path)
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
            str(src),
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
    assert (
        len([p for p in data if p.suffix == ".yaml"]) >= 13
        and len([p for p in data if p.suffix == ".j2"])
        == 5  # shell, config YAML, env file, systemd unit, nginx
    )
    for p in data:
        assert f"hwprofile/{p.parent.name}/{p.name}" in names, p
    modules = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "hwprofile").rglob("*.py")
        if "__pycache__" not in p.parts
    ]
    missing = [m for m in modules if m not in names]
    assert not missing, f"modules missing from the wheel (add their package to pyproject.toml): {missing}"
    for p in [*(ROOT / "hwprofile" / "data").glob("*.yaml"), *(ROOT / "hwprofile" / "data").glob("*.json")]:
        assert f"hwprofile/data/{p.name}" in names, p

    # The unpacked wheel (not this checkout) finds its own profiles and templates.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import hwprofile, sys; from hwprofile.match.profiles import builtin_dir; "
        "from hwprofile.render.output import template_dir; "
        "print(hwprofile.__file__); print(builtin_dir()); print(template_dir())"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    module, profiles, templates = r.stdout.split()
    assert all(x.startswith(str(site)) for x in (module, profiles, templates)), r.stdout
    assert (Path(profiles) / "base.yaml").is_file() and (
        Path(templates) / "vllm-instance.service.j2"
    ).is_file()


def test_processes_hwprofile_starts_of_itself_ignore_a_checkout_in_the_working_directory(
    tmp_path: Path,
) -> None:
    """A newcomer installs non-editable and runs commands inside the clone: the detached supervisor
    (``python -m hwprofile``) imported the clone's ``hwprofile/`` instead of the installed package, and
    refused the plan as "not what its inputs plan". Here the working directory holds a decoy package
    that exits "shadowed" when imported: the command hwprofile starts itself with runs the real one."""
    from hwprofile.runtime.processes import module_command

    decoy = tmp_path / "checkout" / "hwprofile"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise SystemExit('shadowed by the checkout')\n")
    (decoy / "__main__.py").write_text("")
    plain = subprocess.run(
        [sys.executable, "-m", "hwprofile", "--version"],
        cwd=decoy.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "shadowed" in plain.stderr  # what `python -m` does: the decoy is imported
    r = subprocess.run(
        [*module_command(), "--version"], cwd=decoy.parent, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout.startswith("hwprofile "), r.stderr
    # and no process hwprofile starts of itself is spelled another way
    spelled = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "hwprofile").rglob("*.py")
        if 'sys.executable, "-m", "hwprofile"' in p.read_text()
    ]
    assert spelled == [], spelled
