"""The unit under a real systemd user manager (the recipe in the project's host facts): in a private
mount namespace with a tmpfs on /run/systemd, ``systemd --user`` runs with HOME, XDG_RUNTIME_DIR and
XDG_CONFIG_HOME in a temp dir. ``hwprofile install-service --user`` writes the unit there, a drop-in
points it at the fake host and the fake vLLM, then: ``systemctl --user start`` returns (Type=notify)
only once both instances answer /health; ``reload`` goes through ExecReload (SIGHUP); ``stop``
drains and leaves no process behind. Skipped, with the reason, where the kernel refuses the
namespace or the manager does not come up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from system import need
from test_daemon_fast import FAKE, daemon_env, starts_of  # noqa: F401 (fixture)
from waiting import wait_for

SYSTEMD = "/lib/systemd/systemd"
pytestmark = pytest.mark.slow(minutes=0.5)  # a real systemd manager: what only the real thing can show


@pytest.fixture(autouse=True)
def _systemd_installed() -> None:
    """The README's test command needs systemd (.ci/packages): missing, the test fails naming it."""
    need("systemctl")  # the systemd package: the manager binary (SYSTEMD) comes with it


def _health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def user_manager():
    base = Path(f"/tmp/hwsd-{os.getpid()}-{time.monotonic_ns() % 10**6}")  # short: socket paths
    run, cfg = base / "run", base / "cfg"
    run.mkdir(parents=True, mode=0o700)
    cfg.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(base),
        "XDG_RUNTIME_DIR": str(run),
        "XDG_CONFIG_HOME": str(cfg),
    }
    script = (
        "mkdir -p /run/systemd && mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system"
        f" && exec {SYSTEMD} --user"
    )
    log = (base / "manager.log").open("w")
    mgr = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    end = time.monotonic() + 20
    while time.monotonic() < end and mgr.poll() is None and not (run / "systemd" / "private").exists():
        time.sleep(0.1)
    if not (run / "systemd" / "private").exists():
        mgr.kill()
        mgr.wait(10)
        log.close()
        why = (base / "manager.log").read_text()[-500:]
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(
            f"no user manager here (the kernel refused the mount namespace or systemd --user failed): {why}"
        )

    def ctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["systemctl", "--user", *args], env=env, capture_output=True, text=True, timeout=timeout
        )

    yield env, ctl, base
    ctl("stop", "hwprofile.service", timeout=120)
    ctl("exit")
    try:
        mgr.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(mgr.pid, signal.SIGKILL)
        mgr.wait(10)
    log.close()
    shutil.rmtree(base, ignore_errors=True)


def test_user_manager_starts_reloads_and_stops_the_daemon(daemon_env, user_manager, tmp_path) -> None:  # noqa: F811
    e = daemon_env
    env, ctl, _base = user_manager
    e["env"]["FAKEVLLM_READY_DELAY"] = "2"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hwprofile",
            "install-service",
            "--user",
            "--",
            "--model",
            str(e["model"]),
            *["--set=" + s for s in e["sets"]],
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "ran systemctl --user daemon-reload" in r.stdout, r.stdout + r.stderr
    # the test's files live under /tmp: this drop-in shares /tmp with the unit and lets it write there
    dropin = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user" / "hwprofile.service.d"
    dropin.mkdir(parents=True)
    keep = (
        "FAKE_NVML_STATE",
        "HWPROFILE_PROC_ROOT",
        "HWPROFILE_SYS_ROOT",
        "LD_LIBRARY_PATH",
        "FAKEVLLM_ARGV_LOG",
        "FAKEVLLM_READY_DELAY",
    )
    lines = [f'Environment="{k}={e["env"][k]}"' for k in keep if k in e["env"]]
    (dropin / "test.conf").write_text(
        "[Service]\nPrivateTmp=no\n"
        + f"ReadWritePaths={tmp_path} /tmp\n"
        + "\n".join(lines)
        + "\n"
        # a short watchdog and restart delay, so that a hung loop is seen within seconds
        + "WatchdogSec=4\nRestartSec=1\n"
    )
    assert ctl("daemon-reload").returncode == 0
    # hardening lines this sandbox cannot apply (a container may refuse to remount /proc/sys or
    # /proc/kmsg: exit 226/NAMESPACE) are switched off in the drop-in, each probed on its own
    refused = _refused_hardening(
        ctl, Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user", unit_lines(dropin.parent)
    )
    if refused:
        with (dropin / "test.conf").open("a") as f:
            f.write("".join(f"{line.split('=')[0]}=no\n" for line in refused))
        assert ctl("daemon-reload").returncode == 0
        print("hardening this sandbox refuses, off for this test:", refused)
    assert len(refused) <= 3, refused  # the rest of the hardening applies for real
    port = int(next(s.split("=")[1] for s in e["sets"] if s.startswith("server.port=")))
    started = time.monotonic()
    s = ctl("start", "hwprofile.service", timeout=120)  # returns once READY=1 arrived
    took = time.monotonic() - started
    journal = lambda: ctl("status", "--no-pager", "-n", "50", "hwprofile.service").stdout  # noqa: E731
    assert s.returncode == 0, s.stderr + journal()
    assert ctl("is-active", "hwprofile.service").stdout.strip() == "active"
    assert _health(port) and _health(port + 1)  # active only when every instance is ready
    assert took >= 2  # each took 2 s to load: start waited for them
    status = ctl("show", "-p", "StatusText", "-p", "MainPID", "hwprofile.service").stdout
    assert "StatusText=2/2 ready" in status, status
    main_pid = int(next(x.split("=")[1] for x in status.splitlines() if x.startswith("MainPID=")))
    children = [json.loads(x)["pid"] for x in e["starts"].read_text().splitlines()]
    assert len(children) == 2
    # reload through ExecReload (SIGHUP): nothing changed, nothing restarts, still active
    assert ctl("reload", "hwprofile.service").returncode == 0
    runtime = Path(env["XDG_RUNTIME_DIR"]) / "hwprofile"
    wait_for(
        lambda: (json.loads((runtime / "daemon.json").read_text()).get("reload") or {}).get("outcome"),
        "reloaded",
    )
    assert (
        len(starts_of(e["starts"], port)) == 1
        and ctl("is-active", "hwprofile.service").stdout.strip() == "active"
    )
    # a loop that hangs (SIGSTOP: it can neither tick nor send WATCHDOG=1) is killed by systemd's
    # watchdog and restarted (Restart=on-failure), its vLLM processes with it (KillMode=mixed)
    os.kill(main_pid, signal.SIGSTOP)

    def restarted() -> dict[str, str] | None:
        out = ctl("show", "-p", "MainPID", "-p", "NRestarts", "-p", "ActiveState", "hwprofile.service").stdout
        d = dict(x.split("=", 1) for x in out.splitlines() if "=" in x)
        moved = d.get("MainPID") not in ("0", str(main_pid))
        return d if d.get("NRestarts", "0") != "0" and d.get("ActiveState") == "active" and moved else None

    d = wait_for(restarted, "the watchdog's restart", timeout=120)
    # (a stopped process exits by nothing of its own: only the watchdog can have ended it)
    assert not Path(f"/proc/{main_pid}").exists() or "zombie" in Path(f"/proc/{main_pid}/status").read_text()
    wait_for(lambda: _health(port) and _health(port + 1), "the instances back after the restart", timeout=60)
    main_pid = int(d["MainPID"])
    children = [json.loads(x)["pid"] for x in e["starts"].read_text().splitlines()]
    assert len(children) == 4  # the first daemon's two, then the restarted daemon's two
    # stop: drains, then nothing of the unit is left
    assert ctl("stop", "hwprofile.service", timeout=120).returncode == 0
    assert ctl("is-active", "hwprofile.service").stdout.strip() == "inactive"
    for pid in (main_pid, *children):
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    left = subprocess.run(["pgrep", "-f", f"{FAKE} serve {e['model']}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""


PROBED = (
    "ProtectKernelTunables",
    "ProtectKernelLogs",
    "ProtectKernelModules",
    "ProtectControlGroups",
    "ProtectClock",
    "ProtectHostname",
    "ProtectProc",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateMounts",
)


def unit_lines(unit_dir: Path) -> list[str]:
    text = (unit_dir / "hwprofile.service").read_text()
    return [x for x in text.splitlines() if x.split("=")[0] in PROBED]


def _refused_hardening(ctl, unit_dir: Path, lines: list[str]) -> list[str]:
    """Each namespace-based hardening line of the unit, tried alone on a oneshot /bin/true unit."""
    refused = []
    probe = unit_dir / "hwprofile-probe.service"
    for line in lines:
        probe.write_text(f"[Service]\nType=oneshot\nExecStart=/bin/true\n{line}\n")
        ctl("daemon-reload")
        if ctl("start", "hwprofile-probe.service", timeout=30).returncode != 0:
            refused.append(line)
    probe.unlink()
    ctl("daemon-reload")
    return refused
