"""Live overrides and reload: the watchdog observer on the config root (editor saves through a temp file
and rename, deletes, a directory removed and created again, the root itself coming back), debounced on
the loop's clock; then end to end with the fake vLLM: an edited engine.max_num_seqs restarts the
instances one at a time with the new value, a comment-only edit and a watch.hot_c edit restart nothing
(the new hot_c is in daemon.json), a broken YAML keeps the last good plan with file:line in
daemon.json, a deleted override is a change, and ``hwprofile reload`` answers how it went."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_daemon_fast import _status, daemon_doc, daemon_env, flag, starts_of  # noqa: F401
from waiting import wait_for

from hwprofile.daemon.overrides import ConfigWatch, relevant


def save(path: Path, text: str) -> None:
    """As editors do: write a temp file beside it, then rename it over the target."""
    tmp = path.parent / f".{path.name}.swp"
    tmp.write_text(text)
    os.replace(tmp, path)


def delivered(w: ConfigWatch, timeout: float = 60) -> None:
    """Wait until inotify's events reached the watch (a loaded machine may take a while)."""
    end = time.monotonic() + timeout
    while not w.pending() and time.monotonic() < end:
        time.sleep(0.01)
    assert w.pending(), f"no event delivered within {timeout} s"


def settle(w: ConfigWatch, clock: list[float], step: float = 0.1, limit: float = 60.0) -> str | None:
    """Tick the fake clock until poll gives a reason (or ``limit`` fake seconds, half as many real
    ones, pass: it returns as soon as the reason comes, so a loaded machine gets a wide margin)."""
    end = clock[0] + limit
    while clock[0] < end:
        time.sleep(0.05)  # real time for inotify to deliver
        why = w.poll(clock[0])
        if why:
            return why
        clock[0] += step
    return None


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "etc"
    for d in ("profiles", "overrides.d", "rules.d"):
        (r / d).mkdir(parents=True)
    return r


def test_relevant_paths(root) -> None:
    assert relevant(root, str(root / "overrides.d" / "10-site.yaml"))
    assert relevant(root, str(root / "rules.d" / "x.yml"))
    assert relevant(root, str(root / "overrides.d"))
    assert not relevant(root, str(root / "overrides.d" / ".10-site.yaml.swp"))
    assert not relevant(root, str(root / "overrides.d" / "notes.txt"))
    assert not relevant(root, str(root / "other" / "a.yaml"))
    assert not relevant(root, "/elsewhere/overrides.d/a.yaml")


def test_a_burst_of_edits_is_one_reload_after_the_quiet_period(root) -> None:
    clock = [0.0]
    w = ConfigWatch(root, quiet_s=0.5)
    try:
        f = root / "overrides.d" / "10-site.yaml"
        save(f, "engine:\n  max_num_seqs: 128\n")
        delivered(w)
        assert w.poll(clock[0]) is None  # events seen: the quiet period starts now
        clock[0] += 0.3
        save(f, "engine:\n  max_num_seqs: 64\n")  # more of the burst: the quiet period restarts
        delivered(w)
        assert w.poll(clock[0]) is None
        clock[0] += 0.3
        assert w.poll(clock[0]) is None  # 0.3 s quiet < 0.5 s
        clock[0] += 0.3
        why = w.poll(clock[0])
        assert why and "10-site.yaml" in why
        assert w.poll(clock[0] + 10) is None  # delivered once
        # reading the files (what a re-plan does) is no change
        f.read_text()
        assert settle(w, clock, limit=1.0) is None
        # a deleted override is a change
        f.unlink()
        assert "deleted" in (settle(w, clock) or "")
        # a non-YAML file is not
        (root / "overrides.d" / "README").write_text("x")
        assert settle(w, clock, limit=1.0) is None
    finally:
        w.close()
    assert not w.observer.is_alive()


def test_directories_that_go_and_come_back_are_watched_again(root) -> None:
    clock = [0.0]
    w = ConfigWatch(root, quiet_s=0.2)
    try:
        shutil.rmtree(root / "overrides.d")
        assert settle(w, clock)
        (root / "overrides.d").mkdir()
        assert settle(w, clock)
        time.sleep(0.2)
        save(root / "overrides.d" / "a.yaml", "watch:\n  hot_c: 80\n")
        assert "a.yaml" in (settle(w, clock) or "")
        # the root itself: gone, then back (a new inode): scheduled again
        shutil.rmtree(root)
        assert "gone" in (settle(w, clock) or "")
        (root / "overrides.d").mkdir(parents=True)
        assert "back" in (settle(w, clock) or "")
        save(root / "overrides.d" / "b.yaml", "watch:\n  hot_c: 81\n")
        assert "b.yaml" in (settle(w, clock) or "")
    finally:
        w.close()


def _starts(e, port):
    return len(starts_of(e["starts"], port)), len(starts_of(e["starts"], port + 1))


def _reloaded(e, since: float):
    d = daemon_doc(e["runtime"])
    r = d.get("reload") or {}
    return d if r.get("at", 0) > since else None


def test_live_overrides_end_to_end(daemon_env, tmp_path) -> None:  # noqa: F811
    e = daemon_env
    root = Path(e["env"]["HWPROFILE_CONFIG_ROOT"])
    (root / "overrides.d").mkdir()
    site = root / "overrides.d" / "10-site.yaml"
    site.write_text("engine:\n  max_num_seqs: 256\n")
    sets = [s for s in e["sets"] if not s.startswith("engine.max_num_seqs=")]  # --set would outrank the file
    port = int(next(s.split("=")[1] for s in sets if s.startswith("server.port=")))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hwprofile",
            "daemon",
            "--model",
            str(e["model"]),
            "--watch-quiet=0.3",
            *["--set=" + s for s in sets],
        ],
        env=e["env"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: len(_status(e)) == 2 and all(i["state"] == "ready" for i in _status(e)), "ready", 60)
        wait_for(lambda: daemon_doc(e["runtime"]).get("ticks"), "a tick")
        assert _starts(e, port) == (1, 1)
        # comment-only edit: re-planned, nothing restarts
        t = time.time()
        save(site, "# tuned for the A800 box\nengine:\n  max_num_seqs: 256  # the site's value\n")
        doc = wait_for(lambda: _reloaded(e, t), "the comment-only reload")
        assert doc["reload"]["outcome"] == "applied" and "no instance changed" in doc["reload"]["detail"]
        # watch.hot_c: the daemon's own setting, applied without a restart
        t = time.time()
        save(site, "engine:\n  max_num_seqs: 256\nwatch:\n  hot_c: 79\n")
        doc = wait_for(lambda: _reloaded(e, t), "the hot_c reload")
        assert (
            "watch.* applied" in doc["reload"]["detail"] and "no instance changed" in doc["reload"]["detail"]
        )
        assert wait_for(lambda: daemon_doc(e["runtime"]).get("watch", {}).get("hot_c") == 79, "hot_c 79")
        assert _starts(e, port) == (1, 1)
        # broken YAML: the last good plan stays, the error has file and line
        t = time.time()
        save(site, "engine:\n  max_num_seqs: [256\nwatch:\n  hot_c: 79\n")
        doc = wait_for(lambda: _reloaded(e, t), "the failed reload")
        assert doc["reload"]["outcome"] == "failed"
        assert re.search(r"10-site\.yaml:\d+: invalid YAML", doc["reload_error"]), doc["reload_error"]
        assert any("10-site.yaml" in x for x in doc["errors"])
        # `hwprofile reload` reports the same refusal (exit 1)
        r = subprocess.run(
            [sys.executable, "-m", "hwprofile", "reload"], env=e["env"], capture_output=True, text=True
        )
        assert r.returncode == 1 and "last good plan is kept" in r.stderr and "10-site.yaml" in r.stderr, r
        assert _starts(e, port) == (1, 1)
        assert all(i["state"] == "ready" for i in _status(e))
        # a real change: both instances restart, one at a time, with the new value
        t = time.time()
        save(site, "engine:\n  max_num_seqs: 128\nwatch:\n  hot_c: 79\n")
        wait_for(lambda: _starts(e, port) == (2, 2), "both restarted", 60)
        a, b = starts_of(e["starts"], port)[-1], starts_of(e["starts"], port + 1)[-1]
        assert flag(a, "--max-num-seqs") == "128" and flag(b, "--max-num-seqs") == "128"
        doc = wait_for(
            lambda: (
                (d := daemon_doc(e["runtime"]))
                and [x["outcome"] for x in d.get("actions", []) if x["kind"] == "reload"]
                == ["started", "done"] * 2
                and d
            ),
            "two reload restarts done",
        )
        reloads = [x for x in doc["actions"] if x["kind"] == "reload"]
        # one at a time: the second started only after the first was done (ready again)
        assert reloads[1]["at"] <= reloads[2]["at"] and reloads[0]["instance"] != reloads[2]["instance"]
        # the deleted override is a change too: back to what the plan chooses without it (the A800
        # profile's 192, doubled by layout.objective for this model: layout.batching=predicted)
        site.unlink()
        wait_for(lambda: _starts(e, port) == (3, 3), "restarted after the delete", 60)
        assert flag(starts_of(e["starts"], port)[-1], "--max-num-seqs") == "384"
        wait_for(
            lambda: (
                all(i["state"] == "ready" for i in _status(e))
                and not daemon_doc(e["runtime"])["restarting"]
                and not daemon_doc(e["runtime"])["pending_restarts"]
            ),
            "settled",
            60,
        )
        # `hwprofile reload` with nothing changed: applied, no restart
        r = subprocess.run(
            [sys.executable, "-m", "hwprofile", "reload"], env=e["env"], capture_output=True, text=True
        )
        assert r.returncode == 0 and "no instance changed" in r.stdout, r
        assert _starts(e, port) == (3, 3)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(60)
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 0, err[-3000:]
    assert "the configuration is invalid, the last good plan is kept" in err


# -- Daemon.reload / apply_plan with fakes: the loop's side, no processes ------------------------------
class _Inst:
    def __init__(self, name: str) -> None:
        from hwprofile.supervise.lifecycle import State

        self.name, self.state, self.replacements, self.replacing, self.restarts = (
            name,
            State.READY,
            0,
            False,
            0,
        )
        self.got: list = []  # the InstancePlans it was asked to restart with
        self.failure = None

    def replace(self, inst) -> None:
        self.got.append(inst)
        self.replacing = True


class _Sup:
    """The supervisor as the daemon sees it: its instances, its release, its render."""

    def __init__(self, names: list[str]) -> None:
        from hwprofile.render.versions import release

        self.instances = [_Inst(n) for n in names]
        self.release = release("0.32.0")

    def render(self, plan, inst):  # -> Rendered
        from hwprofile.render.translate import render_instance

        return render_instance(plan, inst, self.release, "vllm", None)


class _Sampler:
    def sample(self, now: float) -> list:
        return []


def _plan(seqs: dict[str, int], hot: float = 82.0):  # -> Plan
    from hwprofile.config.settings import Degrade, Logs, Supervise, Watch
    from hwprofile.plan.types import (
        EngineSettings,
        Estimate,
        HostSummary,
        InstancePlan,
        MemoryFit,
        ModelSummary,
        Plan,
        ServerSettings,
    )

    def inst(i: int, name: str, seqs: int) -> InstancePlan:
        return InstancePlan(
            name=name,
            device="cuda",
            gpus=(i,),
            gpu_name=None,
            numa_node=None,
            cpus=None,
            tensor_parallel_size=1,
            pipeline_parallel_size=1,
            server=ServerSettings("127.0.0.1", 9000 + i, None, None, 10, None, None, True, ()),
            engine=EngineSettings(
                gpu_memory_utilization=0.9,
                max_model_len=1024,
                max_num_seqs=seqs,
                max_num_batched_tokens=2048,
                kv_cache_dtype="auto",
                quantization=None,
                dtype="auto",
                enforce_eager=False,
                enable_prefix_caching=True,
                enable_chunked_prefill=True,
            ),
            speculative=None,
            memory=MemoryFit(*[0] * 12),
            estimate=Estimate(),
        )

    return Plan(
        schema="hwprofile.plan/1",
        profile="test",
        matched_because=(),
        host=HostSummary(None, 2, None),
        model=ModelSummary("m", *[None] * 14),
        draft=None,
        instances=tuple(inst(i, n, s) for i, (n, s) in enumerate(seqs.items())),
        supervise=Supervise(),
        logs=Logs(),
        watch=Watch(hot_c=hot),
        degrade=Degrade(),
        reasons=(),
        provenance={},
        warnings=(),
    )


def _daemon(tmp_path, plans: list):
    from hwprofile.daemon.loop import Daemon

    seq = iter(plans)

    def replan(extra: list[str]):  # -> Plan
        p = next(seq)
        if isinstance(p, Exception):
            raise p
        return p

    first = _plan({"a": 256, "b": 256})
    d = Daemon(
        first, replan, _Sup(["a", "b"]), _Sampler(), first.watch, first.degrade, tmp_path, clock=lambda: 0.0
    )
    calls: list[str] = []
    d.on_reloading = lambda _d: calls.append("RELOADING")
    d.on_reloaded = lambda _d: calls.append("READY")
    return d, calls


def test_reload_restarts_only_changed_instances_one_at_a_time(tmp_path) -> None:
    d, calls = _daemon(tmp_path, [_plan({"a": 256, "b": 128}, hot=79.0), _plan({"a": 64, "b": 64}, hot=79.0)])
    d.request_reload("test")
    d.tick()
    assert calls == ["RELOADING", "READY"] and d.settings.hot_c == 79.0 and d.watcher.settings.hot_c == 79.0
    a, b = d.sup.instances
    assert a.got == [] and [i.engine.max_num_seqs for i in b.got] == [128]  # only b
    assert "watch.* applied" in d.last_reload["detail"]
    b.replacements, b.replacing = 1, False  # b is ready again
    d.tick()
    assert d.current is None
    d.request_reload("both")
    d.tick()
    assert len(a.got) == 1 and len(b.got) == 1 and d.pending  # a restarts first; b waits for it
    a.replacements, a.replacing = 1, False
    d.tick()
    d.tick()
    assert len(b.got) == 2 and not d.pending


def test_a_reload_reaches_a_failed_instance_that_is_tried_again(tmp_path) -> None:
    """The soak: a failed instance refused every later override ("is failed: its new settings are not
    applied"). One that is tried again after its cool-off gets them for that try; one that is not (no
    retry) is said, as before."""
    import time

    from hwprofile.supervise.lifecycle import State

    d, _ = _daemon(tmp_path, [_plan({"a": 128, "b": 128}), _plan({"a": 64, "b": 64})])
    a, b = d.sup.instances
    a.state, a.retry_at = State.FAILED, time.time() + 200
    b.state, b.retry_at = State.FAILED, None
    d.request_reload("test")
    d.tick()
    assert [i.engine.max_num_seqs for i in a.got] == [128] and b.got == []
    assert not any("a is failed" in e for e in d.errors)
    assert any("reload: b is failed: its new settings are not applied" in e for e in d.errors)


def test_a_refused_reload_keeps_the_plan_and_still_says_ready(tmp_path) -> None:
    from hwprofile.config import ConfigError

    d, calls = _daemon(
        tmp_path,
        [
            ConfigError("/etc/hwprofile/overrides.d/x.yaml:3: invalid YAML"),
            _plan({"a": 256, "b": 256, "c": 256}),
        ],
    )
    before = d.plan
    d.request_reload("broken")
    d.tick()
    assert calls == ["RELOADING", "READY"] and d.plan is before
    assert d.reload_error == "/etc/hwprofile/overrides.d/x.yaml:3: invalid YAML"
    assert d.document()["reload"]["outcome"] == "failed"
    from hwprofile.daemon.notify import status_line

    assert "reload failed, last good plan kept: /etc/hwprofile/overrides.d/x.yaml:3" in status_line(d)
    d.request_reload("an instance more")
    d.tick()  # apply_plan raises: READY=1 still comes (finally), the plan stays
    assert calls == ["RELOADING", "READY"] * 2 and d.plan is before and "restart the daemon" in d.reload_error
