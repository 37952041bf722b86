"""Shared by the benchmark scripts: whole-process timing and a report of medians."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def compile_package() -> None:
    """An installed package has bytecode (pip compiles on install); a checkout may not (notably with
    PYTHONDONTWRITEBYTECODE set). Compile it so every tool starts alike."""
    import hwprofile

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(Path(hwprofile.__file__).parent)], check=True
    )


def time_runs(cmd: list[str], env: dict[str, str], runs: int) -> list[float]:
    """Wall time of ``runs`` whole-process runs of ``cmd`` (after one warm-up run), in seconds."""
    return time_interleaved({"cmd": cmd}, env, runs)["cmd"]


def time_interleaved(cmds: dict[str, list[str]], env: dict[str, str], runs: int) -> dict[str, list[float]]:
    """Like ``time_runs`` for several commands, taking turns (one run of each per round), so that
    a machine that slows down or speeds up during the benchmark affects every command alike."""
    for cmd in cmds.values():
        subprocess.run(cmd, env=env, capture_output=True, check=True)  # warm-up (page cache, caches)
    out: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, capture_output=True, check=True)
            out[name].append(time.perf_counter() - t0)
    return out


def cpu_interleaved(
    cmds: dict[str, list[str]], env: dict[str, str], runs: int, envs: dict[str, dict[str, str]] | None = None
) -> dict[str, list[float]]:
    """Like ``time_interleaved``, but the CPU time (user + system) of each run, in seconds: on a
    machine shared with other work it varies less than wall time, and it is what a process costs.
    ``envs`` gives a command its own environment (a fake host of its own)."""
    envs = envs or {}
    import resource

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    for name, cmd in cmds.items():
        subprocess.run(cmd, env=envs.get(name, env), capture_output=True, check=True)  # warm-up
    out: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            t0 = cpu()
            subprocess.run(cmd, env=envs.get(name, env), capture_output=True, check=True)
            out[name].append(cpu() - t0)
    return out


def first_run(cmd: list[str], env: dict[str, str]) -> float:
    """Wall time of one run, in seconds (for a run with cold caches)."""
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, capture_output=True, check=True)
    return time.perf_counter() - t0


def script(python: str, name: str) -> str:
    """The console script ``name`` installed beside ``python`` (what users type), else ``name``."""
    path = Path(python).parent / name
    return str(path) if path.exists() else name


def report(results: dict[str, list[float]]) -> dict[str, float]:
    """Print median, p10 and p90 in ms per entry; return the medians."""
    med = {}
    for name, times in results.items():
        ms = [t * 1000 for t in times]
        med[name] = statistics.median(ms)
        q = statistics.quantiles(ms, n=10)
        print(f"  {name:40s} median {med[name]:7.1f} ms   p10 {q[0]:7.1f}   p90 {q[-1]:7.1f}")
    return med


def installed_python(workdir: Path, extra: tuple[str, ...] = ()) -> str:
    """A fresh virtual environment with hwprofile installed from its wheel, as a user installs it
    (no editable finder on every interpreter start); returns its python."""
    root = Path(__file__).resolve().parent.parent
    venv = workdir / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", str(root), *extra], check=True)
    subprocess.run([py, "-m", "compileall", "-q", str(venv / "lib")], check=True, capture_output=True)
    return py
