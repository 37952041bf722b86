"""nginx in front of a plan's separate servers, for a command that measures the plan's one URL
(``bench``): Debian's nginx, as this user, with the ``conf.d`` file ``render --format nginx`` writes
(the same text) under a private prefix; started once the servers are ready, stopped gracefully
(SIGQUIT) before them. The service's own nginx is the operator's (docs/planning.md); this one lives
as long as the measurement."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import OperationError
from ..plan.types import Plan
from ..render.output import render_nginx
from ..runtime.dirs import private_dir
from ..runtime.files import atomic_write
from ..telemetry import http

log = logging.getLogger("hwprofile")
SAFE_PATH = re.compile(r"/[A-Za-z0-9._/+-]*")  # what nginx.conf takes unquoted
KNOWN_PATHS = ("/usr/sbin/nginx",)  # Debian's, often not on a user's PATH


class FrontError(OperationError):
    """nginx would not start in front of the servers (its own words included)."""


def nginx_binary() -> str | None:
    found = shutil.which("nginx")
    return found or next((p for p in KNOWN_PATHS if Path(p).is_file()), None)


def main_conf(prefix: Path) -> str:
    """The top-level nginx.conf around the rendered ``conf.d`` file: no daemon, one worker, every
    file nginx writes under ``prefix``."""
    d = str(prefix)
    if not SAFE_PATH.fullmatch(d):
        raise FrontError(f"{d!r}: not a path nginx.conf can hold unquoted; use a plain runtime directory")
    temp = " ".join(f"{k}_temp_path {d}/tmp;" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return (
        f"daemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\nworker_processes 1;\n"
        f"events {{ worker_connections 512; }}\n"
        f"http {{\n    access_log off;\n    {temp}\n    include {d}/conf.d/hwprofile.conf;\n}}\n"
    )


@contextlib.contextmanager
def nginx_front(plan: Plan, prefix: Path, timeout: float = 30.0) -> Iterator[str]:
    """nginx serving ``plan``'s one URL (its endpoint) while the block runs; yields that URL."""
    if plan.endpoint is None:
        raise FrontError("this plan names no URL for clients")
    nginx = nginx_binary()
    if nginx is None:
        raise FrontError("nginx is not installed (apt-get install nginx): the servers' one URL needs it")
    d = private_dir(prefix)
    private_dir(d / "conf.d")
    private_dir(d / "tmp")
    atomic_write(d / "conf.d" / "hwprofile.conf", render_nginx(plan), 0o600, durable=False)
    atomic_write(d / "nginx.conf", main_conf(d), 0o600, durable=False)
    argv = [nginx, "-p", str(d), "-c", str(d / "nginx.conf")]
    check = subprocess.run([*argv, "-t", "-q"], capture_output=True, text=True, timeout=30)
    if check.returncode:
        raise FrontError(f"nginx -t refused the configuration: {check.stderr.strip()[-500:]}")
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        end = time.monotonic() + timeout
        while not http.healthy(plan.endpoint.url):
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise FrontError(f"nginx exited ({proc.returncode}): {err.strip()[-500:]}")
            if time.monotonic() > end:
                raise FrontError(f"{plan.endpoint.url}: no answer through nginx after {timeout:.0f} s")
            time.sleep(0.2)
        log.info(
            "nginx (pid %d) serves %s in front of %s",
            proc.pid,
            plan.endpoint.url,
            ", ".join(plan.endpoint.instances),
        )
        yield plan.endpoint.url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGQUIT)  # graceful: the requests in flight finish
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # not reaped yet: the group is still nginx's
                proc.wait(5)
        if proc.stderr:
            proc.stderr.close()
