"""``python -m hwprofile ARGS`` run inside the test process: the same ``hwprofile.cli.main`` the
console script calls (the one place an error becomes an exit code), with the environment, working
folder and stdin the command would get, stdout and stderr captured. A corpus of a hundred hostile
inputs then costs a hundred calls, not a hundred interpreters (each ~0.4 s of CPU on this machine).

It is the CLI, not a stand-in: ``test_the_in_process_cli_is_the_cli`` (tests/test_hostile_yaml.py)
runs cases both ways and requires the same exit code, stdout and stderr. A test about the process
itself (signals, the interpreter's flush at exit, a hang killed by a timeout) runs a subprocess."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _as_loaded(env: Mapping[str, str]) -> Mapping[str, str]:
    """A new process finds ``libnvidia-ml.so.1`` on ``LD_LIBRARY_PATH`` (the fake NVML, tests/fakehost.py);
    this process read that variable when it started, so the library is named by its full path instead
    (``HWPROFILE_NVML_LIBRARY``, which detection loads first). Without it, whether the call saw the fake
    GPUs depended on whether an earlier test in the same worker had loaded the library."""
    if "HWPROFILE_NVML_LIBRARY" in env:
        return env
    for d in (env.get("LD_LIBRARY_PATH") or "").split(":"):
        lib = Path(d) / "libnvidia-ml.so.1"
        if d and lib.is_file():
            return {**env, "HWPROFILE_NVML_LIBRARY": str(lib)}
    return env


@contextlib.contextmanager
def _deadline(seconds: float, cmd: list[str]) -> Iterator[None]:
    """``subprocess.TimeoutExpired`` raised into the call after ``seconds`` (a hang is a failure,
    not a stuck test run): SIGALRM, so only from the main thread, as pytest runs tests."""

    def expired(signum: int, frame: object) -> None:
        raise subprocess.TimeoutExpired(cmd, seconds)

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def hwprofile(
    args: Sequence[str],
    env: Mapping[str, str],
    stdin: bytes | None = None,
    cwd: str | Path | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """What ``subprocess.run([python, -m, hwprofile, *args], env=env, input=stdin, cwd=cwd,
    capture_output=True, text=True, timeout=timeout)`` returns, from one call of ``main`` here."""
    from hwprofile.cli import main

    cmd = [sys.executable, "-m", "hwprofile", *args]
    env = _as_loaded(env)
    out, err = io.StringIO(), io.StringIO()
    fake_in = io.TextIOWrapper(io.BytesIO(stdin or b""), encoding="utf-8")
    here = os.getcwd()
    with (
        _environment(env),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        _deadline(timeout, cmd),
    ):
        old_in, sys.stdin = sys.stdin, fake_in
        try:
            if cwd is not None:
                os.chdir(cwd)
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's own refusals
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            sys.stdin = old_in
            os.chdir(here)
    return subprocess.CompletedProcess(cmd, code, out.getvalue(), err.getvalue())
