"""``hwprofile status``: what runs, from the state file, trusted only as far as it can be checked,
with the daemon's last published tick; and its text for a person."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..runtime.processes import ALIVE, check
from ..supervise.runfiles import (
    DAEMON_FILE,
    LAST_FILE,
    STATE_FILE,
    DaemonDoc,
    RunFileError,
    SupervisorDoc,
    lock_held,
    read_doc,
)


def status(runtime: Path) -> dict[str, Any]:
    """What runs, from the state file, trusted only as far as it can be checked: the supervisor is
    running only if its PID still has the recorded start time; otherwise the file is stale (the
    supervisor ended without cleaning up) and every instance it left is ``stale``, with what became of
    its process. Without a state file, how the last run ended (``last.json``), if there was one. A
    state file that cannot be trusted is a :class:`~hwprofile.supervise.runfiles.RunFileError` (exit 2)."""
    try:
        state = read_doc(runtime / STATE_FILE, SupervisorDoc)
    except RunFileError as e:
        if lock_held(runtime):
            raise RunFileError(
                f"{e} (a supervisor holds the lock of {runtime}: something runs, but what cannot be said)"
            ) from None
        raise
    if state is None:
        ended = read_doc(runtime / LAST_FILE, SupervisorDoc)
        out: dict[str, Any] = {"running": False, "runtime_dir": str(runtime), "instances": []}
        if lock_held(runtime):
            out["note"] = f"a supervisor holds the lock of {runtime} but has written no state yet (starting)"
        if ended is None:
            return out
        doc = ended.to_json()
        for inst in doc["instances"]:
            inst["uptime_s"] = None
        return {**doc, **out, "instances": doc["instances"], "ended": True}
    verdict = check(state.supervisor)
    alive = verdict == ALIVE
    now = time.time()
    out = {**state.to_json(), "running": alive, "runtime_dir": str(runtime)}
    for rec, inst in zip(state.instances, out["instances"], strict=True):
        inst["process_check"] = check(rec.process) if rec.process else None
        inst["uptime_s"] = (
            round(now - rec.ready_at, 1) if alive and rec.ready_at and rec.state == "ready" else None
        )
        if not alive and rec.state not in ("stopped", "failed"):
            inst["state"] = "stale"  # the supervisor is gone without recording a stop
    if not alive:
        out["stale"] = True
        out["stale_reason"] = f"supervisor pid {state.supervisor_pid}: {verdict}"
    elif (live := _daemon_view(runtime, now)) is not None:
        out["daemon"] = live
        by_name = {i["name"]: i for i in live.get("instances") or []}
        for inst in out["instances"]:
            if inst["name"] in by_name:
                inst["live"] = by_name[inst["name"]]
    return out


def _daemon_view(runtime: Path, now: float) -> dict[str, Any] | None:
    """The daemon's last published tick (``daemon.json``), when a daemon runs this supervisor; a
    file older than ten ticks is reported as such, not shown as current; one that cannot be
    trusted is said, not shown."""
    try:
        doc = read_doc(runtime / DAEMON_FILE, DaemonDoc)
    except RunFileError as e:
        return {"current": False, "age_s": None, "errors": [str(e)]}
    if doc is None:
        return None
    out = doc.to_json()
    out["age_s"] = round(now - doc.updated_at, 1)
    out["current"] = doc.current(now)
    # a daemon that ticks but cannot write the file (a full disk) still gives it a new time
    try:
        touched = os.stat(runtime / DAEMON_FILE).st_mtime
    except OSError:
        touched = doc.updated_at
    out["ticking"] = out["current"] or doc.current(now - max(0.0, touched - doc.updated_at))
    return out


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
    if g.get("faults"):
        line += (
            " — HARDWARE FAULT: "
            + "; ".join(g["faults"])
            + " (its instances are drained, not restarted there)"
        )
    if g.get("fault_notes"):
        line += " — noted: " + "; ".join(g["fault_notes"])
    return line


def _fmt_live(i: dict[str, Any]) -> list[str]:
    drained = [f"    DRAINED for a hardware fault: {i['drained']}"] if i.get("drained") else []
    if i.get("status") != "ok":
        return [f"    live: {i.get('status')}" + (f" ({i['error']})" if i.get("error") else ""), *drained]
    bits = []
    if i.get("running") is not None:
        bits.append(f"running {i['running']:.0f}, waiting {i.get('waiting') or 0:.0f}")
    if i.get("kv_usage") is not None:
        bits.append(f"KV {i['kv_usage']:.0%}")
    if i.get("engines"):  # a data-parallel server: each rank
        bits.append(
            "ranks "
            + ", ".join(
                f"{e}: {v.get('running', 0):.0f} running, KV {v.get('kv_usage', 0):.0%}"
                for e, v in sorted(i["engines"].items())
            )
        )
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
    out += drained
    if i.get("stalled_s") is not None:
        out.append(
            f"    NO PROGRESS for {i['stalled_s']:.0f} s with requests pending (restarted after watch.stall_s)"
        )
    if i.get("drift"):
        out.append(f"    SLOW DECAY: {i['drift']}")
    if i.get("warning"):
        out.append(f"    warning: {i['warning']}")
    if i.get("advice"):
        out.append(f"    advice: {i['advice']['reason']}")
    return out


def format_status(state: dict[str, Any]) -> str:
    """:func:`status`'s answer for a person: a line per instance, then the daemon's view."""
    if not state.get("instances"):
        return "hwprofile: nothing is running\n"
    out = [
        f"{_status_head(state)}, profile {state.get('profile')}, model {state.get('model')}, "
        f"vLLM {state.get('vllm_version')}"
    ]
    out += _fmt_clients(state)
    if state.get("front"):
        out += _fmt_front(state["front"])
    if state.get("previous") and not state.get("ended"):
        out.append(f"  the run before: {state['previous']}")
    for i in state["instances"]:
        out += _fmt_instance(i)
    if state.get("daemon"):
        out += _fmt_daemon(state["daemon"])
    return "\n".join(out) + "\n"


def _status_head(state: dict[str, Any]) -> str:
    """Whether the run ended, left a stale state file, or is running."""
    if state.get("ended"):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.get("ended_at") or 0))
        why = f" ({state['end_reason']})" if state.get("end_reason") else ""
        return f"nothing is running; the last run (supervisor pid {state.get('supervisor_pid')}) ended {when}{why}"
    if state.get("stale"):
        return (
            f"STALE state file: {state.get('stale_reason')} (it ended without cleaning up; "
            "`hwprofile stop` ends what it left)"
        )
    return f"supervisor pid {state.get('supervisor_pid')} (running)"


def _fmt_clients(state: dict[str, Any]) -> list[str]:
    """Where clients send requests, and through what."""
    ep = state.get("endpoint")
    if not ep or state.get("ended"):
        return []
    via = {
        "vllm": "its own API server",
        "router": f"vLLM's router, {ep.get('policy')}, supervised here",
    }.get(str(ep.get("via")), "nginx (hwprofile render --format nginx)")
    return [f"  clients: {ep['url']} ({via})"]


def _fmt_front(front: dict[str, Any]) -> list[str]:
    """The supervised vllm-router in front of the instances."""
    pid = f"pid {front['pid']}" if front.get("pid") else "no pid"
    servers = (
        f", {front['healthy_servers']} of {front['servers']} servers healthy"
        if front.get("servers") is not None
        else ""
    )
    return [
        f"  vllm-router: {front['state']}, {pid}, {front['url']}{servers}, restarts {front.get('restarts', 0)}, "
        f"metrics {front.get('metrics_url')}, logs {front.get('log_file')}"
    ]


def _fmt_instance(i: dict[str, Any]) -> list[str]:
    """One instance's line, then what it waits for, why it failed and its live view."""
    up = f", up {i['uptime_s']:.0f} s" if i.get("uptime_s") else ""
    pid = f"pid {i['pid']}" if i.get("pid") else "no pid"
    if i.get("process_check") and i["state"] == "stale":
        pid += f" ({i['process_check']})"
    out = [
        f"  {i['name']}: {i['state']}{up}, {pid}, {i['url']}, restarts {i['restarts']}, logs {i['log_file']}"
    ]
    if i.get("node"):
        out.append(f"    node {i['node']}")
    out += _fmt_instance_waits(i)
    if i.get("rejoins"):
        out.append(f"    started again {i['rejoins']} times to join node 0's next group")
    for step in i.get("ladder") or []:
        out.append(f"    ladder: {step['change']} (after: {step['because']})")
    if i.get("failure"):
        f = i["failure"]
        out.append(
            f"    last failure: {f['kind']}: {f['evidence']}" + (f" -> {f['fix']}" if f.get("fix") else "")
        )
    if i.get("log_dropped_lines"):
        out.append(f"    log: {i['log_dropped_lines']} lines dropped ({i.get('log_error')})")
    for w in i.get("warnings") or []:
        out.append(f"    warning: {w}")
    if i.get("live"):
        out += _fmt_live(i["live"])
    return out


def _fmt_instance_waits(i: dict[str, Any]) -> list[str]:
    """A failing /health, a pending retry, and what a starting instance waits for."""
    out = []
    if i.get("health_failing_since") and i["state"] == "ready":
        since = time.time() - i["health_failing_since"]
        out.append(f"    /health FAILING for {since:.0f} s (restarted after supervise.unhealthy_s)")
    if i.get("retry_at") and i["state"] == "failed":
        out.append(
            f"    FAILED: tried again in {max(0.0, i['retry_at'] - time.time()):.0f} s "
            f"(give-up {i.get('gave_up') or 1} in a row; supervise.retry_failed_s)"
        )
    if i.get("unresponsive"):
        out.append(f"    restarted {i['unresponsive']} times for a /health that kept failing")
    if i.get("group_wait") and i["state"] in ("starting", "restarting"):
        out.append(f"    waiting: {i['group_wait']}")
    if i.get("gpu_wait") and i["state"] in ("starting", "restarting"):
        out.append(f"    waiting for GPU memory (supervise.gpu_free_timeout): {i['gpu_wait']}")
    return out


def _fmt_daemon(live: dict[str, Any]) -> list[str]:
    """The daemon's view: ticks, GPUs, power limits it lowered, its recent actions and errors."""
    age = (
        ""
        if live.get("current")
        else f" (figures of {live.get('age_s')} s ago: the daemon ticks but cannot write its daemon.json; "
        "its log says why)"
        if live.get("ticking")
        else f" (last update {live.get('age_s')} s ago: the daemon is not ticking)"
    )
    out = [f"daemon: {live.get('ticks')} ticks, {live.get('missed_ticks')} missed{age}"]
    out += [f"  {_fmt_gpu(g)}" for g in live.get("gpus") or []]
    lowered = live.get("power_limits_lowered") or {}
    if lowered:
        out.append(
            "  power limit lowered by the daemon (degrade.power_limit_factor) on "
            + ", ".join(f"GPU {g} (restores {w:.0f} W)" for g, w in sorted(lowered.items()))
        )
    for name, why in sorted((live.get("power_lever_off") or {}).items()):
        out.append(f"  power limit not a lever for {name}: {why}")
    for a in (live.get("actions") or [])[-5:]:
        when = time.strftime("%H:%M:%S", time.localtime(a.get("at") or 0))
        out.append(
            f"  action {when}: {a['kind']} {a['instance']} to step {a['level']} {a['outcome']}: {a['reason']}"
        )
    for q in live.get("queued") or []:
        out.append(f"  queued: {q['kind']} {q['instance']} to step {q['level']}")
    for e in (live.get("errors") or [])[-3:]:
        out.append(f"  error: {e}")
    return out
