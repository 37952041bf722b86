"""The supervisor against a fake vLLM (tests/fakevllm.py): seconds per test, no real engine.

Readiness, readiness timeout, unplanned exits restarted with backoff, giving up, the out-of-memory
ladder, configuration errors, draining stop, SIGKILL of what ignores SIGTERM, a broken supervisor
thread, a log sink that cannot be written, a proxy in the environment, the runtime lock, and
``status``/``stop`` over state files whose processes are gone or whose PIDs were reused."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import runcli
from clock import ManualClock
from vllmtools import fake_model, fake_vllm_shim, free_port
from waiting import wait_for

from hwprofile.config.settings import Logs, Supervise
from hwprofile.launch.start import Launch, Refused, foreground, supervisor
from hwprofile.launch.status import format_status, status
from hwprofile.launch.stop import stop
from hwprofile.pipeline import PlanInputs
from hwprofile.runtime.dirs import user_dirname
from hwprofile.runtime.processes import (
    Identity,
    check,
    group_left,
    group_members,
    identify,
    signal_process,
    wait_group_gone,
)
from hwprofile.supervise.lifecycle import ALLOWED, IllegalTransition, Machine, State
from hwprofile.supervise.options import Options
from hwprofile.supervise.runfiles import (
    LAST_FILE,
    LAUNCH_FILE,
    STATE_FILE,
    STATE_SCHEMA,
    AlreadySupervising,
    SupervisorDoc,
    lock_held,
    read_doc,
    write_doc,
)
from hwprofile.supervise.supervisor import Supervisor
from hwprofile.telemetry import http
from hwprofile.telemetry.scrape import scrape


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A model directory (config.json and a token safetensors file), a `vllm` shim running the fake,
    the host snapshot and the vLLM release to render for."""
    from hwprofile.host.detect import detect_host
    from hwprofile.render.versions import release

    base = tmp_path_factory.mktemp("fake")
    model = fake_model(base / "model")
    shim = fake_vllm_shim(base / "vllm")
    return {"model": model, "shim": shim, "host": detect_host(), "release": release("0.32.0"), "base": base}


@pytest.fixture
def rt() -> Iterator[Path]:
    """A short runtime directory (vLLM's IPC socket paths must fit in 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="hwpt-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch, rt: Path) -> Iterator[Path]:
    """No FAKEVLLM_* or proxy leaks in from outside; every start is logged to the returned file. After
    the test, whatever is left of a fake server's process group (a test that failed half-way) is killed."""
    for k in list(os.environ):
        if k.startswith("FAKEVLLM_") or k.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            monkeypatch.delenv(k)
    log = rt / "starts.jsonl"
    monkeypatch.setenv("FAKEVLLM_ARGV_LOG", str(log))
    monkeypatch.setenv("FAKEVLLM_READY_DELAY", "0.2")
    yield log
    for start in starts(log):
        for member in group_members(start["pid"]):
            try:
                if b"fakevllm" in Path(f"/proc/{member.pid}/cmdline").read_bytes():
                    signal_process(member, signal.SIGKILL)
            except OSError:
                pass


def sets_for(world: dict[str, Any], port: int, *extra: str) -> list[str]:
    return [
        "engine.max_model_len=512",
        "cpu.kv_cache_space_gib=0.0625",
        "speculative.method=none",
        "server.shutdown_timeout=2",
        f"server.port={port}",
        f"server.vllm_command={world['shim']}",
        *extra,
    ]


def plan_inputs(world: dict[str, Any], rt: Path, *extra: str, host: Any = None) -> PlanInputs:
    (rt / "etc").mkdir(exist_ok=True)
    sets = tuple(sets_for(world, free_port(), *extra))
    return PlanInputs(host or world["host"], str(rt / "etc"), sets=sets, model=str(world["model"]))


def make_supervisor(
    world: dict[str, Any], rt: Path, *extra: str, host: Any = None, replan: bool = True, **opts: Any
) -> Supervisor:
    """A supervisor wired as ``launch`` wires it: the plan and its re-plans from the same inputs."""
    inputs = plan_inputs(world, rt, *extra, host=host)
    supervise = {
        "ready_timeout": 20,
        "max_restarts": 3,
        "backoff_initial": 0.1,
        "backoff_max": 1.0,
        "stop_margin": 3.0,
        "unhealthy_s": 30.0,
        "restart_window_s": 600.0,
        "retry_failed_s": 0.0,
        "retry_failed_max_s": 3600.0,
    }
    rest: dict[str, Any] = {"poll_interval": 0.05, "min_model_len": inputs.min_model_len()}
    for k, v in opts.items():
        (supervise if k in supervise else rest)[k] = v
    options = Options.from_settings(Supervise(**supervise), Logs(), rt / "run", rt / "logs", **rest)
    return Supervisor(
        inputs.replan(),
        world["release"],
        "/nonexistent/vllm",
        None,
        options,
        replan=inputs.replan if replan else None,
    )


def flag_values(path: Path, name: str) -> list[str | None]:
    """The value of ``name`` in every start's argv (None where it is absent; "" for a bare flag)."""
    out: list[str | None] = []
    for a in (s["argv"] for s in starts(path)):
        if name not in a:
            out.append(None)
        else:
            nxt = a[a.index(name) + 1] if a.index(name) + 1 < len(a) else ""
            out.append("" if nxt.startswith("--") else nxt)
    return out


_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the test's own client, no proxy


def metrics_body(url: str) -> str:
    got = http.get(url + "/metrics")
    assert got is not None and got[0] == 200, got
    return got[1].decode()


def read_state(path: Path) -> dict[str, Any] | None:
    """A state file's document as JSON (None when there is none): through the one trusted reader."""
    doc = read_doc(path, SupervisorDoc)
    return doc.to_json() if doc else None


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (a state file's JSON, without its schema) through the one writer."""
    write_doc(path, SupervisorDoc.from_json({"schema": STATE_SCHEMA, **state}))


def starts(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def finish(sup: Supervisor) -> None:
    sup.stop()
    sup.wait(30)
    assert sup.all_done


def gone(pid: int) -> bool:
    return not group_members(pid)


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def members(pgid: int) -> str:
    """What is left of a process group, for a failure's message: PID, state, name, the signals it
    blocks, ignores, catches and has pending, and its command line."""
    rows = []
    for m in group_members(pgid):
        try:
            st = dict(
                ln.split(":\t", 1)
                for ln in Path(f"/proc/{m.pid}/status").read_text().splitlines()
                if ":\t" in ln
            )
            cmd = Path(f"/proc/{m.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        sig = " ".join(
            f"{k}={st.get(k, '?').strip()}" for k in ("SigBlk", "SigIgn", "SigCgt", "ShdPnd", "SigPnd")
        )
        rows.append(f"{m.pid} {st.get('State', '?').strip()} {st.get('Name', '?').strip()} {sig} {cmd[:200]}")
    return "\n".join(rows) or "(none)"


# -- the state machine -----------------------------------------------------------------------


def test_state_machine_allows_only_listed_moves() -> None:
    seen: list[tuple[State, State]] = []
    m = Machine("x", on_change=lambda a, b: seen.append((a, b)))
    m.change(State.READY)
    with pytest.raises(IllegalTransition, match="ready -> stopped"):
        m.change(State.STOPPED)  # a stop always goes through STOPPING
    m.change(State.STOPPING)
    m.change(State.STOPPED)
    assert not m.fail()  # terminal stays terminal
    assert seen == [
        (State.STARTING, State.READY),
        (State.READY, State.STOPPING),
        (State.STOPPING, State.STOPPED),
    ]
    assert ALLOWED[State.STOPPED] == frozenset()
    assert ALLOWED[State.FAILED] == {State.RESTARTING}  # only its own retry after the cool-off
    assert json.dumps({"s": State.READY}) == '{"s": "ready"}' and State.READY == "ready"


# -- readiness and verification --------------------------------------------------------------


def test_ready_verified_and_clean_stop(world, rt, fake_env) -> None:
    sup = make_supervisor(world, rt)
    sup.start()
    assert sup.wait_ready(20), sup.instances[0].record()
    inst = sup.instances[0]
    st = status(rt / "run")
    assert st["running"] and not st.get("stale")
    i = st["instances"][0]
    assert i["state"] == "ready" and i["process"] == {"pid": inst.pid, "start_time": identify(inst.pid).start}
    assert st["supervisor"] == {"pid": os.getpid(), "start_time": identify(os.getpid()).start}
    assert not [w for w in i["warnings"] if "planned" in w], i["warnings"]  # what started is the plan
    assert i["argv"][0] == str(world["shim"])  # server.vllm_command is what runs
    assert starts(fake_env)[0]["argv"][:2] == ["serve", str(world["model"])]
    r = scrape(inst.name, inst.url, 0.0)  # the one /metrics path
    assert r.status == "ok" and r.metrics is not None
    assert r.metrics.running is not None and r.metrics.kv_usage is not None
    assert lock_held(rt / "run")
    pid = inst.pid
    finish(sup)
    assert inst.state == State.STOPPED and gone(pid)
    assert not (rt / "run" / STATE_FILE).exists()  # a clean stop leaves no PIDs behind
    last = read_state(rt / "run" / LAST_FILE)
    assert last and last["instances"][0]["state"] == "stopped" and last["instances"][0]["process"] is None
    assert not lock_held(rt / "run")
    st = status(rt / "run")
    assert not st["running"] and st["ended"] and st["instances"][0]["state"] == "stopped"
    assert "nothing is running; the last run" in format_status(st)
    assert stop(rt / "run") == ["nothing to stop"]


def test_ready_is_in_the_state_file_when_wait_ready_returns(world, rt, fake_env) -> None:
    """The instance's thread saves after its change is visible to ``wait_ready``: with that save held
    back (never made here), the state file must still say ready once ``wait_ready`` returned."""
    sup = make_supervisor(world, rt)
    inst = sup.instances[0]
    inst.on_change = lambda: None  # the instance's own saves never happen
    sup.start()
    try:
        assert sup.wait_ready(20), inst.record()
        assert status(rt / "run")["instances"][0]["state"] == "ready"
    finally:
        finish(sup)


def test_fake_metrics_parse_as_prometheus_text(world, rt, fake_env) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    sup = make_supervisor(world, rt, "speculative.method=ngram", "speculative.num_speculative_tokens=3")
    sup.start()
    try:
        assert sup.wait_ready(20)
        url = sup.instances[0].url
        body = json.dumps({"model": "m", "prompt": "a b c", "max_tokens": 5}).encode()
        req = urllib.request.Request(
            url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with _direct.open(req, timeout=10) as r:
            assert json.loads(r.read())["usage"]["completion_tokens"] == 5
        samples = {
            s.name: s.value
            for f in parser.text_string_to_metric_families(metrics_body(url))
            for s in f.samples
        }
        assert samples["vllm:generation_tokens_total"] == 5 and samples["vllm:prompt_tokens_total"] == 3
        assert (
            samples["vllm:spec_decode_num_draft_tokens_total"] == 15 and "vllm:kv_cache_usage_perc" in samples
        )
    finally:
        finish(sup)


def test_readiness_timeout(world, rt, fake_env, monkeypatch) -> None:
    """A server that never answers /health fails with the readiness timeout and its last log line as
    evidence. The deadline is on an injected clock, moved past it once the fake said it is loading: on a
    loaded machine a 1 s wall-clock deadline could pass before the fake printed anything."""
    monkeypatch.setenv("FAKEVLLM_MODE", "hang")
    clock = ManualClock()
    sup = make_supervisor(world, rt, ready_timeout=1.0, max_restarts=0, clock=clock)
    sup.start()
    inst = sup.instances[0]
    wait_for(lambda: "Loading weights" in inst.log.last_line(), "the fake's loading line", 60)
    assert inst.state != State.FAILED  # the clock stands: no deadline has passed
    clock.advance(2.0)
    sup.wait(60)
    assert inst.state == State.FAILED
    assert inst.failure["kind"] == "readiness timeout" and "Loading weights" in inst.failure["evidence"]
    assert "gave up after 0 restarts" in inst.failure["fix"]
    assert gone(inst.pid)


def test_health_polls_never_use_a_proxy(world, rt, fake_env, monkeypatch) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    for k in ("http_proxy", "HTTP_PROXY", "all_proxy"):
        monkeypatch.setenv(k, dead)
    sup = make_supervisor(world, rt, ready_timeout=10)
    sup.start()
    try:
        assert sup.wait_ready(15), sup.instances[0].failure
        url = sup.instances[0].url
        with pytest.raises(OSError):  # what a default opener does with that environment: the dead proxy
            urllib.request.build_opener().open(url + "/health", timeout=2)
        assert http.healthy(url)
        # the demo's completion (launch --demo) goes around the proxy as well
        from hwprofile.launch.demo import demo_completion

        assert demo_completion(url, str(world["model"]), max_tokens=2)["usage"]["completion_tokens"] == 2
    finally:
        finish(sup)


# -- failures, restarts, the ladder ----------------------------------------------------------


def test_unplanned_exits_restart_with_backoff_and_the_group_is_signalled_before_reaping(
    world, rt, fake_env, monkeypatch, caplog
) -> None:
    monkeypatch.setenv("FAKEVLLM_CRASH_AFTER", "0.2")
    monkeypatch.setenv("FAKEVLLM_EXIT_CODE", "0")  # vLLM exits 0 after its engine died: still a failure
    monkeypatch.setenv("FAKEVLLM_FAIL_TIMES", "2")
    monkeypatch.setenv("FAKEVLLM_COUNTER", str(rt / "count"))
    unreaped: list[bool] = []
    real_killpg = os.killpg

    def killpg(pgid: int, sig: int) -> None:
        try:  # WNOWAIT: looks without reaping; ChildProcessError would mean the leader was reaped
            os.waitid(os.P_PID, pgid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            unreaped.append(True)
        except ChildProcessError:
            unreaped.append(False)
        real_killpg(pgid, sig)

    monkeypatch.setattr(os, "killpg", killpg)
    sup = make_supervisor(world, rt, backoff_initial=0.6, backoff_max=5)
    sup.start()
    inst = sup.instances[0]
    try:
        wait_for(lambda: inst.restarts == 2 and inst.state == State.READY, "the third start ready")
        time.sleep(0.5)  # the third start is healthy: it stays up
        assert inst.state == State.READY and inst.restarts == 2
        assert inst.failure["kind"] == "unplanned exit" and "exit code 0" in inst.failure["evidence"]
        assert len(starts(fake_env)) == 3 and len({s["pid"] for s in starts(fake_env)}) == 3
        # each start got ready: the backoff starts over (the delays the supervisor chose, not wall time)
        delays = [r.args[2] for r in caplog.records if r.msg == "%s: restart %d in %.1f s"]
        assert delays == [0.6, 0.6], delays
    finally:
        finish(sup)
    assert unreaped and all(unreaped), unreaped


def test_failed_starts_back_off_exponentially(world, rt, fake_env, monkeypatch, caplog) -> None:
    monkeypatch.setenv("FAKEVLLM_MODE", "die")  # exits while starting, with an error nobody classified
    monkeypatch.setenv("FAKEVLLM_FAIL_TIMES", "3")
    monkeypatch.setenv("FAKEVLLM_COUNTER", str(rt / "count"))
    sup = make_supervisor(world, rt, backoff_initial=0.3, backoff_max=0.6)
    sup.start()
    inst = sup.instances[0]
    try:
        wait_for(lambda: inst.state == State.READY, "ready after three failed starts")
        assert inst.restarts == 3 and inst.failure["kind"] == "unknown"
        assert "Engine core initialization failed" in inst.failure["evidence"]
        # the delays the supervisor waited: doubling from supervise.backoff_initial up to backoff_max
        delays = [r.args[2] for r in caplog.records if r.msg == "%s: restart %d in %.1f s"]
        assert delays == [0.3, 0.6, 0.6], delays
        # and each start came no sooner than its delay after the one before (a lower bound: a loaded
        # machine only adds to it)
        t = [s["t"] for s in starts(fake_env)]
        gaps = [b - a for a, b in itertools.pairwise(t)]
        assert len(gaps) == 3 and all(g >= d - 0.02 for g, d in zip(gaps, delays, strict=True)), (
            gaps,
            delays,
        )
    finally:
        finish(sup)


def test_gives_up_after_max_restarts(world, rt, fake_env, monkeypatch) -> None:
    monkeypatch.setenv("FAKEVLLM_CRASH_AFTER", "0.05")
    sup = make_supervisor(world, rt, max_restarts=2, backoff_initial=0.05)
    sup.start()
    sup.wait(30)
    inst = sup.instances[0]
    assert inst.state == State.FAILED and inst.restarts == 3 and len(starts(fake_env)) == 3
    assert inst.failure["kind"] == "unplanned exit"
    assert inst.failure["fix"] == "gave up after 2 restarts within supervise.restart_window_s (600 s)"
    assert not (rt / "run" / STATE_FILE).exists()
    st = status(rt / "run")
    assert st["instances"][0]["state"] == "failed" and "gave up after 2 restarts" in format_status(st)


def test_failures_are_counted_in_a_window_and_a_failed_instance_is_tried_again(world, rt, fake_env) -> None:
    """The soak's "gave up after 5 restarts" after 6 SIGKILLs 180 s apart: failures now count only within
    supervise.restart_window_s (systemd's StartLimitBurst/IntervalSec), and an instance that gave up is
    tried again after supervise.retry_failed_s, doubling with each give-up in a row. Time is the test's
    clock: the window and the cool-off pass when it says so."""
    clock = ManualClock()
    sup = make_supervisor(
        world,
        rt,
        "server.shutdown_timeout=1",
        max_restarts=1,
        restart_window_s=300,
        retry_failed_s=50,
        retry_failed_max_s=80,
        stop_margin=0.5,
        clock=clock,
    )
    sup.start()
    inst = sup.instances[0]

    def kill_and_wait(expect: State) -> None:
        pid = inst.pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        wait_for(lambda: inst.pid != pid and inst.state == expect, f"{expect} after the kill", 60)

    try:
        assert sup.wait_ready(60), inst.failure
        for _ in range(3):  # one failure per window: never gives up, however many over its life
            kill_and_wait(State.READY)
            clock.advance(400)
        assert inst.restarts == 3 and inst.state == State.READY and inst.retry_at is None
        # two in one window: gives up, failed, visible with when it is tried again
        kill_and_wait(State.READY)
        pid = inst.pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        wait_for(lambda: inst.state == State.FAILED and inst.retry_at is not None, "gave up", 60)
        assert inst.failure["fix"] == (
            "gave up after 1 restarts within supervise.restart_window_s (300 s); "
            "tried again in 50 s (give-up 1 in a row, supervise.retry_failed_s)"
        )
        wait_for(lambda: "tried again in 50 s" in format_status(status(rt / "run")), "status says it", 30)
        assert status(rt / "run")["instances"][0]["retry_at"] == pytest.approx(time.time() + 50, abs=30)
        n = len(starts(fake_env))
        time.sleep(0.5)
        assert len(starts(fake_env)) == n and inst.state == State.FAILED  # the clock stands: no retry yet
        inst.replace(sup.replan(["engine.max_num_seqs=7"]).instance(inst.name))  # new settings while failed
        clock.advance(51)
        wait_for(lambda: inst.state == State.READY, "ready again after the cool-off", 60)
        assert inst.retry_at is None and len(starts(fake_env)) == n + 1
        assert flag_values(fake_env, "--max-num-seqs")[-1] == "7"  # the retry started with them
        kill_and_wait(State.READY)  # a fresh window after the retry: the first failure restarts
        pid = inst.pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)  # a second give-up in a row: a longer cool-off, capped
        wait_for(lambda: inst.state == State.FAILED and inst.gave_up == 2, "gave up again", 60)
        assert "tried again in 80 s (give-up 2 in a row" in inst.failure["fix"]
    finally:
        finish(sup)
    assert inst.state == State.FAILED  # stopped while cooling off: it ended failed, with nothing running
    assert gone(inst.pid)


def test_out_of_memory_walks_the_ladder_one_step_per_failure(world, rt, fake_env, monkeypatch) -> None:
    monkeypatch.setenv("FAKEVLLM_MODE", "oom")
    monkeypatch.setenv("FAKEVLLM_FAIL_TIMES", "2")
    monkeypatch.setenv("FAKEVLLM_COUNTER", str(rt / "count"))
    sup = make_supervisor(world, rt, "engine.max_model_len=1024", backoff_initial=0.4, backoff_max=5)
    sup.start()
    try:
        assert sup.wait_ready(20), sup.instances[0].failure
        inst = sup.instances[0]
        assert [s["change"] for s in inst.ladder] == ["max_model_len 1024 -> 512", "max_model_len 512 -> 256"]
        assert [s["set"] for s in inst.ladder] == ["engine.max_model_len=512", "engine.max_model_len=256"]
        assert all(s["because"] == "out of memory" for s in inst.ladder)
        assert inst.restarts == 2  # a ladder step is a restart: it counts toward max_restarts
        assert flag_values(fake_env, "--max-model-len") == ["1024", "512", "256"]
        t = [s["t"] for s in starts(fake_env)]
        gaps = [b - a for a, b in itertools.pairwise(t)]
        assert gaps[0] >= 0.4 and gaps[1] >= 0.8, gaps  # each step waited the backoff, doubling
        # the instance is the re-planned one: its memory figures are the planner's for 256 tokens,
        # and the startup check against them (and this start's own log only) finds nothing to say
        fresh = sup.replan(["engine.max_model_len=512", "engine.max_model_len=256"]).to_json()["instances"][0]
        assert (
            inst.inst.to_json()["memory"] == fresh["memory"]
            and inst.inst.to_json()["engine"] == fresh["engine"]
        )
        assert inst.verify_warnings == [], inst.verify_warnings
        human = format_status(status(rt / "run"))
        assert "ladder: max_model_len 1024 -> 512 (after: out of memory)" in human
        assert "planned" not in human  # no "started differently from the plan" warning
    finally:
        finish(sup)


def test_every_ladder_step_on_a_gpu_is_a_replan(world, rt, fake_env, monkeypatch, host_of) -> None:
    """memory share -0.05 (twice, to 0.5), the context halved to engine.min_model_len, sequences
    halved, eager mode, no speculative decoding; then the bottom: each start with the re-planned
    instance, memory figures included."""
    host = host_of("rtx4090-1x")
    monkeypatch.setenv("FAKEVLLM_MODE", "oom")
    sets = (
        "engine.gpu_memory_utilization=0.6",
        "engine.max_model_len=1024",
        "engine.min_model_len=512",
        "engine.max_num_seqs=2",
        "engine.enforce_eager=false",
        "speculative.method=ngram",
        "speculative.num_speculative_tokens=3",
    )
    sup = make_supervisor(world, rt, *sets, host=host, max_restarts=10, backoff_initial=0.05)
    first = sup.instances[0].inst.to_json()
    assert first["device"] == "cuda" and first["speculative"]
    sup.start()
    sup.wait(60)
    inst = sup.instances[0]
    assert inst.state == State.FAILED and "every ladder step taken" in inst.failure["fix"]
    assert [s["set"] for s in inst.ladder] == [
        "engine.gpu_memory_utilization=0.55",
        "engine.gpu_memory_utilization=0.5",
        "engine.max_model_len=512",
        "engine.max_num_seqs=1",
        "engine.enforce_eager=true",
        "speculative.method=none",
    ]
    assert [s["rung"] for s in inst.ladder] == [
        "memory share",
        "memory share",
        "context length",
        "concurrent sequences",
        "eager mode",
        "speculative decoding",
    ]
    assert inst.restarts == 6 and len(starts(fake_env)) == 7
    assert flag_values(fake_env, "--gpu-memory-utilization") == ["0.6", "0.55"] + ["0.5"] * 5
    assert flag_values(fake_env, "--max-model-len") == ["1024"] * 3 + ["512"] * 4  # never below min_model_len
    assert flag_values(fake_env, "--max-num-seqs") == ["2"] * 4 + ["1"] * 3
    assert [v is not None for v in flag_values(fake_env, "--enforce-eager")] == [False] * 5 + [True] * 2
    assert [v is not None for v in flag_values(fake_env, "--speculative-config")] == [True] * 6 + [False]
    fresh = sup.replan([s["set"] for s in inst.ladder]).to_json()["instances"][0]
    assert (
        inst.inst.to_json()["memory"] == fresh["memory"] and inst.inst.to_json()["memory"] != first["memory"]
    )
    assert inst.inst.to_json()["memory"]["budget_bytes"] < first["memory"]["budget_bytes"]
    human = format_status(status(rt / "run"))
    assert "ladder: gpu_memory_utilization 0.6 -> 0.55 (after: out of memory)" in human
    assert "ladder: ngram speculation dropped" in human


def test_the_ladder_context_floor_is_min_model_len(world, rt, fake_env, monkeypatch) -> None:
    monkeypatch.setenv("FAKEVLLM_MODE", "oom")
    sup = make_supervisor(
        world,
        rt,
        "engine.max_model_len=2048",
        "engine.min_model_len=1024",
        max_restarts=10,
        backoff_initial=0.05,
    )
    sup.start()
    sup.wait(30)
    inst = sup.instances[0]
    assert [s["change"] for s in inst.ladder] == [
        "max_model_len 2048 -> 1024",
        "max_num_seqs 4 -> 2",
        "max_num_seqs 2 -> 1",
    ]
    assert flag_values(fake_env, "--max-model-len") == ["2048", "1024", "1024", "1024"]
    assert inst.state == State.FAILED and "every ladder step taken" in inst.failure["fix"]


def test_ladder_steps_count_toward_max_restarts(world, rt, fake_env, monkeypatch) -> None:
    monkeypatch.setenv("FAKEVLLM_MODE", "oom")
    sup = make_supervisor(world, rt, "engine.max_model_len=1024", max_restarts=1, backoff_initial=0.05)
    sup.start()
    sup.wait(30)
    inst = sup.instances[0]
    assert inst.state == State.FAILED and len(starts(fake_env)) == 2 and inst.restarts == 2
    assert [s["change"] for s in inst.ladder] == ["max_model_len 1024 -> 512"]
    assert inst.failure["kind"] == "out of memory"
    assert inst.failure["fix"] == (
        "gave up after 1 restarts within supervise.restart_window_s (600 s) "
        "(the next ladder step would have been --set engine.max_model_len=256)"
    )


def test_without_a_replan_a_memory_failure_says_the_next_step(world, rt, fake_env, monkeypatch) -> None:
    monkeypatch.setenv("FAKEVLLM_MODE", "oom")
    sup = make_supervisor(world, rt, "engine.max_model_len=1024", replan=False)
    sup.start()
    sup.wait(30)
    inst = sup.instances[0]
    assert inst.state == State.FAILED and len(starts(fake_env)) == 1 and not inst.ladder
    assert "--set engine.max_model_len=512" in inst.failure["fix"]


def test_kv_cache_too_small_walks_the_ladder_until_it_fits(world, rt, fake_env) -> None:
    # as in test_launch.py with real vLLM: 300000 bytes hold 4 blocks of 128 tokens, one is the null block
    sup = make_supervisor(
        world, rt, "engine.max_model_len=2048", "server.extra_args=--kv-cache-memory-bytes 300000"
    )
    sup.start()
    try:
        assert sup.wait_ready(30), sup.instances[0].failure
        inst = sup.instances[0]
        assert [s["change"] for s in inst.ladder] == [
            "max_model_len 2048 -> 1024",
            "max_model_len 1024 -> 512",
            "max_model_len 512 -> 256",
        ]
        assert {s["because"] for s in inst.ladder} == {"no memory left for the KV cache"}
        assert inst.restarts == 3
        assert any(
            "kv_cache_memory_bytes: planned 67108864, vLLM started with 300000" in w
            for w in inst.verify_warnings
        )
    finally:
        finish(sup)


def test_ladder_bottom_fails(world, rt, fake_env, monkeypatch) -> None:
    monkeypatch.setenv("FAKEVLLM_MODE", "oom")
    sup = make_supervisor(world, rt, "engine.max_model_len=256", "engine.max_num_seqs=1")
    sup.start()
    sup.wait(30)
    inst = sup.instances[0]
    assert inst.state == State.FAILED and "every ladder step taken" in inst.failure["fix"]


def test_configuration_error_is_not_retried(world, rt, fake_env) -> None:
    sup = make_supervisor(world, rt, "server.extra_args=--bogus-flag 3")
    sup.start()
    sup.wait(20)
    inst = sup.instances[0]
    assert inst.state == State.FAILED and inst.restarts == 0 and len(starts(fake_env)) == 1
    assert inst.failure["kind"] == "unknown flag" and "--bogus-flag 3" in inst.failure["evidence"]
    assert "not retried" in inst.failure["fix"]


# -- stopping ------------------------------------------------------------------------------------


def test_stop_drains_in_flight_requests(world, rt, fake_env, monkeypatch) -> None:
    monkeypatch.setenv("FAKEVLLM_TOKEN_DELAY", "0.05")
    # a drain window far above the stream's 1.5 s: the default 2 s of these tests could end before a
    # loaded machine finished the stream, and this test is about the drain, not its speed
    sup = make_supervisor(world, rt, "server.shutdown_timeout=120")
    sup.start()
    assert sup.wait_ready(20)
    inst = sup.instances[0]
    chunks: list[str] = []

    def stream() -> None:
        body = json.dumps({"model": "m", "prompt": "x", "max_tokens": 30, "stream": True}).encode()
        req = urllib.request.Request(
            inst.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with _direct.open(req, timeout=30) as r:
            chunks.extend(line.decode() for line in r)

    t = threading.Thread(target=stream)
    t.start()
    wait_for(lambda: chunks, "a first chunk")
    pid = inst.pid
    sup.stop()
    wait_for(lambda: inst.state == State.STOPPING, "stopping")
    t.join(30)
    sup.wait(30)
    assert any("[DONE]" in c for c in chunks) and len([c for c in chunks if c.startswith("data: {")]) == 30
    assert inst.state == State.STOPPED and gone(pid)
    assert "Shutting down FastAPI HTTP server." in inst.log.path.read_text()


def test_what_ignores_sigterm_is_killed_with_its_group(world, rt, fake_env, monkeypatch, caplog) -> None:
    monkeypatch.setenv("FAKEVLLM_MODE", "ignore-term")
    sup = make_supervisor(world, rt, "server.shutdown_timeout=0", stop_margin=0.5)
    sup.start()
    assert sup.wait_ready(20)
    pid = sup.instances[0].pid
    # the server, its "engine" and the keeper (supervise/tether.py)
    names = [comm(m.pid) for m in group_members(pid)]
    assert len(names) == 3 and names.count("hwprofile-keep") == 1, names
    finish(sup)  # returns only once the group is gone: SIGTERM ignored, so SIGKILL after the margin
    assert gone(pid)
    assert sup.instances[0].state == State.STOPPED
    assert "after SIGTERM: SIGKILL to its process group" in caplog.text


# -- trust: a broken thread, a full log, the lock, stale state files ------------------------------


def test_a_broken_supervisor_thread_marks_its_instance_failed(world, rt, fake_env, monkeypatch) -> None:
    import hwprofile.supervise.instance as instance

    def broken(*_a: Any) -> list[str]:
        raise KeyError("boom")

    monkeypatch.setattr(instance, "compare", broken)  # breaks right after /health said 200
    sup = make_supervisor(world, rt)
    sup.start()
    sup.wait(20)
    inst = sup.instances[0]
    assert inst.state == State.FAILED and inst.failure["kind"] == "supervisor error"
    assert "KeyError" in inst.failure["evidence"] and gone(inst.pid)
    assert status(rt / "run")["instances"][0]["state"] == "failed"


def test_foreground_launch_exits_1_when_a_thread_breaks(world, rt, fake_env, monkeypatch) -> None:
    import hwprofile.supervise.instance as instance
    from hwprofile.pipeline import make_plan

    monkeypatch.setattr(instance, "compare", lambda *_a: 1 / 0)
    (rt / "etc").mkdir()
    plan = make_plan(world["host"], rt / "etc", sets=sets_for(world, free_port()), model=str(world["model"]))
    monkeypatch.setattr(signal, "signal", lambda *_a: None)  # keep pytest's own handlers
    assert foreground(Launch(plan, world["release"], "/nonexistent/vllm", None, None, rt / "run")) == 1


def test_log_pump_drops_lines_it_cannot_write_instead_of_blocking_vllm(
    world, rt, fake_env, monkeypatch
) -> None:
    monkeypatch.setenv("FAKEVLLM_MODE", "noisy")
    monkeypatch.setenv("FAKEVLLM_NOISE_LINES", "20000")  # ~1.7 MB: far beyond a 64 KiB pipe
    sup = make_supervisor(world, rt, ready_timeout=30)
    log = sup.instances[0].log

    def full(_data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(log, "_emit", full)
    sup.start()
    try:
        assert sup.wait_ready(30), sup.instances[0].failure
        assert log.dropped >= 20000 and "No space left on device" in log.last_error
        wait_for(
            lambda: (
                (read_state(rt / "run" / STATE_FILE) or {}).get("instances", [{}])[0].get("log_dropped_lines")
            ),
            "the count in the state file",
        )
        human = format_status(status(rt / "run"))
        assert "lines dropped (No space left on device" in human
        assert "Application startup complete." in log.text()  # the tail still has it
    finally:
        finish(sup)


def test_a_second_supervisor_is_refused(world, rt, fake_env) -> None:
    first = make_supervisor(world, rt)
    with pytest.raises(AlreadySupervising, match="already supervising in"):
        make_supervisor(world, rt)
    plan = first.plan
    with pytest.raises(Refused, match="already supervising in") as e:  # the one door refuses it too
        supervisor(Launch(plan, world["release"], "/nonexistent/vllm", None, None, rt / "run"))
    assert e.value.exit_code == 1  # a refusal, as a port taken: exit 1 from every command
    first.close()
    make_supervisor(world, rt).close()  # once released, a new one may start


def _dead_identity() -> Identity:
    p = subprocess.Popen(["sleep", "30"])
    ident = identify(p.pid)
    p.kill()
    p.wait()
    assert ident is not None
    return ident


def _state(supervisor: Identity, process: Identity | None, **extra: Any) -> dict[str, Any]:
    inst = {
        "name": "vllm-cpu",
        "state": "ready",
        "pid": process.pid if process else None,
        "pgid": process.pid if process else None,
        "process": process.to_json() if process else None,
        "url": "http://127.0.0.1:1",
        "restarts": 0,
        "ready_at": time.time(),
        "log_file": "/dev/null",
        "log_dir": "/dev",
        "stop_grace_s": 0.5,
        **extra,
    }
    return {
        "supervisor_pid": supervisor.pid,
        "supervisor": supervisor.to_json(),
        "profile": "cpu-only",
        "model": "m",
        "vllm_version": "0.32.0",
        "instances": [inst],
    }


def test_status_of_a_stale_state_file_and_stop_never_signals_a_reused_pid(rt) -> None:
    me = identify(os.getpid())
    reused = Identity(me.pid, me.start + 1)  # our PID, another start time: "someone else" now
    write_state(rt / STATE_FILE, _state(_dead_identity(), reused))
    st = status(rt)
    assert not st["running"] and st["stale"] and "gone" in st["stale_reason"]
    assert st["instances"][0]["state"] == "stale" and st["instances"][0]["process_check"] == "pid reused"
    assert st["instances"][0]["uptime_s"] is None
    human = format_status(st)
    assert "STALE state file" in human and "(pid reused)" in human
    done = stop(rt)  # would SIGTERM this very test process if it trusted the file
    assert any("not signalled" in d for d in done) and "pid reused" in done[-1]
    assert not (rt / STATE_FILE).exists()


def test_a_supervisor_pid_reused_by_another_process_is_not_trusted(rt) -> None:
    me = identify(os.getpid())
    write_state(rt / STATE_FILE, _state(Identity(me.pid, me.start - 1), None))
    st = status(rt)
    assert not st["running"] and "pid reused" in st["stale_reason"]
    assert stop(rt)[0].startswith("stale state file: supervisor pid")


def test_stop_with_a_dead_supervisor_ends_the_orphan_it_left(world, rt, fake_env, monkeypatch) -> None:
    monkeypatch.setenv("FAKEVLLM_MODE", "ignore-term")
    port = free_port()
    out = open(rt / "fake.out", "wb")  # noqa: SIM115
    orphan = subprocess.Popen(
        [str(world["shim"]), "serve", str(world["model"]), "--host", "127.0.0.1", "--port", str(port)],
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out.close()
    try:
        wait_for(lambda: http.healthy(f"http://127.0.0.1:{port}"), "the orphan ready")
        ident = identify(orphan.pid)
        assert len(group_members(orphan.pid)) == 2
        write_state(rt / STATE_FILE, _state(_dead_identity(), ident))
        assert status(rt)["instances"][0]["process_check"] == "alive"
        done = stop(rt)
        assert "not signalled" in done[0] and f"process group {orphan.pid} killed" in done[1]
        orphan.wait(5)
        assert gone(orphan.pid) and check(ident) == "gone"
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def test_stop_ends_what_a_zombie_leader_left_running(rt) -> None:
    """The recorded leader has exited but was never reaped (a zombie: its number is still its own);
    its child runs on in its group. stop signals no PID it cannot verify, yet ends that child."""
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & exit 0"], start_new_session=True)
    try:
        ident = identify(leader.pid)
        assert ident is not None
        wait_for(
            lambda: check(ident) == "gone" and len(group_members(leader.pid)) == 1, "the leader a zombie"
        )
        (child,) = group_members(leader.pid)
        write_state(rt / STATE_FILE, _state(_dead_identity(), ident))
        done = stop(rt)
        assert done[1] == f"vllm-cpu: pid {leader.pid}: gone; not signalled; 1 leftover processes killed", (
            done
        )
        assert check(child) == "gone" and not group_left(ident)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


_MAIN_THREAD_EXITS = """
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(300,)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_zombie_main_thread_with_live_threads_is_still_being_torn_down() -> None:
    """A threaded process whose main thread has exited shows as a zombie (``Zl``) while its other
    threads still hold its sockets and memory: group_left counts it until they are gone too."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _MAIN_THREAD_EXITS], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        ident = identify(proc.pid)
        assert ident is not None
        wait_for(lambda: check(ident) == "gone", "the main thread a zombie")
        assert group_members(proc.pid) == []  # a zombie: not a member that can be signalled
        assert group_left(ident) == [ident]  # but its sleeping thread is still there
        assert wait_group_gone(ident, 0.3) == [ident]  # and does not leave on its own
        os.killpg(proc.pid, signal.SIGKILL)
        assert wait_group_gone(ident) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- the command line ------------------------------------------------------------------------------


def test_cli_launch_status_refusal_stop(world, rt, fake_env) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    env.update(
        HWPROFILE_RUNTIME_DIR=str(rt / "run"),
        HWPROFILE_CONFIG_ROOT=str(rt / "etc"),
        HWPROFILE_CACHE_DIR=os.environ.get("HWPROFILE_CACHE_DIR", "off"),
    )
    args = ["--model", str(world["model"])]
    for s in sets_for(world, free_port(), f"logs.dir={rt / 'logs'}", "supervise.backoff_initial=0.1"):
        args += ["--set", s]

    def hw(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hwprofile", *a], env=env, capture_output=True, text=True, timeout=60
        )

    dry = hw("launch", "--dry-run", *args)
    assert dry.returncode == 0 and f"{world['shim']} serve {world['model']}" in dry.stdout
    up = hw("launch", *args)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "vllm-cpu: ready" in up.stdout
    st = json.loads(hw("status", "--json").stdout)
    assert st["running"] and st["instances"][0]["state"] == "ready"
    pid, sup_pid = st["instances"][0]["pid"], st["supervisor_pid"]
    # the detached supervisor runs the plan launch validated (a 0600 file), not a second detection
    plan_file = rt / "run" / LAUNCH_FILE
    cmdline = Path(f"/proc/{sup_pid}/cmdline").read_bytes().split(b"\0")
    assert b"--plan-file" in cmdline and str(plan_file).encode() in cmdline and b"--model" not in cmdline
    assert stat.S_IMODE(plan_file.stat().st_mode) == 0o600
    planned = json.loads(plan_file.read_text())["plan"]["instances"][0]
    assert st["instances"][0]["url"].endswith(f":{planned['server']['port']}")
    assert Path(st["instances"][0]["log_dir"]).parent == rt / "logs" / user_dirname()
    again = hw("launch", *args)
    assert again.returncode == 1 and f"already supervising in {rt / 'run'} (pid {sup_pid})" in again.stderr
    stopped = hw("stop")
    assert stopped.returncode == 0 and f"supervisor {sup_pid} stopped" in stopped.stdout
    assert gone(pid) and check(identify(pid) or Identity(pid, 0)) != "alive"
    assert not (rt / "run" / STATE_FILE).exists()
    human = hw("status").stdout
    assert "nothing is running; the last run" in human and "vllm-cpu: stopped" in human
    assert "nothing to stop" in hw("stop").stdout


def test_cli_status_and_stop_after_the_supervisor_was_killed(world, rt, fake_env) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    env.update(
        HWPROFILE_RUNTIME_DIR=str(rt / "run"),
        HWPROFILE_CONFIG_ROOT=str(rt / "etc"),
        HWPROFILE_CACHE_DIR=os.environ.get("HWPROFILE_CACHE_DIR", "off"),
    )
    args = ["--model", str(world["model"])]
    for s in sets_for(world, free_port(), f"logs.dir={rt / 'logs'}"):
        args += ["--set", s]
    sup = subprocess.Popen(
        [sys.executable, "-m", "hwprofile", "launch", "--foreground", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (
                ((read_state(rt / "run" / STATE_FILE) or {}).get("instances") or [{}])[0].get("state")
                == "ready"
            ),
            "ready",
            30,
        )
        pid = read_state(rt / "run" / STATE_FILE)["instances"][0]["pid"]
        sup.kill()  # hwprofile dies abruptly; vLLM gets SIGTERM from the kernel (parent-death signal)
        sup.wait()
        wait_for(lambda: gone(pid), "vLLM gone after its supervisor", 15, lambda: members(pid))

        def run(*a: str) -> subprocess.CompletedProcess[str]:
            return runcli.hwprofile(*a, env=env, timeout=60)

        st = json.loads(run("status", "--json").stdout)
        assert not st["running"] and st["stale"] and st["instances"][0]["state"] == "stale"
        assert st["instances"][0]["process_check"] == "gone"
        out = run("stop").stdout
        assert "stale state file" in out and "gone; not signalled" in out
        assert not lock_held(rt / "run") and not (rt / "run" / STATE_FILE).exists()
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


def test_a_vllm_ignoring_sigterm_dies_one_drain_after_its_supervisor_was_killed(world, rt, fake_env) -> None:
    """The parent-death signal is SIGTERM, which a hung or deaf vLLM ignores: its keeper
    (supervise/tether.py) SIGKILLs the group once the drain (shutdown_timeout + supervise.stop_margin) is over."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    env.update(
        HWPROFILE_RUNTIME_DIR=str(rt / "run"),
        HWPROFILE_CONFIG_ROOT=str(rt / "etc"),
        HWPROFILE_CACHE_DIR=os.environ.get("HWPROFILE_CACHE_DIR", "off"),
        FAKEVLLM_MODE="ignore-term",
    )
    args = ["--model", str(world["model"])]
    for s in sets_for(
        world, free_port(), f"logs.dir={rt / 'logs'}", "server.shutdown_timeout=0", "supervise.stop_margin=2"
    ):
        args += ["--set", s]
    sup = subprocess.Popen(
        [sys.executable, "-m", "hwprofile", "launch", "--foreground", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (
                ((read_state(rt / "run" / STATE_FILE) or {}).get("instances") or [{}])[0].get("state")
                == "ready"
            ),
            "ready",
            30,
        )
        inst = read_state(rt / "run" / STATE_FILE)["instances"][0]
        pid, grace = inst["pid"], inst["stop_grace_s"]
        assert grace == 2  # server.shutdown_timeout=0 + supervise.stop_margin=2
        sup.kill()
        sup.wait()
        t0 = time.monotonic()
        time.sleep(0.5)
        assert not gone(pid), "the fake ignores SIGTERM: it is still there during its drain"
        wait_for(
            lambda: gone(pid), "vLLM gone one drain after its supervisor", grace + 10, lambda: members(pid)
        )
        assert time.monotonic() - t0 >= 0.5
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


# -- a ready instance that stops serving -------------------------------------------------------------


def test_an_api_server_answering_503_after_its_engine_died_is_restarted(
    world, rt, fake_env, monkeypatch
) -> None:
    """Real vLLM 0.32 exits once its engine dies; a server that stays up answering 503 used to stay
    `ready` forever. Now /health failing for supervise.unhealthy_s restarts it, said and counted."""
    monkeypatch.setenv("FAKEVLLM_MODE", "sick")
    monkeypatch.setenv("FAKEVLLM_FAIL_TIMES", "1")  # the second start is healthy
    monkeypatch.setenv("FAKEVLLM_COUNTER", str(rt / "count"))
    monkeypatch.setenv("FAKEVLLM_SICK_AFTER", "0.3")
    clock = ManualClock()  # supervise.unhealthy_s passes when the test moves it, not on a slow machine
    sup = make_supervisor(world, rt, unhealthy_s=2, clock=clock)
    sup.start()
    try:
        inst = sup.instances[0]
        wait_for(lambda: inst.health_failing_since is not None, "/health failing noticed", 30)
        assert inst.state == State.READY  # not yet restarted: within supervise.unhealthy_s
        # the state file follows the attribute (the change is saved right after it is noticed)
        wait_for(lambda: "/health FAILING for" in format_status(status(rt / "run")), "status says it", 30)
        assert inst.unresponsive == 0 and inst.state == State.READY
        clock.advance(3.0)
        wait_for(
            lambda: inst.unresponsive == 1 and inst.state == State.READY, "restarted and ready again", 60
        )
        assert inst.failure["kind"] == "unresponsive" and "HTTP 503" in inst.failure["evidence"]
        assert inst.restarts == 1 and len(starts(fake_env)) == 2 and inst.health_failing_since is None
        assert "restarted 1 times for a /health that kept failing" in format_status(status(rt / "run"))
    finally:
        finish(sup)


def test_a_hung_server_is_restarted(world, rt, fake_env) -> None:
    """SIGSTOP (a hang): no answer at all. It used to stay `ready` in status while clients failed."""
    sup = make_supervisor(world, rt, "server.shutdown_timeout=1", unhealthy_s=2, stop_margin=0.5)
    sup.start()
    try:
        assert sup.wait_ready(20)
        inst = sup.instances[0]
        first = inst.pid
        os.kill(first, signal.SIGSTOP)
        wait_for(
            lambda: inst.unresponsive == 1 and inst.state == State.READY and inst.pid != first,
            "restarted",
            30,
        )
        assert "no answer" in inst.failure["evidence"] and gone(first)  # the stopped group was killed
    finally:
        finish(sup)


def test_a_frozen_server_fails_its_probes_at_once_and_is_restarting_while_it_drains(
    world, rt, fake_env
) -> None:
    """The whole server SIGSTOPped: each probe ends at its own deadline (shorter than unhealthy_s) and
    counts as failing at once; past unhealthy_s (the test's clock) it is `restarting`, not `ready`, for
    the whole drain (a stopped process takes its SIGTERM only once it runs again)."""
    clock = ManualClock()
    sup = make_supervisor(world, rt, "server.shutdown_timeout=60", unhealthy_s=4, clock=clock)
    sup.start()
    inst = sup.instances[0]
    first = None
    try:
        assert sup.wait_ready(60), inst.failure
        first = inst.pid
        assert first is not None
        os.killpg(first, signal.SIGSTOP)
        wait_for(lambda: inst.health_failing_since is not None, "a timed-out probe counted as failing", 30)
        assert inst.state == State.READY and inst.unresponsive == 0  # the clock stands: within unhealthy_s
        wait_for(lambda: "/health FAILING for" in format_status(status(rt / "run")), "status says it", 30)
        clock.advance(5)
        wait_for(lambda: inst.state == State.RESTARTING, "restarting while the frozen server drains", 30)
        assert not gone(first)  # still draining: its SIGTERM waits until it runs again
        os.killpg(first, signal.SIGCONT)
        wait_for(lambda: inst.state == State.READY and inst.pid != first, "ready again", 60)
        assert inst.unresponsive == 1 and "no answer" in inst.failure["evidence"] and gone(first)
    finally:
        if first is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(first, signal.SIGCONT)
        finish(sup)


def test_a_new_run_says_how_the_previous_one_ended(world, rt, fake_env) -> None:
    """A restarted daemon kept no record of why the previous one ended. The state file a killed
    supervisor left, or the last.json of a clean end, is read at the next start and kept."""
    (rt / "run").mkdir(mode=0o700)
    write_state(rt / "run" / STATE_FILE, _state(_dead_identity(), None))
    sup = make_supervisor(world, rt)
    assert sup.previous and "ended without cleaning up" in sup.previous and "vllm-cpu ready" in sup.previous
    sup.start()
    assert sup.wait_ready(20)
    assert "the run before: supervisor pid" in format_status(status(rt / "run"))
    sup.end_reason = "stopped by SIGTERM"
    finish(sup)
    assert read_state(rt / "run" / LAST_FILE)["end_reason"] == "stopped by SIGTERM"
    again = make_supervisor(world, rt)
    try:
        assert (
            again.previous and "stopped by SIGTERM" in again.previous and "vllm-cpu stopped" in again.previous
        )
    finally:
        again.close()


# -- a two-node group (tests/fakevllm.py's Group: vLLM 0.32's mp backend as measured) -------------------


def node_supervisors(world: dict[str, Any], rt: Path, **opts: Any) -> list[Supervisor]:
    """Node 0 and node 1 of one group on this host (tensor parallel 2 across two CPU "nodes" at
    127.0.0.1, as the real two-node test runs vLLM), each with its own runtime directory."""
    (rt / "etc").mkdir(exist_ok=True)
    sets = tuple(
        sets_for(
            world,
            free_port(),
            "layout.tensor_parallel_size=2",
            "layout.master_addr=127.0.0.1",
            f"layout.master_port={free_port()}",
        )
    )
    out = []
    unhealthy_s = opts.pop("unhealthy_s", 30.0)
    for rank in (0, 1):
        inputs = PlanInputs(
            world["host"],
            str(rt / "etc"),
            sets=sets,
            model=str(world["model"]),
            nodes=(world["host"],),
            addresses=("127.0.0.1", "127.0.0.1"),
            node_rank=rank,
        )
        supervise = {
            "ready_timeout": 20,
            "max_restarts": 5,
            "backoff_initial": 0.1,
            "backoff_max": 0.5,
            "stop_margin": 2.0,
            "unhealthy_s": unhealthy_s,
        }
        options = Options.from_settings(
            Supervise(**supervise), Logs(), rt / f"run{rank}", rt / f"logs{rank}", poll_interval=0.05
        )
        out.append(Supervisor(inputs.replan(), world["release"], "/nonexistent/vllm", None, options))
    return out


def test_a_two_node_group_is_ready_only_when_it_formed_and_its_status_shows_each_node(
    world, rt, fake_env
) -> None:
    s0, s1 = node_supervisors(world, rt)
    n0, n1 = s0.instances[0], s1.instances[0]
    assert not n0.inst.headless and n1.inst.headless and n1.url == n0.url
    s1.start()  # the headless node first: it waits for node 0 to form the group
    try:
        wait_for(lambda: n1.group_wait == "waiting for node 0 to form the group", "node 1 waiting", 10)
        time.sleep(0.5)
        assert n1.state == State.STARTING
        s0.start()
        assert s0.wait_ready(20) and s1.wait_ready(20)
        argv1 = starts(fake_env)[0]["argv"]
        assert "--headless" in argv1 and argv1[argv1.index("--node-rank") + 1] == "1"
        text = format_status(status(rt / "run1"))
        assert "node 1 of 2 (headless: the group answers at node 0)" in text and "ready" in text
        assert "node 0 of 2 (the group's API server)" in format_status(status(rt / "run0"))
        reply = http.post_json(n0.url + "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2})
        assert reply["choices"][0]["text"]
    finally:
        for s in (s1, s0):
            finish(s)


def test_a_killed_headless_node_brings_the_group_back_without_a_client_request(world, rt, fake_env) -> None:
    """Real vLLM: node 0's /health stays 200 when a headless node dies (it finds out at its next
    request), and a headless process started then joins nothing. Measured by hand before this:
    a group stayed half-dead until a client's request failed. Now node 1's new process sees node 0
    serving a group formed without it, asks node 0 one token (node 0's engine finds the member gone
    and exits), starts again when node 0's old group has ended, and the group forms anew."""
    s0, s1 = node_supervisors(world, rt)
    n0, n1 = s0.instances[0], s1.instances[0]
    s0.start()
    s1.start()
    try:
        assert s0.wait_ready(20) and s1.wait_ready(20)
        first0, first1 = n0.pid, n1.pid
        os.killpg(first1, signal.SIGKILL)
        wait_for(lambda: n1.restarts == 1, "node 1 restarted", 10)
        wait_for(
            lambda: n0.restarts == 1,
            "node 0 found its member gone and exited",
            20,
            why=lambda: format_status(status(rt / "run1")),
        )
        assert "unplanned exit" in n0.failure["kind"] and "exit code 0" in n0.failure["evidence"]
        wait_for(
            lambda: n0.state == n1.state == State.READY and n1.rejoins == 1,
            "the group formed again",
            20,
            why=lambda: format_status(status(rt / "run1")),
        )
        assert n0.pid != first0 and n1.pid != first1
        log1 = n1.log.path.read_text()
        assert (
            "probe of node 0" in log1
            and "HTTP 500" in log1
            and "rejoin: node 0's old group has ended" in log1
        )
        assert "started again 1 times to join node 0's next group" in format_status(status(rt / "run1"))
        reply = http.post_json(n0.url + "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2})
        assert reply["choices"][0]["text"]
    finally:
        for s in (s1, s0):
            finish(s)


def test_a_restarted_node_0_makes_the_headless_node_join_its_new_group(world, rt, fake_env) -> None:
    """Real vLLM: a headless node whose node 0 died stays alive, joined to nothing. When node 0
    answers again from a new API server (another process_start_time_seconds), node 1 starts anew at
    once; when node 0 stays away, supervise.unhealthy_s restarts it as for any server."""
    s0, s1 = node_supervisors(world, rt, unhealthy_s=30.0)
    n0, n1 = s0.instances[0], s1.instances[0]
    s0.start()
    s1.start()
    try:
        assert s0.wait_ready(20) and s1.wait_ready(20)
        first1 = n1.pid
        os.killpg(n0.pid, signal.SIGKILL)
        # node 0 comes back waiting for members; node 1's health watch notices /health failing ...
        wait_for(lambda: n1.health_failing_since is not None, "node 1 sees node 0 gone", 10)
        assert n1.state == State.READY and n1.pid == first1  # within supervise.unhealthy_s: no restart yet
        # ... and restarts its process only after supervise.unhealthy_s (30 s here): node 0 waits
        # for it meanwhile. With a short unhealthy_s the group forms again by itself:
    finally:
        for s in (s1, s0):
            finish(s)
    s0, s1 = node_supervisors(world, rt, unhealthy_s=1.0)
    n0, n1 = s0.instances[0], s1.instances[0]
    s0.start()
    s1.start()
    try:
        assert s0.wait_ready(20) and s1.wait_ready(20)
        os.killpg(n0.pid, signal.SIGKILL)
        wait_for(
            lambda: n0.restarts == 1 and n0.state == n1.state == State.READY and n1.unresponsive == 1,
            "the group formed again",
            30,
            why=lambda: format_status(status(rt / "run1")),
        )
    finally:
        for s in (s1, s0):
            finish(s)


# -- the runtime directory replaced under a running supervisor ------------------------------------------


def _daemon_over(sup: Supervisor, runtime: Path) -> Any:
    """The daemon's loop over a real supervisor (GPUs not read: the test is about its runtime directory)."""
    from test_overrides import _Sampler

    from hwprofile.daemon.loop import Daemon

    t = [0.0]
    plan = sup.plan
    return Daemon(
        plan, lambda sets: plan, sup, _Sampler(), plan.watch, plan.degrade, runtime, clock=lambda: t[0]
    )


def test_state_files_never_go_into_a_runtime_directory_that_replaced_ours(world, rt, fake_env) -> None:
    """Someone else's directory in place of the runtime directory (same path, another inode, another
    mode): the supervisor's own state.json writes (on every state change of an instance, here a SIGKILLed
    vLLM brought back) and its last.json at the end never go there, and nothing of theirs is removed;
    the daemon's /health says the trouble beside its answer while the instance serves."""
    from hwprofile.daemon.exporter import readiness

    sup = make_supervisor(world, rt, backoff_initial=0.05)
    run = rt / "run"
    d = _daemon_over(sup, run)
    sup.start()
    try:
        assert sup.wait_ready(20), sup.instances[0].record()
        inst = sup.instances[0]
        d.tick()
        assert readiness(d.published) == (True, "ready")
        shutil.rmtree(run)
        run.mkdir(mode=0o755)
        (run / "theirs").write_text("x")
        old = inst.pid
        os.kill(old, signal.SIGKILL)  # its supervisor restarts it: state changes, each a save()
        wait_for(lambda: inst.restarts == 1 and inst.state == State.READY and inst.pid != old, "the restart")
        assert sorted(os.listdir(run)) == ["theirs"]
        assert (
            sup.runtime_trouble and "replaced by a directory this process did not make" in sup.runtime_trouble
        )
        d.tick()
        ok, why = readiness(d.published)
        assert ok and why.startswith("ready; ") and "was replaced by a directory" in why, why
    finally:
        finish(sup)
    assert sorted(os.listdir(run)) == ["theirs"]  # no last.json there, nothing of theirs removed
    assert not lock_held(run)


def test_a_runtime_directory_the_daemon_made_again_gets_the_state_file_again(world, rt, fake_env) -> None:
    """Deleted (logout without linger), made again by the daemon's guard: the supervisor adopts it, and its
    state file is there again for `hwprofile status`."""
    sup = make_supervisor(world, rt)
    run = rt / "run"
    d = _daemon_over(sup, run)
    sup.start()
    try:
        assert sup.wait_ready(20), sup.instances[0].record()
        shutil.rmtree(run)
        sup.save()  # an instance's state change meanwhile: nothing to write into
        assert not run.exists() and sup.runtime_trouble and "is gone" in sup.runtime_trouble
        d.tick()  # the guard makes it again, 0700, with its lock
        assert sup.runtime_trouble is None and read_state(run / STATE_FILE) is not None
        assert status(run)["running"]
    finally:
        finish(sup)
    assert (run / LAST_FILE).exists() and not (run / STATE_FILE).exists()


def test_a_failed_instance_is_said_by_the_daemons_health(world, rt, fake_env, monkeypatch) -> None:
    """An instance that gave up (a vLLM that crashes at once, every time): /health answers 503 and
    names it, while the supervisor waits to try it again."""
    from hwprofile.daemon.exporter import readiness

    monkeypatch.setenv("FAKEVLLM_CRASH_AFTER", "0.05")
    sup = make_supervisor(world, rt, max_restarts=1, backoff_initial=0.05, retry_failed_s=600.0)
    d = _daemon_over(sup, rt / "run")
    sup.start()
    inst = sup.instances[0]
    seen: list[tuple[float | None, str]] = []  # at each move to failed: its retry_at and fix, as readers see
    moved = inst.machine._on_change
    assert moved is not None

    def watch(old: State, new: State) -> None:
        if new == State.FAILED:
            seen.append((inst.retry_at, (inst.failure or {}).get("fix", "")))
        moved(old, new)

    inst.machine._on_change = watch
    try:
        wait_for(lambda: inst.state == State.FAILED, "the give-up")
        # the cool-off is set before the state turns failed: never "failed, not tried again" between
        assert seen and seen[0][0] is not None and "tried again in 600 s" in seen[0][1], seen
        d.tick()
        ok, why = readiness(d.published)
        assert not ok and inst.name in why and "failed" in why.lower() and "tried again in" in why, why
    finally:
        finish(sup)


def test_the_tmpdir_made_in_tmp_goes_when_the_instance_ends(world, fake_env, tmp_path) -> None:
    """A runtime directory too long for vLLM's IPC socket paths: the instance's TMPDIR is a private
    directory it makes in /tmp when it starts a process (none before: an instance never started
    leaves nothing), and removes once its process is reaped (a daemon restarted for months must not
    leave one behind per start); one no longer as it was made is left alone."""
    from hwprofile.supervise.child import MAX_TMPDIR

    deep = tmp_path / ("r" * max(1, MAX_TMPDIR - len(str(tmp_path))))
    deep.mkdir()
    sup = make_supervisor(world, deep)
    inst = sup.instances[0]
    assert inst.tmp is None and not inst._made  # nothing made before a start
    sup.start()
    assert sup.wait_ready(20), inst.record()
    made = inst.tmp
    assert made is not None and made.parent == Path("/tmp") and made.is_dir()
    finish(sup)
    assert not made.exists()
    sup = make_supervisor(world, deep)
    inst = sup.instances[0]
    sup.start()
    assert sup.wait_ready(20), inst.record()
    made = inst.tmp
    assert made is not None
    made.chmod(0o755)  # not as made any more (an inode number alone may be reused)
    finish(sup)
    try:
        assert made.is_dir()
    finally:
        shutil.rmtree(made, ignore_errors=True)
