"""``hwprofile install-service`` and the unit it writes: this installation's ExecStart, Type=notify with
a watchdog and ExecReload, a stop that drains before anything is killed, hardening scored by
``systemd-analyze security --offline=true`` (≤ 3.0) and ``systemd-analyze verify`` with empty stderr,
the tmpfiles.d entry applied by ``systemd-tmpfiles``, and systemd/ in the repository kept in step."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from system import analyze_verify, need

from hwprofile.daemon.service import hwprofile_command, render_tmpfiles, render_unit, shutdown_of
from hwprofile.render.output import systemd_quote

ROOT = Path(__file__).resolve().parent.parent


def keys(unit: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def install(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwprofile", "install-service", *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )


def test_install_service_writes_this_installations_unit(tmp_path) -> None:
    model = tmp_path / "my model"
    r = install(
        tmp_path,
        "--prefix",
        str(tmp_path / "out"),
        "--",
        "--model",
        str(model),
        "--set",
        "server.shutdown_timeout=60",
    )
    assert r.returncode == 0, r.stderr
    unit = (tmp_path / "out" / "hwprofile.service").read_text()
    k = keys(unit)
    exe = Path(sys.executable).parent / "hwprofile"
    assert k["ExecStart"] == [f'{exe} daemon --model "{model}" --set server.shutdown_timeout=60']
    assert k["Type"] == ["notify"] and k["NotifyAccess"] == ["main"]
    # hwprofile's own reload: `systemctl reload` fails when the configuration is invalid
    assert k["ExecReload"] == [f"{exe} reload --runtime-dir %t/hwprofile"]
    assert k["StateDirectory"] == ["hwprofile"] and k["RuntimeDirectoryPreserve"] == ["restart"]
    assert k["Environment"][:2] == ["HWPROFILE_RUNTIME_DIR=%t/hwprofile", "HWPROFILE_STATE_DIR=%S/hwprofile"]
    assert "HF_HOME=%C/hwprofile/huggingface" in k["Environment"]  # a dynamic user has no home
    assert k["Restart"] == ["on-failure"] and k["KillMode"] == ["mixed"]
    assert int(k["TimeoutStopSec"][0]) == 60 + 10 + 30  # drain + the supervisor's SIGKILL margin + slack
    assert int(k["WatchdogSec"][0]) >= 10
    assert k["DynamicUser"] == ["yes"] and k["WantedBy"] == ["multi-user.target"]
    assert "DeviceAllow=char-nvidia* rw" in unit and "DevicePolicy=closed" in unit
    assert "wrote " + str(tmp_path / "out" / "hwprofile.service") in r.stdout
    assert "systemd not reloaded: --prefix" in r.stdout
    tmpfiles = (tmp_path / "out" / "tmpfiles.d" / "hwprofile.conf").read_text()
    assert "d /etc/hwprofile/overrides.d 0755" in tmpfiles


def test_user_unit_and_daemon_reload_without_a_manager(tmp_path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "XDG_RUNTIME_DIR": str(tmp_path / "nonexistent-run"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    r = install(tmp_path, "--user", "--", "--model", "/srv/m", env=env)
    assert r.returncode == 0, r.stderr
    unit = (tmp_path / "cfg" / "systemd" / "user" / "hwprofile.service").read_text()
    k = keys(unit)
    assert "DynamicUser" not in k and "User" not in k and k["WantedBy"] == ["default.target"]
    # the user's own HOME and Hugging Face cache (a model that plans in the shell is found), and the
    # config root the tmpfiles entry creates is the one the unit watches ($XDG_CONFIG_HOME's)
    assert not [v for v in k["Environment"] if v.startswith(("HOME=", "HF_HOME=", "XDG_CACHE_HOME="))]
    assert f"HWPROFILE_CONFIG_ROOT={tmp_path / 'cfg' / 'hwprofile'}" in k["Environment"]
    tmpfiles = (tmp_path / "cfg" / "user-tmpfiles.d" / "hwprofile.conf").read_text()
    assert f"d {tmp_path / 'cfg' / 'hwprofile'}/overrides.d 0755" in tmpfiles
    # and it exists at once: the unit's HWPROFILE_CONFIG_ROOT, before any login runs tmpfiles.d
    for d in ("", "profiles", "overrides.d", "rules.d"):
        assert (tmp_path / "cfg" / "hwprofile" / d).is_dir()
    assert f"made {tmp_path / 'cfg' / 'hwprofile' / 'overrides.d'}" in r.stdout
    assert re.search(
        r"systemd not reloaded: (systemctl is not installed|the manager is not available)", r.stdout
    ), r.stdout


def test_quoting_and_shutdown_parsing() -> None:
    assert systemd_quote("/srv/models/x") == "/srv/models/x"
    assert systemd_quote("a b") == '"a b"'
    assert systemd_quote("50%") == '"50%%"'
    assert systemd_quote("$HOME") == '"$$HOME"'
    assert systemd_quote('say "hi"') == '"say \\"hi\\""'
    assert shutdown_of(["--set=server.shutdown_timeout=5"]) == 5
    assert shutdown_of(["--model", "x"]) == 10
    assert hwprofile_command()[0].startswith(str(Path(sys.executable).parent))


def test_a_newline_in_a_daemon_argument_cannot_add_a_unit_line() -> None:
    """One quoting function for every ExecStart= (render/output.py): a daemon argument with a newline
    stays one word of the one ExecStart= line (the old copy in service.py wrote the newline as it is,
    so the unit got an ExecStartPre= of the argument's choosing)."""
    unit = render_unit(["--model", "x\nExecStartPre=/bin/true", "--set", "a=b\rc"], command=("/opt/hw",))
    lines = unit.splitlines()
    assert not [ln for ln in lines if ln.startswith("ExecStartPre")], unit
    (start,) = [ln for ln in lines if ln.startswith("ExecStart=")]
    assert '"x\\nExecStartPre=/bin/true"' in start and '"a=b\\rc"' in start


def test_the_repository_copy_is_the_rendered_example() -> None:
    """systemd/hwprofile.service is render_unit's text for an example installation."""
    origin = " (this copy: an example; run it for one with this installation's ExecStart)"
    example = render_unit(
        ("--model", "/srv/models/model"), command=("/opt/hwprofile/.venv/bin/hwprofile",), origin=origin
    )
    assert (ROOT / "systemd" / "hwprofile.service").read_text() == example
    assert (ROOT / "systemd" / "hwprofile.tmpfiles.conf").read_text() == render_tmpfiles()


@pytest.mark.parametrize("user", [False, True])
def test_unit_passes_verify_and_security(tmp_path, user) -> None:
    unit = tmp_path / "hwprofile.service"
    unit.write_text(render_unit(["--model", str(tmp_path)], user=user))
    v = analyze_verify(unit)
    assert v.returncode == 0 and v.stderr == "", v.stderr
    sec = subprocess.run(
        [need("systemd-analyze"), "security", "--offline=true", str(unit)], capture_output=True, text=True
    )
    m = re.search(r"Overall exposure level for .*: ([\d.]+)", sec.stdout)
    assert m and float(m.group(1)) <= 3.0, sec.stdout[-3000:]


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("Type=notify", "Type=bogus"),
        ("KillMode=mixed", "KillMode=sometimes"),
        ("WatchdogSec=30", "WatchdogSecs=30"),
    ],
)
def test_verify_still_fails_on_a_real_unit_error(tmp_path, line, said) -> None:
    """Without the man-page look-up, verify still reports what is wrong with the unit itself."""
    unit = tmp_path / "hwprofile.service"
    text = render_unit(["--model", str(tmp_path)])
    assert line in text
    unit.write_text(text.replace(line, said))
    v = analyze_verify(unit)
    (word,) = {k for k in said.split("=") if k not in line}  # the bad value, or the unknown key
    assert f"{unit}:" in v.stderr and word in v.stderr, v.stderr


def test_tmpfiles_entry_creates_the_watched_config_root(tmp_path) -> None:
    conf = tmp_path / "hwprofile.conf"
    conf.write_text(render_tmpfiles())
    r = subprocess.run(
        [need("systemd-tmpfiles"), "--create", f"--root={tmp_path / 'root'}", str(conf)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    for d in ("profiles", "overrides.d", "rules.d"):
        assert (tmp_path / "root" / "etc" / "hwprofile" / d).is_dir()


def test_reload_without_a_daemon_says_so(tmp_path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "hwprofile", "reload", "--runtime-dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and f"no daemon runs with runtime directory {tmp_path}" in r.stderr
    from hwprofile.runtime.processes import start_time

    def state(pid: int, start: int | None) -> None:
        (tmp_path / "state.json").write_text(
            json.dumps(
                {
                    "schema": "hwprofile.state/1",
                    "supervisor_pid": pid,
                    "supervisor": {"pid": pid, "start_time": start},
                    "instances": [],
                }
            )
        )

    def reload() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hwprofile", "reload", "--runtime-dir", str(tmp_path)],
            capture_output=True,
            text=True,
        )

    state(os.getpid(), 1)  # a PID whose start time is not the recorded one: never signalled
    r = reload()
    assert r.returncode == 1 and "not signalled" in r.stderr, r.stderr
    state(os.getpid(), start_time(os.getpid()))  # alive, but no daemon.json names it: a `launch`, no SIGHUP
    r = reload()
    assert r.returncode == 1 and "not a daemon" in r.stderr, r.stderr


def _install(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc"), **(env or {})}
    (tmp_path / "etc").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "hwprofile", "install-service", "--prefix", str(tmp_path / "out"), *args],
        env=e,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["--run-as", "vllm\nExecStartPre=+/bin/sh -c id"], "--run-as"),
        (["--run-as", "a;b$c"], "not a user name"),
        (["--", "--model", "x\nExecStartPre=/bin/true"], "control characters"),
        (["--", "--modle", "X"], "would not start: hwprofile: error: unrecognized arguments: --modle X"),
        (["--stop-timeout", "-5"], "more than the planned drain (20 s"),
        (["--stop-timeout", "0"], "more than the planned drain"),
        (["--stop-timeout", "1"], "more than the planned drain"),
        (["--stop-timeout", "100000"], "at most 86400"),
    ],
    ids=["run-as-newline", "run-as-shell", "arg-newline", "typo", "negative", "zero", "one", "huge"],
)
def test_install_service_refuses_what_would_make_a_bad_unit(
    tmp_path: Path, args: list[str], says: str
) -> None:
    r = _install(tmp_path, *args)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()  # nothing written


def test_install_service_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("theirs\n")
    (out / "hwprofile.service").symlink_to(victim)
    r = _install(tmp_path, "--", "--model", "/srv/m")
    assert r.returncode == 1 and "symbolic link" in r.stderr, r.stderr
    assert victim.read_text() == "theirs\n"


def test_the_stop_timeout_covers_a_drain_set_in_overrides_d(tmp_path: Path) -> None:
    (tmp_path / "etc" / "overrides.d").mkdir(parents=True)
    (tmp_path / "etc" / "overrides.d" / "10-drain.yaml").write_text("server:\n  shutdown_timeout: 60\n")
    r = _install(tmp_path, "--", "--model", "/srv/m")
    assert r.returncode == 0, r.stderr
    unit = (tmp_path / "out" / "hwprofile.service").read_text()
    assert "TimeoutStopSec=100\n" in unit  # 60 + stop margin 10 + 30; the old unit said 50 and was killed
