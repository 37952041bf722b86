"""``hwprofile launch``, ``status`` and ``stop``: from a plan to supervised vLLM processes."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from .supervise.state import pid_alive, read_state

log = logging.getLogger("hwprofile")


class LaunchError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def setup_logging(runtime: Path, to_stderr: bool) -> None:
    runtime.mkdir(parents=True, exist_ok=True)
    os.chmod(runtime, 0o700)
    handlers: list[logging.Handler] = [logging.FileHandler(runtime / "hwprofile.log")]
    if to_stderr:
        console = logging.StreamHandler(sys.stderr)
        console.addFilter(
            lambda record: not record.name.startswith("hwprofile.vllm")
        )  # those are in the log files
        handlers.append(console)
    fmt = logging.Formatter("%(asctime)s hwprofile %(levelname)s %(message)s")
    for h in list(log.handlers):
        log.removeHandler(h)
    for h in handlers:
        h.setFormatter(fmt)
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False


def log_root(plan: dict[str, Any], tmpfs: str | None, runtime: Path) -> Path:
    configured = (plan.get("logs") or {}).get("dir")
    if configured:
        return Path(configured)
    if tmpfs:
        return Path(tmpfs) / "hwprofile"
    log.warning("no tmpfs found: instance logs go to %s (on disk)", runtime / "logs")
    return runtime / "logs"


def options(plan: dict[str, Any], tmpfs: str | None, runtime: Path, progress: Any = None):  # -> Options
    from .config.schema import parse_size
    from .supervise.supervisor import Options

    sup, logs = plan.get("supervise") or {}, plan.get("logs") or {}
    return Options(
        runtime=runtime,
        log_root=log_root(plan, tmpfs, runtime),
        log_max_bytes=parse_size(logs.get("max_bytes", 64 << 20)),
        log_files=int(logs.get("files", 4)),
        ready_timeout=float(sup.get("ready_timeout", 900)),
        max_restarts=int(sup.get("max_restarts", 5)),
        backoff_initial=float(sup.get("backoff_initial", 2)),
        backoff_max=float(sup.get("backoff_max", 60)),
        progress=progress,
    )


def check_not_running(runtime: Path) -> None:
    state = read_state(runtime / "state.json")
    if state and pid_alive(state.get("supervisor_pid")) and state.get("supervisor_pid") != os.getpid():
        raise LaunchError(
            f"hwprofile is already supervising in {runtime} (pid {state['supervisor_pid']}): "
            "`hwprofile stop` first, or use another --runtime-dir",
            2,
        )


def check_ports(plan: dict[str, Any]) -> None:
    from .supervise.supervisor import port_free

    for inst in plan["instances"]:
        s = inst["server"]
        if not port_free(s["host"], s["port"]):
            raise LaunchError(
                f"{inst['name']}: port {s['port']} on {s['host']} is already in use. Stop what holds it "
                f"(`ss -ltnp 'sport = :{s['port']}'`), or choose another: --set server.port=<free port>"
            )


def run_foreground(
    plan: dict[str, Any], rel: Any, vllm_cmd: str, numactl: str | None, tmpfs: str | None, runtime: Path
) -> int:
    from .supervise.supervisor import Supervisor

    sup = Supervisor(
        plan, rel, vllm_cmd, numactl, options(plan, tmpfs, runtime, progress=lambda m: log.info("%s", m))
    )

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s: stopping instances", signal.Signals(signum).name)
        sup.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    sup.start()
    while not sup.all_done:
        time.sleep(0.3)
    sup.save()
    failed = [i.name for i in sup.instances if i.state == "failed"]
    return 1 if failed else 0


def run_detached(argv: list[str], runtime: Path, timeout: float) -> int:
    """Start the supervisor in its own session, wait for every instance to be ready (or fail)."""
    from .supervise.logs import private_dir

    private_dir(runtime)
    out = open(runtime / "supervisor.out", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwprofile", *argv, "--foreground"],
        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    out.close()
    end = time.monotonic() + timeout
    last = ""
    while time.monotonic() < end:
        state = read_state(runtime / "state.json")
        if state and state.get("supervisor_pid") == proc.pid:
            states = [i["state"] for i in state["instances"]]
            line = ", ".join(f"{i['name']} {i['state']}" for i in state["instances"])
            if line != last:
                print(f"hwprofile: {line}", file=sys.stderr)
                last = line
            if all(s == "ready" for s in states):
                print(format_status(state), end="")
                return 0
            if "failed" in states:
                print(format_status(state), end="")
                return 1
        if proc.poll() is not None:
            print(
                f"hwprofile: the supervisor exited ({proc.returncode}); see {runtime / 'supervisor.out'}",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.5)
    print(
        f"hwprofile: not ready after {timeout:.0f} s; still starting in the background (hwprofile status)",
        file=sys.stderr,
    )
    return 1


def status(runtime: Path) -> dict[str, Any]:
    state = read_state(runtime / "state.json")
    if state is None:
        return {"running": False, "runtime_dir": str(runtime), "instances": []}
    alive = pid_alive(state.get("supervisor_pid"))
    now = time.time()
    for inst in state["instances"]:
        inst["uptime_s"] = (
            round(now - inst["ready_at"], 1) if inst.get("ready_at") and inst["state"] == "ready" else None
        )
        if not alive and inst["state"] not in ("stopped", "failed"):
            inst["state"] = "stale"  # the supervisor is gone without recording a stop
    return {"running": alive, "runtime_dir": str(runtime), **state}


def format_status(state: dict[str, Any]) -> str:
    if not state.get("instances"):
        return "hwprofile: nothing is running\n"
    out = [
        f"supervisor pid {state.get('supervisor_pid')} ({'running' if state.get('running', True) else 'not running'}), profile {state.get('profile')}, model {state.get('model')}, vLLM {state.get('vllm_version')}"
    ]
    for i in state["instances"]:
        up = f", up {i['uptime_s']:.0f} s" if i.get("uptime_s") else ""
        out.append(
            f"  {i['name']}: {i['state']}{up}, pid {i['pid']}, {i['url']}, restarts {i['restarts']}, logs {i['log_file']}"
        )
        for step in i.get("ladder") or []:
            out.append(f"    ladder: {step['change']} (after: {step['because']})")
        if i.get("failure"):
            f = i["failure"]
            out.append(
                f"    last failure: {f['kind']}: {f['evidence']}"
                + (f" -> {f['fix']}" if f.get("fix") else "")
            )
        for w in i.get("warnings") or []:
            out.append(f"    warning: {w}")
    return "\n".join(out) + "\n"


def stop(runtime: Path, timeout: float = 120) -> list[str]:
    """Ask the supervisor to stop (SIGTERM); without one, end the recorded process groups."""
    state = read_state(runtime / "state.json")
    if state is None:
        return ["nothing to stop"]
    done: list[str] = []
    pid = state.get("supervisor_pid")
    if pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < end:
            time.sleep(0.3)
        done.append(f"supervisor {pid} {'stopped' if not pid_alive(pid) else 'did not stop in time'}")
    for inst in state["instances"]:
        pgid = inst.get("pgid")
        if pgid and pid_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
                done.append(f"{inst['name']}: process group {pgid} killed")
            except ProcessLookupError:
                pass
    return done or ["nothing was running"]


def demo_completion(url: str, model: str) -> dict[str, Any]:
    body = json.dumps(
        {"model": model, "prompt": "hwprofile plans vLLM launches", "max_tokens": 16, "temperature": 0}
    ).encode()
    req = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())
