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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import OperationError
from .plan.types import Plan, as_plan
from .runtime.dirs import UnsafeDirectory, private_dir, user_dirname
from .runtime.processes import ALIVE, Identity, check, group_members, identity_of, signal_process, wait_gone
from .supervise.state import (
    LAST_FILE,
    STATE_FILE,
    AlreadySupervising,
    already_message,
    lock_held,
    read_state,
    remove_state,
)

log = logging.getLogger("hwprofile")


class LaunchError(OperationError):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def setup_logging(runtime: Path, to_stderr: bool) -> None:
    private_dir(runtime)
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


def log_root(plan: Plan | dict[str, Any], tmpfs: str | None, runtime: Path) -> Path:
    """Where the instances' logs go: hwprofile's own per-user directory (:func:`user_dirname`) inside
    ``logs.dir`` or the tmpfs, never the given directory itself (whose mode hwprofile leaves alone);
    the runtime directory's ``logs`` without either."""
    configured = as_plan(plan).logs.get("dir")
    if configured:
        return Path(configured) / user_dirname()
    if tmpfs:
        return Path(tmpfs) / user_dirname()
    log.warning("no tmpfs found: instance logs go to %s (on disk)", runtime / "logs")
    return runtime / "logs"


def prepare_dirs(plan: Plan | dict[str, Any], tmpfs: str | None, runtime: Path) -> None:
    """Create (or check) the runtime and log directories before anything starts, so that one hwprofile
    may not use (a link, another user's, writable by others) is refused here, with the reason."""
    try:
        private_dir(runtime)
        private_dir(log_root(plan, tmpfs, runtime))
    except UnsafeDirectory as e:
        raise LaunchError(str(e)) from None


def options(
    plan: Plan | dict[str, Any],
    tmpfs: str | None,
    runtime: Path,
    progress: Any = None,
    min_model_len: int | None = None,
):  # -> Options
    from .config.schema import parse_size
    from .supervise.supervisor import Options

    plan = as_plan(plan)
    sup, logs = plan.supervise, plan.logs
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
        min_model_len=min_model_len,
    )


# -- what a plan was made from, and the file a detached supervisor starts from ---------------------

LAUNCH_FILE = "launch.json"
LAUNCH_SCHEMA = "hwprofile.launch/1"


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is made from: a re-plan (the memory ladder's) starts from the same inputs with
    more ``--set`` overrides. The environment's ``HWPROFILE_*`` layer is read again at each re-plan."""

    host: Any  # HostSnapshot
    config_root: str
    profile: str | None = None
    overrides: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()
    model: str | None = None
    draft: str | None = None

    def replan(self, extra: Sequence[str] = ()) -> dict[str, Any]:
        from .pipeline import make_plan

        return make_plan(
            self.host, self.config_root, profile=self.profile, overrides=list(self.overrides),
            sets=[*self.sets, *extra], model=self.model, draft=self.draft,
        )  # fmt: skip

    def min_model_len(self) -> int | None:
        """The profile's ``engine.min_model_len`` (the ladder's context floor), as these inputs set it."""
        from .pipeline import resolve_settings

        try:
            res = resolve_settings(
                self.host, self.config_root, self.profile, list(self.overrides), list(self.sets)
            )
            return int(res.settings["engine"]["min_model_len"])
        except Exception as e:  # a floor unknown is the ladder's own default, not a failed launch
            log.warning("engine.min_model_len not known (%s): the ladder uses its own floor", e)
            return None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host.to_dict(), "config_root": self.config_root, "profile": self.profile,
            "overrides": list(self.overrides), "sets": list(self.sets), "model": self.model, "draft": self.draft,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> PlanInputs:
        from .host.snapshot import HostSnapshot

        return cls(
            HostSnapshot.from_dict(data["host"], source), str(data["config_root"]), data.get("profile"),
            tuple(data.get("overrides") or ()), tuple(data.get("sets") or ()), data.get("model"), data.get("draft"),
        )  # fmt: skip


def write_launch_file(
    runtime: Path, plan: Plan | dict[str, Any], inputs: PlanInputs, vllm_version: str
) -> Path:
    """The validated plan, its inputs (for re-plans) and the vLLM release, for the detached
    supervisor: ``<runtime>/launch.json``, written atomically, 0600."""
    from .runtime.files import atomic_write

    path = private_dir(runtime) / LAUNCH_FILE
    doc = {
        "schema": LAUNCH_SCHEMA,
        "vllm_version": vllm_version,
        "plan": as_plan(plan).to_json(),
        "inputs": inputs.to_json(),
    }
    atomic_write(path, json.dumps(doc, indent=1), 0o600)
    return path


def read_launch_file(path: str | os.PathLike[str]) -> tuple[Plan, PlanInputs, str]:
    """(plan, inputs, vLLM version) from :func:`write_launch_file`'s file; it must be a regular file
    of this user's (not followed if it is a link)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise LaunchError(f"--plan-file {path}: {e.strerror}", 2) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise LaunchError(f"--plan-file {path}: not a regular file of this user's", 2)
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("schema") != LAUNCH_SCHEMA:
            raise ValueError(f"schema is not {LAUNCH_SCHEMA}")
        return (
            Plan.from_json(doc["plan"]),
            PlanInputs.from_json(doc["inputs"], str(path)),
            str(doc["vllm_version"]),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise LaunchError(f"--plan-file {path}: not a launch file: {e}", 2) from None


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


def check_ports(plan: Plan | dict[str, Any]) -> None:
    from .supervise.supervisor import port_free

    for inst in as_plan(plan).instances:
        s = inst.server
        if not port_free(s.host, s.port):
            raise LaunchError(
                f"{inst.name}: port {s.port} on {s.host} is already in use. Stop what holds it "
                f"(`ss -ltnp 'sport = :{s.port}'`), or choose another: --set server.port=<free port>"
            )


def run_foreground(
    plan: Plan | dict[str, Any],
    rel: Any,
    vllm_cmd: str,
    numactl: str | None,
    tmpfs: str | None,
    runtime: Path,
    replan: Callable[[list[str]], dict[str, Any]] | None = None,
    min_model_len: int | None = None,
) -> int:
    """Supervise ``plan`` here until SIGTERM/SIGINT/SIGHUP; ``replan`` (from the plan's inputs) is
    how the memory ladder's steps are planned."""
    from .supervise.lifecycle import State
    from .supervise.supervisor import Supervisor

    plan = as_plan(plan)
    try:
        opts = options(
            plan, tmpfs, runtime, progress=lambda m: log.info("%s", m), min_model_len=min_model_len
        )
        sup = Supervisor(plan, rel, vllm_cmd, numactl, opts, replan=replan)
    except AlreadySupervising as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return 2
    except UnsafeDirectory as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return 1

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
    """Start the supervisor (``hwprofile <argv> --foreground``) in its own session, wait for every
    instance to be ready (or fail)."""
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
    elif (live := _daemon_view(runtime)) is not None:
        out["daemon"] = live
        by_name = {i["name"]: i for i in live.get("instances") or []}
        for inst in out.get("instances") or []:
            if inst["name"] in by_name:
                inst["live"] = by_name[inst["name"]]
    return out


def _daemon_view(runtime: Path) -> dict[str, Any] | None:
    """The daemon's last published tick (``daemon.json``), when a daemon runs this supervisor; a
    file older than ten ticks is reported as such, not shown as current."""
    from .daemon.loop import DAEMON_FILE

    try:
        doc = json.loads((runtime / DAEMON_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != "hwprofile.daemon/1":
        return None
    age = time.time() - float(doc.get("updated_at") or 0)
    interval = float((doc.get("watch") or {}).get("interval") or 1.0)
    doc["age_s"] = round(age, 1)
    doc["current"] = age <= 10 * interval + 5
    return doc


def _fmt_gpu(g: dict[str, Any]) -> str:
    parts = [f"GPU {g['index']}: {g['thermal_state']}"]
    if g.get("temperature_c") is not None:
        limits = [
            f"slowdown {g['temperature_slowdown_c']:.0f}"
            if g.get("temperature_slowdown_c") is not None
            else "",
            f"shutdown {g['temperature_shutdown_c']:.0f}"
            if g.get("temperature_shutdown_c") is not None
            else "",
        ]
        lim = ", ".join(x for x in limits if x)
        parts.append(f"{g['temperature_c']:.0f} °C" + (f" ({lim} °C)" if lim else ""))
    if g.get("sm_clock_mhz") is not None:
        top = f" of {g['sm_clock_max_mhz']}" if g.get("sm_clock_max_mhz") else ""
        parts.append(f"SM {g['sm_clock_mhz']}{top} MHz")
    active = {k: v for k, v in (g.get("clocks_event_reasons") or {}).items() if k != "gpu_idle"}
    if active:
        parts.append("clock events " + ", ".join(f"{k} for {v:.0f} s" for k, v in active.items()))
    if g.get("power_draw_watts") is not None:
        top = f" of {g['power_limit_watts']:.0f}" if g.get("power_limit_watts") else ""
        parts.append(f"{g['power_draw_watts']:.0f}{top} W")
    line = ", ".join(parts)
    if g["thermal_state"] != "ok" or g.get("pending"):
        line += f" — {g.get('reason')}"
    return line


def _fmt_live(i: dict[str, Any]) -> list[str]:
    if i.get("status") != "ok":
        return [f"    live: {i.get('status')}" + (f" ({i['error']})" if i.get("error") else "")]
    bits = []
    if i.get("running") is not None:
        bits.append(f"running {i['running']:.0f}, waiting {i.get('waiting') or 0:.0f}")
    if i.get("kv_usage") is not None:
        bits.append(f"KV {i['kv_usage']:.0%}")
    if i.get("preemptions"):
        bits.append(f"preemptions {i['preemptions']:.0f}")
    if i.get("acceptance_rate") is not None:
        bits.append(
            f"acceptance {i['acceptance_rate']:.0%} (mean length {i.get('mean_acceptance_length') or 0:.2f})"
        )
    for key, label in (("ttft", "TTFT"), ("itl", "ITL")):
        p50, p99 = i.get(f"{key}_p50_s"), i.get(f"{key}_p99_s")
        if p50 is not None and p99 is not None:
            bits.append(f"{label} p50/p99 {p50 * 1000:.0f}/{p99 * 1000:.0f} ms")
    out = [
        f"    live ({i.get('window_s') or 0:.0f} s window): " + ", ".join(bits)
        if bits
        else "    live: no data yet"
    ]
    out.append(f"    thermal {i.get('thermal_state')}, degrade step {i.get('degrade_level')}")
    if i.get("warning"):
        out.append(f"    warning: {i['warning']}")
    if i.get("advice"):
        out.append(f"    advice: {i['advice']['reason']}")
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
        if i.get("live"):
            out += _fmt_live(i["live"])
    live = state.get("daemon")
    if live:
        age = (
            ""
            if live.get("current")
            else f" (last update {live.get('age_s')} s ago: the daemon is not ticking)"
        )
        out.append(f"daemon: {live.get('ticks')} ticks, {live.get('missed_ticks')} missed{age}")
        out += [f"  {_fmt_gpu(g)}" for g in live.get("gpus") or []]
        for a in (live.get("actions") or [])[-5:]:
            when = time.strftime("%H:%M:%S", time.localtime(a.get("at") or 0))
            out.append(
                f"  action {when}: {a['kind']} {a['instance']} to step {a['level']} {a['outcome']}: {a['reason']}"
            )
        for q in live.get("queued") or []:
            out.append(f"  queued: {q['kind']} {q['instance']} to step {q['level']}")
        for e in (live.get("errors") or [])[-3:]:
            out.append(f"  error: {e}")
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
