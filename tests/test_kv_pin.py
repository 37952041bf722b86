"""The KV pool pinned in bytes (supervise.pin_kv_pool): each profiled start's pool, as vLLM logs it,
recorded per host, GPUs, release, model and settings; the next plan of the same instance pins the
smallest pool not measured on a cold compile cache, with the start it came from in the reason; a
plan on other GPUs, or with other settings, is never pinned to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_supervisor_fast import fake_env, plan_inputs, rt, starts, world  # noqa: F401 (fixtures)
from waiting import wait_for

from hwprofile.config.settings import Logs, Supervise
from hwprofile.pipeline import kv_pools_path, load_kv_pools, make_plan
from hwprofile.plan.kvpin import GiB, add_record, choose, measured_bytes, parse_pools, pool_key
from hwprofile.plan.types import Plan
from hwprofile.render.translate import render_instance
from hwprofile.supervise.lifecycle import State
from hwprofile.supervise.options import Options
from hwprofile.supervise.supervisor import Supervisor
from hwprofile.supervise.verify import parse_startup

SETS = ["engine.gpu_memory_utilization=0.6", "engine.max_model_len=1024", "speculative.method=none"]


def test_the_log_lines_are_vllms() -> None:
    cold = parse_startup(
        "non-default args: {'model_tag': 'm'}\n"
        "(EngineCore pid=1) INFO [backends.py:418] Compiling a graph for compile range (1, 8192) takes 41.20 s\n"
        "(EngineCore pid=1) INFO [gpu_worker.py:775] Available KV cache memory: 17.23 GiB\n"
    )
    assert cold["kv_pool_gib"] == "17.23" and cold["compile"] == "cold"
    warm = parse_startup(
        "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 3.1 s\n"
        "Available KV cache memory: 18.1 GiB\n"
    )
    assert (warm["kv_pool_gib"], warm["compile"]) == ("18.1", "warm")
    assert parse_startup("Available KV cache memory: 9.50 GiB\n")["compile"] == "eager"
    pinned = parse_startup(
        "reserved 18.09 GiB memory for KV Cache as specified by kv_cache_memory_bytes config\n"
    )
    assert "kv_pool_gib" not in pinned
    # two decimals of GiB: the bytes are half a step lower, never above what vLLM measured
    assert 17.225 * GiB <= measured_bytes("17.23") < 17.23 * GiB


def test_the_smallest_warm_pool_is_chosen_and_a_cold_one_never() -> None:
    recs = [
        {"bytes": 10, "at": 1.0, "compile": "cold"},
        {"bytes": 30, "at": 2.0, "compile": "warm"},
        {"bytes": 20, "at": 3.0, "compile": "eager"},
    ]
    assert choose(recs) == recs[2]
    assert choose(recs[:1]) is None and choose([]) is None
    doc: Any = None
    for i in range(12):
        doc = add_record(doc, "k", 100 + i, float(i), "warm")
    assert [r["bytes"] for r in parse_pools(doc)["k"]] == list(range(104, 112))  # the newest 8
    assert parse_pools({"schema": "other", "pools": {"k": []}}) == {}
    assert parse_pools({"schema": "hwprofile.kv-pools/1", "pools": {"k": [{"bytes": "1", "at": 1}]}}) == {}


def test_the_key_names_the_gpus_the_release_and_every_setting(host_of, empty_root, tmp_path: Path) -> None:
    from vllmtools import fake_model

    model = str(fake_model(tmp_path / "model"))
    a = make_plan(host_of("rtx4090-1x"), empty_root, environ={}, model=model, sets=SETS)
    again = make_plan(host_of("rtx4090-1x"), empty_root, environ={}, model=model, sets=SETS)
    assert pool_key(a, a.instances[0]) == pool_key(again, again.instances[0])
    # the detached supervisor and the daemon hold the plan as launch.json saved it: the same key
    back = Plan.from_json(json.loads(json.dumps(a.to_json())))
    assert pool_key(back, back.instances[0]) == pool_key(a, a.instances[0])
    other_setting = make_plan(
        host_of("rtx4090-1x"), empty_root, environ={}, model=model, sets=[*SETS, "engine.max_num_seqs=3"]
    )
    assert pool_key(other_setting, other_setting.instances[0]) != pool_key(a, a.instances[0])
    other_gpu = make_plan(host_of("rtx3090-2x"), empty_root, environ={}, model=model, sets=SETS)
    assert pool_key(other_gpu, other_gpu.instances[0]) != pool_key(a, a.instances[0])


def supervisor(w: dict[str, Any], where: Path, host: Any, pools: Path) -> Supervisor:
    inputs = plan_inputs(w, where, *SETS, "supervise.pin_kv_pool=true", host=host)
    opts = Options.from_settings(
        Supervise(ready_timeout=20, backoff_initial=0.1),
        Logs(),
        where / "run",
        where / "logs",
        poll_interval=0.05,
        kv_pools=pools,
    )
    return Supervisor(inputs.replan(), w["release"], "/nonexistent/vllm", None, opts, replan=inputs.replan)


def test_measured_then_pinned_on_the_same_gpus_only(world, rt, fake_env, host_of, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setenv("HWPROFILE_STATE_DIR", str(rt / "state"))
    host = host_of("rtx4090-1x")
    pools = Path(kv_pools_path())
    monkeypatch.setenv("FAKEVLLM_KV_POOL_GIB", "15.80")
    monkeypatch.setenv("FAKEVLLM_COMPILE", "cold")  # the first start: a cold compile cache, a smaller pool
    sup = supervisor(world, rt, host, pools)
    try:
        first = sup.instances[0].inst
        assert (
            first.engine.kv_cache_memory_bytes is None or not first.engine.kv_cache_memory_bytes
        )  # nothing yet
        assert any("not pinned: no pool vLLM measured" in r.reason for r in sup.plan.reasons)
        sup.start()
        assert sup.wait_ready(30)
        inst = sup.instances[0]
        (recs,) = wait_for(lambda: load_kv_pools() or None, "the first record").values()
        assert [(r["bytes"], r["compile"]) for r in recs] == [(measured_bytes("15.80"), "cold")]
        # only a cold measurement: not pinned yet
        inputs = plan_inputs(world, rt, *SETS, "supervise.pin_kv_pool=true", host=host)
        cold_only = inputs.replan()
        assert not cold_only.instances[0].engine.kv_cache_memory_bytes
        assert any("all on a cold compile cache" in r.reason for r in cold_only.reasons)
        # a warm start (the same plan, restarted as the daemon's recover does) measures more
        monkeypatch.setenv("FAKEVLLM_KV_POOL_GIB", "17.23")
        monkeypatch.setenv("FAKEVLLM_COMPILE", "warm")
        inst.replace(inst.inst)
        wait_for(lambda: inst.replacements == 1 and inst.state == State.READY, "ready again")
        wait_for(lambda: len(next(iter(load_kv_pools().values()))) == 2, "the second record")
    finally:
        sup.stop()
        sup.wait(60)
        sup.close()
    # the next plan of this instance pins the warm pool, in bytes, saying which start it came from
    plan = plan_inputs(world, rt, *SETS, "supervise.pin_kv_pool=true", host=host).replan()
    (pinned,) = plan.instances
    assert pinned.engine.kv_cache_memory_bytes == measured_bytes("17.23")
    (why,) = [r for r in plan.reasons if r.key == "instances[0].engine.kv_cache_memory_bytes"]
    assert why.value == measured_bytes("17.23") and "calibrated from the start at 20" in why.reason
    argv = render_instance(plan, pinned, world["release"], "vllm", None).argv
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(measured_bytes("17.23"))
    assert json.loads(pools.read_text())["schema"] == "hwprofile.kv-pools/1"
    # off by default: the same inputs without the setting pin nothing
    plain = plan_inputs(world, rt, *SETS, host=host).replan()
    assert not plain.instances[0].engine.kv_cache_memory_bytes
    # other GPUs (another host's UUIDs), or other settings: never pinned to this pool
    elsewhere = plan_inputs(
        world, rt, *SETS, "supervise.pin_kv_pool=true", host=host_of("rtx3090-2x")
    ).replan()
    assert not elsewhere.instances[0].engine.kv_cache_memory_bytes
    changed = plan_inputs(
        world, rt, *SETS, "engine.max_num_seqs=3", "supervise.pin_kv_pool=true", host=host
    ).replan()
    assert not changed.instances[0].engine.kv_cache_memory_bytes
