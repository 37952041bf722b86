"""One vLLM process as the operating system sees it: the argv that ties it to our life, a TMPDIR
short enough for its IPC sockets, whether its port is free, whether it has exited (without reaping
it), and the graceful stop of its process group.

Side effects: processes, signals, directories. The instance life cycle around these is
:class:`.instance.Instance`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime.processes import TEARDOWN_S, identify, wait_group_gone
from .logs import private_dir

if TYPE_CHECKING:
    from ..render.translate import Rendered

log = logging.getLogger("hwprofile")

# vLLM runs through tether.py (see there): SIGTERM from the kernel when its parent dies, and a keeper
# that SIGKILLs its process group once the drain is over when this process is gone. The keeper learns
# that from the end of file of a pipe whose write end only this process holds (non-inheritable, so
# no other child keeps it open); one pipe for the life of the process, created at the first spawn.
# A script run by path in a bare interpreter rather than preexec_fn: Python code between fork and
# exec in a threaded parent can deadlock on a lock another thread held at fork time.
TETHER = Path(__file__).with_name("tether.py")
_life: tuple[int, int, int] | None = None  # (the process that made it, read end, write end)
_life_lock = threading.Lock()


def _life_pipe() -> tuple[int, int]:
    """This process's life pipe (read end, write end); a forked child makes its own."""
    global _life
    with _life_lock:
        if _life is None or _life[0] != os.getpid():
            _life = (os.getpid(), *os.pipe())
        return _life[1], _life[2]


def die_with_parent(argv: list[str], grace: float) -> tuple[list[str], int]:
    """``argv`` run through :mod:`.tether`: SIGTERM when this process dies, and its whole process
    group SIGKILLed ``grace`` seconds later; and the fd the child must inherit (``pass_fds``)."""
    life, _ = _life_pipe()
    tether = [sys.executable, "-I", "-S", str(TETHER), str(os.getpid()), str(life), f"{grace:g}", "--"]
    return [*tether, *argv], life


def spawn(r: Rendered, tmp: Path, cache: Path, name: str, grace: float) -> subprocess.Popen[bytes]:
    """Start ``r`` (an instance rendered for this release) in its own session and process group,
    tied to our life (:func:`die_with_parent`: its group is SIGKILLed ``grace`` seconds after this
    process dies, however it dies), in ``tmp`` with private caches under ``cache``, its
    output on one pipe; the API key, when ``server.api_key_env`` names one, from our environment.
    Not reaped here: the caller ends it with :func:`end_group`."""
    env = {**os.environ, **r.env}
    env.update(
        TMPDIR=str(tmp),
        VLLM_CACHE_ROOT=str(cache / "vllm"),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        XDG_CACHE_HOME=str(cache),
        PYTHONUNBUFFERED="1",
    )
    for target, source in r.secrets.items():
        if source in os.environ:
            env[target] = os.environ[source]
        else:
            log.warning("%s: $%s (server.api_key_env) is not set: serving without an API key", name, source)
    argv, life = die_with_parent(r.argv, grace)
    return subprocess.Popen(
        argv,
        pass_fds=(life,),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=str(tmp),
        start_new_session=True,  # its own session and process group: we signal the whole group
    )


# vLLM puts ZMQ IPC sockets in TMPDIR ("<dir>/<uuid4>"): a Unix socket path holds at most 107 bytes.
MAX_TMPDIR = 107 - 1 - 36 - 8


def short_tmpdir(preferred: Path) -> Path | None:
    """``preferred`` (made private) when its path is short enough for vLLM's IPC sockets, else None
    (:func:`own_tmpdir` makes one in /tmp when a process is about to start)."""
    return private_dir(preferred) if len(str(preferred)) <= MAX_TMPDIR else None


def own_tmpdir(name: str, why: str) -> Path:
    """A new private directory in /tmp (0700, made by ``mkdtemp``: never one that was there)."""
    import tempfile

    made = Path(tempfile.mkdtemp(prefix=f"hwp-{name[:20]}-", dir="/tmp"))
    log.info("%s: %s; using %s", name, why, made)
    return made


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (with SO_REUSEADDR, as uvicorn does, so a
    socket of a previous run in TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the child has exited, without reaping it (WNOWAIT): a zombie keeps its PID, so its
    process group number cannot go to anyone else before :func:`end_group` has signalled it."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def end_group(proc: subprocess.Popen[bytes], grace: float, name: str) -> None:
    """Graceful stop: SIGTERM to vLLM's API server (the group leader) only, so vLLM shuts its
    engine and workers down in order and drains requests (--shutdown-timeout); after ``grace``
    seconds, or once the leader is gone and its children had up to 5 s to follow, SIGKILL whatever
    is left of the process group, and wait (up to :data:`TEARDOWN_S`) until the kernel has torn it
    down, so that a restart finds the port and the memory free. The leader is reaped last, so every
    signal here reaches our own processes. ``name`` is the instance's, for the log."""
    if proc.returncode is None:
        leader = identify(proc.pid)  # not reaped yet: the number is still this process's
        if not exited(proc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            end = time.monotonic() + grace
            while not exited(proc) and time.monotonic() < end:
                time.sleep(0.1)
            if not exited(proc):
                log.warning(
                    "%s: still running %.0f s after SIGTERM: SIGKILL to its process group",
                    name,
                    grace,
                )
        if leader is not None and exited(proc):
            wait_group_gone(leader, min(5.0, grace))  # vLLM's children leave on their own
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the leader is alive or a zombie: the group is ours
        if leader is not None and (left := wait_group_gone(leader)):
            log.warning(
                "%s: %d processes of its group outlived SIGKILL by %.0f s: %s",
                name,
                len(left),
                TEARDOWN_S,
                [m.pid for m in left],
            )
    proc.wait()
