"""render_instance is a list of emitters, one concern each, writing through one Argv builder: each
runs alone on a fresh builder, touches only its own flags and variables, and the composition is
the render (the golden renders in test_render.py prove the output unchanged)."""

from __future__ import annotations

from typing import Any

import pytest

from hwprofile.release import release
from hwprofile.render import translate
from hwprofile.render.translate import EMITTERS, Argv, Target, render_instance


def _target(plan: Any, version: str, numactl: str | None = None, i: int = 0) -> Target:
    inst = plan.instances[i]
    rel = release(version)
    notes: list[str] = []
    args, speculating = translate._speculative(plan, inst, inst.engine, rel, notes)
    return Target(plan, inst, rel, numactl, args, speculating, notes)


def _run(emit: Any, t: Target) -> Argv:
    out = Argv(t.rel)
    emit(t, out)
    return out


@pytest.fixture
def a800(host_of, empty_root) -> Any:
    from hwprofile.pipeline import make_plan

    host = host_of("a800-pcie-4x-2numa")
    return make_plan(host, empty_root, environ={}, model="Qwen/Qwen3-8B", sets=["layout.shape=servers"])


def test_the_composition_is_the_render(a800) -> None:
    """Running the emitters in order on one builder gives render_instance's argv, env and warnings."""
    for version in ("0.8.3", "0.18.0", "0.33.0"):
        t = _target(a800, version, "/usr/bin/numactl")
        out = Argv(t.rel)
        for emit in EMITTERS:
            emit(t, out)
        r = render_instance(a800, t.inst, t.rel, "vllm", "/usr/bin/numactl")
        assert (out.args, out.env, out.warnings, out.prefix) == (r.args, r.env, r.warnings, r.prefix)
        assert r.args[:2] == [("--host", t.inst.server.host), ("--port", t.inst.server.port)]


def test_each_emitter_writes_only_its_own_concern(a800) -> None:
    t = _target(a800, "0.33.0", "/usr/bin/numactl")
    flags = {emit.__name__: [f for f, _ in _run(emit, t).args] for emit in EMITTERS}
    env = {emit.__name__: set(_run(emit, t).env) for emit in EMITTERS}
    assert flags["emit_server"] == ["--host", "--port"] + (
        ["--served-model-name"] if t.inst.server.served_model_name else []
    )
    assert flags["emit_batching"] == [
        "--gpu-memory-utilization",
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
    ]
    assert set(flags["emit_numa"]) <= {"--numa-bind", "--numa-bind-nodes"}
    assert env["emit_gpu_devices"] >= {"CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES"}
    assert "VLLM_NO_USAGE_STATS" in env["emit_environment"]
    # no two emitters emit the same flag or variable
    seen_flags = [f for name in flags for f in flags[name]]
    assert len(seen_flags) == len(set(seen_flags)), seen_flags
    seen_env = [k for name in env for k in env[name]]
    assert len(seen_env) == len(set(seen_env)), seen_env


def test_numa_emitter_by_release(a800) -> None:
    """vLLM binds its own workers where it has --numa-bind-nodes (0.20+); before, numactl in front,
    and without numactl a warning and nothing bound."""
    inst = a800.instances[0]
    assert inst.numa_node is not None
    new = _run(translate.emit_numa, _target(a800, "0.33.0", "/usr/bin/numactl"))
    assert [f for f, _ in new.args] == ["--numa-bind", "--numa-bind-nodes"] and not new.prefix
    old = _run(translate.emit_numa, _target(a800, "0.18.0", "/usr/bin/numactl"))
    n = inst.numa_node
    assert not old.args and old.prefix == ["/usr/bin/numactl", f"--cpunodebind={n}", f"--membind={n}", "--"]
    bare = _run(translate.emit_numa, _target(a800, "0.18.0", None))
    assert not bare.args and not bare.prefix and "numactl not found" in bare.warnings[0]


def test_shutdown_and_logging_emitters_follow_the_release(a800) -> None:
    new = _run(translate.emit_shutdown, _target(a800, "0.33.0"))
    assert new.args == [("--shutdown-timeout", a800.instances[0].server.shutdown_timeout)]
    old = _run(translate.emit_shutdown, _target(a800, "0.16.0"))
    assert not old.args and "does not drain" in old.warnings[0]
    assert ("--disable-access-log-for-endpoints", "/health,/metrics,/ping") in _run(
        translate.emit_logging, _target(a800, "0.33.0")
    ).args


def test_argv_builder_says_what_it_dropped() -> None:
    out = Argv(release("0.8.0"))
    assert not out.add("--numa-bind", None, "why") and out.warnings == [
        "--numa-bind does not exist in vLLM 0.8.0: not emitted (why)"
    ]
    assert out.choice("--dtype", "no-such-dtype", "left alone") is None and "left alone" in out.warnings[1]
    out.put("--max-num-batched-tokens", 1)
    out.replace("--max-num-batched-tokens", 2)
    assert out.args == [("--max-num-batched-tokens", 2)]
