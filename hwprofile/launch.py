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

from .supervise.state import (
    ALIVE,
    LAST_FILE,
    STATE_FILE,
    AlreadySupervising,
    Identity,
    already_message,
    check,
    group_members,
    identity_of,
    lock_held,
    read_state,
    remove_state,
    signal_process,
    wait_gone,
)

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
    """Refuse when a supervisor holds this runtime directory's lock (the supervisor takes the lock
    itself too, so two launches racing past this check cannot both supervise)."""
    if lock_held(runtime):
        raise LaunchError(already_message(runtime), 2)
    state = read_state(runtime / STATE_FILE)
    if state is not None:
        print(
            f"hwprofile: note: {runtime / STATE_FILE} is stale (supervisor pid {state.get('supervisor_pid')} "
            "is gone); it is replaced",
            file=sys.stderr,
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
    from .supervise.lifecycle import State
    from .supervise.supervisor import Supervisor

    try:
        sup = Supervisor(
            plan, rel, vllm_cmd, numactl, options(plan, tmpfs, runtime, progress=lambda m: log.info("%s", m))
        )
    except AlreadySupervising as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return 2

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s: stopping instances", signal.Signals(signum).name)
        sup.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    sup.start()
    while not sup.all_done:
        time.sleep(0.3)
    sup.close()  # the last instance thread closed already; this covers a supervisor with none
    failed = [i.name for i in sup.instances if i.state == State.FAILED]
    return 1 if failed else 0


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


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
        state = read_state(runtime / STATE_FILE)
        if state and state.get("supervisor_pid") == proc.pid:
            states = [i["state"] for i in state["instances"]]
            line = ", ".join(f"{i['name']} {i['state']}" for i in state["instances"])
            if line != last:
                print(f"hwprofile: {line}", file=sys.stderr)
                last = line
            if states and all(s == "ready" for s in states):
                print(format_status(status(runtime)), end="")
                return 0
            if "failed" in states:
                print(format_status(status(runtime)), end="")
                return 1
        if proc.poll() is not None:
            ended = read_state(runtime / LAST_FILE)
            if ended and ended.get("supervisor_pid") == proc.pid:  # it ended on its own: how
                print(format_status(status(runtime)), end="")
                return 1
            print(
                f"hwprofile: the supervisor exited ({proc.returncode}); see {runtime / 'supervisor.out'}",
                file=sys.stderr,
            )
            tail = _tail(runtime / "supervisor.out")
            if tail:
                print(tail, file=sys.stderr)
            return 1
        time.sleep(0.5)
    print(
        f"hwprofile: not ready after {timeout:.0f} s; still starting in the background (hwprofile status)",
        file=sys.stderr,
    )
    return 1


def status(runtime: Path) -> dict[str, Any]:
    """What runs, from the state file, trusted only as far as it can be checked: the supervisor is
    running only if its PID still has the recorded start time; otherwise the file is stale (the
    supervisor ended without cleaning up) and every instance it left is ``stale``, with what became of
    its process. Without a state file, how the last run ended (``last.json``), if there was one."""
    state = read_state(runtime / STATE_FILE)
    if state is None:
        ended = read_state(runtime / LAST_FILE)
        if ended is None:
            return {"running": False, "runtime_dir": str(runtime), "instances": []}
        for inst in ended.get("instances") or []:
            inst["uptime_s"] = None
        return {**ended, "running": False, "ended": True, "runtime_dir": str(runtime)}
    sup = identity_of(state.get("supervisor"))
    verdict = check(sup)
    alive = verdict == ALIVE
    now = time.time()
    for inst in state.get("instances") or []:
        proc = identity_of(inst.get("process"))
        inst["process_check"] = check(proc) if proc else None
        inst["uptime_s"] = (
            round(now - inst["ready_at"], 1)
            if alive and inst.get("ready_at") and inst["state"] == "ready"
            else None
        )
        if not alive and inst["state"] not in ("stopped", "failed"):
            inst["state"] = "stale"  # the supervisor is gone without recording a stop
    out = {**state, "running": alive, "runtime_dir": str(runtime)}
    if not alive:
        out["stale"] = True
        out["stale_reason"] = f"supervisor pid {state.get('supervisor_pid')}: {verdict}"
    return out


def format_status(state: dict[str, Any]) -> str:
    if not state.get("instances"):
        return "hwprofile: nothing is running\n"
    if state.get("ended"):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.get("ended_at") or 0))
        head = f"nothing is running; the last run (supervisor pid {state.get('supervisor_pid')}) ended {when}"
    elif state.get("stale"):
        head = (
            f"STALE state file: {state.get('stale_reason')} (it ended without cleaning up; "
            "`hwprofile stop` ends what it left)"
        )
    else:
        head = f"supervisor pid {state.get('supervisor_pid')} (running)"
    out = [
        f"{head}, profile {state.get('profile')}, model {state.get('model')}, vLLM {state.get('vllm_version')}"
    ]
    for i in state["instances"]:
        up = f", up {i['uptime_s']:.0f} s" if i.get("uptime_s") else ""
        pid = f"pid {i['pid']}" if i.get("pid") else "no pid"
        if i.get("process_check") and i["state"] == "stale":
            pid += f" ({i['process_check']})"
        out.append(
            f"  {i['name']}: {i['state']}{up}, {pid}, {i['url']}, restarts {i['restarts']}, logs {i['log_file']}"
        )
        for step in i.get("ladder") or []:
            out.append(f"    ladder: {step['change']} (after: {step['because']})")
        if i.get("failure"):
            f = i["failure"]
            out.append(
                f"    last failure: {f['kind']}: {f['evidence']}"
                + (f" -> {f['fix']}" if f.get("fix") else "")
            )
        if i.get("log_dropped_lines"):
            out.append(f"    log: {i['log_dropped_lines']} lines dropped ({i.get('log_error')})")
        for w in i.get("warnings") or []:
            out.append(f"    warning: {w}")
    return "\n".join(out) + "\n"


def _end_unsupervised(name: str, ident: Identity, grace: float) -> str:
    """End an instance its supervisor left behind: SIGTERM to the verified leader, then SIGKILL to
    its group while the leader still lives; members outliving a leader are killed one by one, each
    verified (a group is never signalled once its leader may have been reaped)."""
    signal_process(ident, signal.SIGTERM)
    if not wait_gone(ident, grace) and signal_process(ident, signal.SIGKILL, group=True):
        return f"{name}: process group {ident.pid} killed after {grace:.0f} s"
    left = [m for m in group_members(ident.pid, not_before=ident.start) if m.pid != ident.pid]
    killed = sum(signal_process(m, signal.SIGKILL) for m in left)
    return f"{name}: pid {ident.pid} stopped" + (f"; {killed} leftover processes killed" if killed else "")


def stop(runtime: Path, timeout: float = 120) -> list[str]:
    """Ask the supervisor to stop (SIGTERM); without one, end the recorded processes. Nothing is
    signalled unless its PID still has the start time recorded for it."""
    state = read_state(runtime / STATE_FILE)
    if state is None:
        return ["nothing to stop"]
    done: list[str] = []
    pid = state.get("supervisor_pid")
    sup = identity_of(state.get("supervisor"))
    verdict = check(sup)
    if verdict == ALIVE and sup is not None:
        signal_process(sup, signal.SIGTERM)
        if wait_gone(sup, timeout):
            done.append(f"supervisor {pid} stopped")
        else:
            signal_process(sup, signal.SIGKILL)
            wait_gone(sup, 10)
            done.append(f"supervisor {pid} did not stop in {timeout:.0f} s: killed")
        state = read_state(runtime / STATE_FILE)  # a clean stop removed it
        if state is None:
            return done
    else:
        done.append(f"stale state file: supervisor pid {pid}: {verdict}; not signalled")
    for inst in state.get("instances") or []:
        ident = identity_of(inst.get("process"))
        what = check(ident)
        if what == ALIVE and ident is not None:
            grace = float(inst.get("stop_grace_s") or 20)
            done.append(_end_unsupervised(inst["name"], ident, grace))
        elif ident is not None:
            done.append(f"{inst['name']}: pid {ident.pid}: {what}; not signalled")
    remove_state(runtime / STATE_FILE)  # everything it names is checked and ended: the file is done
    return done


def demo_completion(
    url: str, model: str, prompt: str = "hwprofile plans vLLM launches", max_tokens: int = 16
) -> dict[str, Any]:
    """One greedy completion; with ``return_token_ids`` (vLLM 0.32 has it) the reply carries the
    prompt's and the generated token ids (``choices[0].prompt_token_ids``, ``.token_ids``); a reply
    without them is shown without ids. The prompt is added to the reply as ``prompt``."""
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
        }
    ).encode()
    req = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        reply: dict[str, Any] = json.loads(resp.read())
    reply["prompt"] = prompt
    return reply
