"""The journal fields the README promises, checked against a real journald: in a private mount
namespace with tmpfs on /run/systemd and /run/log, ``systemd-journald`` runs with its own sockets;
``hwprofile daemon`` runs with its stderr on journald's stream socket (``JOURNAL_STREAM`` set, as
systemd sets it for a unit), the fake NVML and the fake vLLM; a card heats, its instance degrades, and
``journalctl -o json`` must show the records with ``GPU=``, ``INSTANCE=``, ``ACTION=`` and their
priorities. A record whose native send fails falls back to the stream with its priority (``<N>``).
Skipped, with the reason, where the kernel refuses the namespace or journald does not come up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from system import need
from test_daemon_fast import daemon_doc, daemon_env  # noqa: F401 (fixture)
from waiting import wait_for

JOURNALD = "/lib/systemd/systemd-journald"

# stderr (and stdout) on journald's stream socket, as systemd gives a unit's; then exec the command
ON_STREAM = r"""
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("/run/systemd/journal/stdout")
# identifier, unit id, priority, level prefix, forward to syslog, kmsg, console (sd-journal's stream header)
s.sendall(b"hwprofile\n\n6\n1\n0\n0\n0\n")
os.dup2(s.fileno(), 1)
os.dup2(s.fileno(), 2)
st = os.fstat(2)
os.environ["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
os.execvp(sys.argv[1], sys.argv[1:])
"""

# one record through the journal handler whose native socket is missing: its fallback is the stream
FALLBACK = r"""
import logging
from hwprofile.daemon.journal import JournalHandler
log = logging.getLogger("fallback-test")
log.addHandler(JournalHandler("/nonexistent/socket"))
log.error("fallback: an error that must stay an error", extra={"INSTANCE": "x"})
log.warning("fallback: a warning")
"""

SCRIPT = """set -e
mount -t tmpfs tmpfs /run/systemd
mkdir -p /run/log && mount -t tmpfs tmpfs /run/log
mkdir -p /run/systemd/journal
{journald} >/dev/null 2>&1 &
echo $! > {pidfile}
for i in $(seq 300); do [ -S /run/systemd/journal/stdout ] && [ -S /run/systemd/journal/socket ] && break
  sleep 0.1; done
{py} {on_stream} {py} {fallback}
exec {py} {on_stream} {py} -m hwprofile daemon {args}
"""


def journal(pid: int) -> list[dict]:
    """Every entry of the private journal (journald's mount namespace, through its PID)."""
    r = subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "journalctl", "--no-pager", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def test_journald_gets_the_fields_and_priorities(daemon_env, tmp_path) -> None:  # noqa: F811
    need("journalctl")
    need("systemctl")  # systemd-journald comes with it
    e = daemon_env
    (tmp_path / "on_stream.py").write_text(ON_STREAM)
    (tmp_path / "fallback.py").write_text(FALLBACK)
    pidfile = tmp_path / "journald.pid"
    args = " ".join(f"'--set={s}'" for s in e["sets"]) + f" --model '{e['model']}'"
    script = SCRIPT.format(
        journald=JOURNALD,
        pidfile=pidfile,
        py=sys.executable,
        args=args,
        on_stream=tmp_path / "on_stream.py",
        fallback=tmp_path / "fallback.py",
    )
    env = {**e["env"], "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    jpid = None
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and proc.poll() is None and not pidfile.exists():
            time.sleep(0.1)
        if not pidfile.exists():
            proc.kill()
            pytest.skip(f"no private journald here (namespace refused?): {(proc.stderr.read() or '')[-500:]}")
        jpid = int(pidfile.read_text())
        said = lambda: {x.get("MESSAGE") for x in journal(jpid)}  # noqa: E731
        wait_for(lambda: "every instance is ready" in said(), "every instance ready", 90)
        e["host"].set_state(**{"dev2.temperature": 84})  # past the A800 profile's hot_c (82 °C)
        wait_for(
            lambda: (d := daemon_doc(e["runtime"])).get("actions") and d["actions"][-1]["outcome"] == "done",
            "the degrade done",
            90,
        )
        entries = journal(jpid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        if jpid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(jpid, signal.SIGKILL)
    ours = [x for x in entries if x.get("SYSLOG_IDENTIFIER") == "hwprofile"]
    native = [x for x in ours if x.get("_TRANSPORT") == "journal"]
    assert native, [x.get("MESSAGE") for x in ours][:20]
    by = lambda pred: [x for x in native if pred(x)]  # noqa: E731
    hot = by(lambda x: x.get("GPU") == "2" and "-> hot" in x.get("MESSAGE", ""))
    assert hot and hot[0]["PRIORITY"] == "4", [x.get("MESSAGE") for x in native]
    acts = by(lambda x: x.get("ACTION") == "degrade" and x.get("INSTANCE") == "vllm-gpu2-3")
    said = [x["MESSAGE"].split(":")[0] for x in acts]
    assert said[:1] == ["decided"] and any(m.startswith("action") for m in said)
    assert said[-1].startswith("done")
    assert all(x["GPU"] == "2,3" and x["PRIORITY"] == "4" for x in acts)
    assert by(lambda x: x.get("MESSAGE") == "every instance is ready" and x["PRIORITY"] == "6")
    # the fallback: the stream, each line at its own priority (not all at info)
    stream = [x for x in entries if x.get("_TRANSPORT") == "stdout" and "fallback:" in x.get("MESSAGE", "")]
    prio = {x["MESSAGE"].split(":")[1].strip().split(" ")[1]: x["PRIORITY"] for x in stream}
    assert prio == {"error": "3", "warning": "4"}, stream
