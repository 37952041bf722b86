"""``hwprofile install-service``: the systemd unit that runs ``hwprofile daemon`` (``Type=notify``),
written for this installation, plus a tmpfiles.d entry for the watched config root.

The unit text lives here (an installed wheel has no ``systemd/`` folder); ``systemd/hwprofile.service``
in the repository is this text rendered with the defaults, and a test keeps the two the same. Why each
line is there, and each hardening line left out, is said in the unit's comments.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config.settings import Server
from ..errors import OperationError
from ..render.output import systemd_quote
from ..runtime.files import atomic_write
from ..runtime.processes import module_command

UNIT_NAME = "hwprofile.service"
TMPFILES_NAME = "hwprofile.conf"
STOP_MARGIN_S = 10  # the supervisor's SIGKILL margin beyond server.shutdown_timeout
STOP_SLACK_S = 30  # beyond that: the group's teardown (up to 10 s), the daemon's own exit, last.json
DEFAULT_SHUTDOWN_S: int = Server().shutdown_timeout  # server.shutdown_timeout's declared default

UNIT = """\
# hwprofile daemon: launches every vLLM instance planned for this host, watches the GPUs and vLLM,
# degrades and recovers by policy. Written by `hwprofile install-service`{origin}.
[Unit]
Description=hwprofile: vLLM instances planned for this host, watched and kept within policy
Documentation=man:systemd.service(5) https://www.freedesktop.org/software/systemd/man/latest/sd_notify.html
After=network-online.target
Wants=network-online.target

[Service]
# READY=1 only once every planned instance answers /health; STATUS= is kept current;
# RELOADING=1 ... READY=1 around a reload; STOPPING=1 on stop; WATCHDOG=1 after each loop tick.
Type=notify
NotifyAccess=main
ExecStart={exec_start}
# `hwprofile reload`: SIGHUP to the daemon (re-plan from the same inputs; only changed instances
# restart, one at a time), then its answer: `systemctl reload` fails when the configuration is invalid
# (the last good plan keeps running).
ExecReload={exec_reload}
WatchdogSec=30
Restart=on-failure
RestartSec=10
# a model load can take many minutes (supervise.ready_timeout is 900 s by default)
TimeoutStartSec=1200
# SIGTERM to the daemon only: it drains every instance (server.shutdown_timeout = {shutdown}s, then
# SIGKILL to each process group {margin}s later, and waits until it is torn down); whatever is left
# of the unit is SIGKILLed after
# TimeoutStopSec = {shutdown} + {margin} + {slack} s, so no vLLM outlives the daemon.
# Separate servers behind one URL: vLLM's router (layout.front; pip install vllm-router) is the daemon's
# child in this unit too, started once a server is ready, restarted when it exits, stopped first (its
# log: vllm-router.log beside the instances'; `hwprofile status` and hwprofile_front_* show it).
KillMode=mixed
KillSignal=SIGTERM
TimeoutStopSec={stop_timeout}
Environment=HWPROFILE_RUNTIME_DIR=%t/hwprofile
Environment=HWPROFILE_STATE_DIR=%S/hwprofile
Environment=HWPROFILE_CONFIG_ROOT={config_root}
Environment=HWPROFILE_LOGS__DIR=%t/hwprofile/logs
{home_lines}# the runtime directory outlives a restart (why the last run ended is read there), not a stop;
# the state directory keeps the last good plan, which a restart with an invalid override starts from
RuntimeDirectory=hwprofile
RuntimeDirectoryMode=0700
RuntimeDirectoryPreserve=restart
StateDirectory=hwprofile
StateDirectoryMode=0700
CacheDirectory=hwprofile
CacheDirectoryMode=0700
{user_lines}LimitNOFILE=65536
# Hardening that still lets vLLM reach its GPUs (/dev/nvidia*, /dev/nvidia-uvm, /dev/nvidia-caps/*).
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
PrivateMounts=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @obsolete @debug @mount @cpu-emulation @reboot @swap @raw-io @module
SystemCallErrorNumber=EPERM
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
CapabilityBoundingSet=
AmbientCapabilities=
UMask=0077
DevicePolicy=closed
# every /proc/devices group named nvidia* (nvidia-frontend or nvidia: /dev/nvidia[0-9]*, nvidiactl;
# nvidia-uvm; nvidia-caps; nvidia-nvswitch), matched by systemd with fnmatch
DeviceAllow=char-nvidia* rw
# Left out, and why:
# PrivateDevices=yes: a private /dev has no /dev/nvidia* (DevicePolicy=closed + DeviceAllow instead).
# MemoryDenyWriteExecute=yes: PyTorch, Triton and CUDA generate code at run time (W+X pages).
# PrivateNetwork=yes, IPAddressDeny=: vLLM serves clients and hwprofile its /metrics over the network.
# ProcSubset=pid: hwprofile reads /proc/cpuinfo and /proc/meminfo; vLLM reads /proc/meminfo.
# PrivateUsers=yes: device nodes and the model files would show up as owned by nobody.
# ProtectHome=yes: models and the Hugging Face cache often live under /home (read-only is kept).
# @resources stays allowed: NUMA binding (mbind, set_mempolicy) and CPU affinity need it.

[Install]
WantedBy={wanted_by}
"""

TMPFILES = """\
# hwprofile: the config root the daemon watches for live overrides (see hwprofile.service).
d {config_root} 0755 - - -
d {config_root}/profiles 0755 - - -
d {config_root}/overrides.d 0755 - - -
d {config_root}/rules.d 0755 - - -
"""


@dataclass(frozen=True)
class Paths:
    unit_dir: Path
    tmpfiles_dir: Path


def hwprofile_command() -> list[str]:
    """This installation's ``hwprofile``: the console script next to ``sys.executable`` (a venv's
    ``bin/``, symlinks not resolved), else ``python -P -m hwprofile``."""
    script = Path(sys.executable).parent / "hwprofile"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return module_command()


def shutdown_of(daemon_args: Sequence[str]) -> int:
    """server.shutdown_timeout from ``--set`` in the daemon's arguments (else its default)."""
    value = None
    args = list(daemon_args)
    for i, a in enumerate(args):
        if a.startswith("--set="):
            a = a[6:]
        elif a == "--set" and i + 1 < len(args):
            a = args[i + 1]
        if a.startswith("server.shutdown_timeout="):
            value = a.split("=", 1)[1]
    try:
        return int(value) if value is not None else DEFAULT_SHUTDOWN_S
    except ValueError:
        return DEFAULT_SHUTDOWN_S


def render_unit(
    daemon_args: Sequence[str] = (),
    user: bool = False,
    command: Sequence[str] | None = None,
    stop_timeout: int | None = None,
    run_as: str | None = None,
    origin: str = "",
    drain: tuple[float, float] | None = None,
) -> str:
    """The unit; ``drain``, the resolved ``(server.shutdown_timeout, supervise.stop_margin)``, sets
    TimeoutStopSec, else the shutdown timeout on the daemon's ``--set`` and the default margin. The
    daemon also asks systemd for the time its running plan's drain needs when it stops
    (EXTEND_TIMEOUT_USEC): an override changed after the unit was written is covered too."""
    shutdown, margin = drain if drain is not None else (shutdown_of(daemon_args), STOP_MARGIN_S)
    shutdown, margin = int(-(-shutdown // 1)), int(-(-margin // 1))
    command = list(command or hwprofile_command())
    argv = [*command, "daemon", *daemon_args]
    reload = [*command, "reload", "--runtime-dir", "%t/hwprofile"]
    if user:
        user_lines = ""  # a user manager runs it as that user
    elif run_as:
        user_lines = f"User={run_as}\n"
    else:
        user_lines = "DynamicUser=yes\n"
    return UNIT.format(
        origin=origin,
        exec_start=" ".join(systemd_quote(a, "an argument of the daemon") for a in argv),
        # the specifier stays a specifier: systemd expands %t itself
        exec_reload=" ".join(
            a if a == "%t/hwprofile" else systemd_quote(a, "the reload command") for a in reload
        ),
        shutdown=shutdown,
        margin=margin,
        slack=STOP_SLACK_S,
        stop_timeout=stop_timeout if stop_timeout is not None else shutdown + margin + STOP_SLACK_S,
        # the system manager: /etc/hwprofile; a user's: the config home resolved here, where the
        # tmpfiles entry (which has no %E) creates it too
        config_root=str(user_config_root()) if user else "%E/hwprofile",
        # a system unit runs as a dynamic user without a home: caches go to its cache directory; a
        # user unit keeps the user's HOME and Hugging Face cache, so a model that plans in the shell
        # is found under the unit too
        home_lines=""
        if user
        else (
            "Environment=HOME=%C/hwprofile\nEnvironment=XDG_CACHE_HOME=%C/hwprofile\n"
            "Environment=HF_HOME=%C/hwprofile/huggingface\n"
        ),
        user_lines=user_lines,
        wanted_by="default.target" if user else "multi-user.target",
    )


def user_config_root() -> Path:
    """``$XDG_CONFIG_HOME/hwprofile`` (default ``~/.config/hwprofile``) of the user installing."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "hwprofile"


def render_tmpfiles(user: bool = False) -> str:
    # the same directory the unit's HWPROFILE_CONFIG_ROOT names (tmpfiles.d has no %E)
    return TMPFILES.format(config_root=str(user_config_root()) if user else "/etc/hwprofile")


def default_paths(user: bool) -> Paths:
    if user:
        config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        return Paths(config / "systemd" / "user", config / "user-tmpfiles.d")
    return Paths(Path("/etc/systemd/system"), Path("/etc/tmpfiles.d"))


def install(
    daemon_args: Sequence[str] = (),
    prefix: str | None = None,
    user: bool = False,
    stop_timeout: int | None = None,
    run_as: str | None = None,
    drain: tuple[float, float] | None = None,
) -> list[str]:
    """Write the unit and the tmpfiles entry, then ``systemctl [--user] daemon-reload``; returns
    what was done, one line each. With ``prefix`` both go into that directory (the unit as
    ``PREFIX/hwprofile.service``, the entry as ``PREFIX/tmpfiles.d/hwprofile.conf``) and systemd is
    not reloaded (the files are outside its search path)."""
    paths = Paths(Path(prefix), Path(prefix) / "tmpfiles.d") if prefix else default_paths(user)
    done: list[str] = []
    unit = render_unit(daemon_args, user, stop_timeout=stop_timeout, run_as=run_as, drain=drain)
    paths.unit_dir.mkdir(parents=True, exist_ok=True)
    target = paths.unit_dir / UNIT_NAME
    atomic_write(target, unit, 0o644)  # never through a link planted where the unit goes
    done.append(f"wrote {target}")
    paths.tmpfiles_dir.mkdir(parents=True, exist_ok=True)
    tmp = paths.tmpfiles_dir / TMPFILES_NAME
    atomic_write(tmp, render_tmpfiles(user), 0o644)
    done.append(f"wrote {tmp}")
    if user and not prefix:  # the unit's HWPROFILE_CONFIG_ROOT exists at once (tmpfiles.d runs at login)
        done.extend(make_config_root(user_config_root()))
    scope = ["--user"] if user else []
    if prefix:
        done.append("systemd not reloaded: --prefix writes outside systemd's search path")
    else:
        done.append(daemon_reload(scope))
    how = "systemctl --user" if user else "systemctl"
    done.append(
        f"next: {how} enable --now hwprofile.service; {how} reload hwprofile.service after editing "
        "the configuration (or let the daemon pick up edits itself)"
    )
    return done


def make_config_root(root: Path) -> list[str]:
    """The configuration root and its three directories, made where missing (0755, never through a link:
    an existing one that is not a directory is an error naming it); what was made, one line each."""
    from ..runtime.files import WriteError

    done = []
    for d in (root, root / "profiles", root / "overrides.d", root / "rules.d"):
        if os.path.islink(d) or (os.path.lexists(d) and not os.path.isdir(d)):
            raise WriteError(
                f"{d}: exists and is not a directory (HWPROFILE_CONFIG_ROOT of the unit): not used"
            )
        if not d.exists():
            d.mkdir(mode=0o755, parents=True)
            done.append(f"made {d}")
    return done


def daemon_reload(scope: list[str]) -> str:
    exe = shutil.which("systemctl")
    if exe is None:
        return "systemd not reloaded: systemctl is not installed"
    try:
        r = subprocess.run([exe, *scope, "daemon-reload"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"systemd not reloaded: {e}"
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip().splitlines()
        return (
            "systemd not reloaded: the manager is not available ("
            + (why[-1] if why else f"exit {r.returncode}")
            + ")"
        )
    return f"ran systemctl {' '.join([*scope, 'daemon-reload'])}"


class ReloadError(OperationError):
    pass


def signal_reload(runtime: Path, wait_s: float = 30.0) -> list[str]:
    """``hwprofile reload``: SIGHUP to the daemon recorded in the runtime directory, after checking
    its PID still has the recorded start time (like ``hwprofile stop``) and that the supervisor
    there is a daemon (``daemon.json`` names the same PID: a plain ``hwprofile launch`` would die
    of SIGHUP). Then wait up to ``wait_s`` for the daemon to say how the reload went. Both files are
    read by :func:`hwprofile.supervise.runfiles.read_doc` (nothing planted is trusted)."""
    import signal
    import time

    from ..runtime.processes import ALIVE, check, signal_process
    from ..supervise.runfiles import DAEMON_FILE, STATE_FILE, DaemonDoc, SupervisorDoc, read_doc

    state = read_doc(runtime / STATE_FILE, SupervisorDoc)
    if state is None:
        raise ReloadError(f"no daemon runs with runtime directory {runtime}")
    ident = state.supervisor
    verdict = check(ident)
    if verdict != ALIVE:
        raise ReloadError(
            f"stale state file: supervisor pid {state.supervisor_pid}: {verdict}; not signalled"
        )

    def reload_of() -> tuple[int | None, dict]:
        doc = read_doc(runtime / DAEMON_FILE, DaemonDoc)
        if doc is None:
            return None, {}
        rel = doc.body.get("reload")
        return doc.pid, rel if isinstance(rel, dict) else {}

    pid, before = reload_of()
    if pid != ident.pid:
        raise ReloadError(
            f"pid {ident.pid} is a `hwprofile launch` supervisor, not a daemon: it has no reload"
        )
    last = before.get("at")
    if not signal_process(ident, signal.SIGHUP):
        raise ReloadError(f"pid {ident.pid}: SIGHUP not delivered")
    done = [f"daemon {ident.pid}: reload requested (SIGHUP)"]
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        _, rel = reload_of()
        if rel.get("at") and rel.get("at") != last:
            if rel.get("outcome") != "applied":
                raise ReloadError(f"reload failed, the last good plan is kept: {rel.get('detail')}")
            done.append(f"reloaded: {rel.get('detail')}")
            return done
        time.sleep(0.1)
    done.append(f"no answer from the daemon in {wait_s:.0f} s (see hwprofile status)")
    return done
