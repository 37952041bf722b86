"""Models larger than one node: plans over several hosts' snapshots (plan/nodes.py), each node's
render (vLLM's --nnodes/--headless, data parallel across nodes, the Ray backend), the link between
the nodes in the estimate, the refusals, and the CLI's --from/--inventory/--node-rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import inproc
import pytest

from hwprofile.pipeline import PlanInputs, make_plan
from hwprofile.plan import PlanRefused
from hwprofile.render.translate import Unrenderable, render_instance
from hwprofile.render.versions import release

BIG = "Qwen/Qwen2.5-72B-Instruct"  # 145 GB of bf16 weights: more than one A100 80G, more than two too
HUGE = "Qwen/Qwen3-235B-A22B"  # 470 GB: more than one 4xA800 host
ADDR = ("10.0.0.1", "10.0.0.2", "10.0.0.3")


def plan_over(host_of, root, name, n, model=BIG, sets=(), version="0.32.0"):
    host = host_of(name)
    host = host._replace(software=host.software._replace(vllm_version=version))
    return make_plan(
        host,
        root,
        environ={},
        model=model,
        sets=["speculative.method=none", *sets],
        nodes=[host] * (n - 1),
        addresses=ADDR[:n],
    )


def reason(p, key: str) -> str:
    return next(r.reason for r in p.reasons if r.key == key)


def argv(p, inst, version="0.32.0"):
    return render_instance(p, inst, release(version), "vllm", None)


def test_a_model_too_big_for_two_nodes_is_a_pipeline_over_three(host_of, empty_root) -> None:
    # a 16384-token step (the a100-80g profile's before it took vLLM's 2048): 2 nodes just too small
    big_step = ["engine.max_num_batched_tokens=16384"]
    with pytest.raises(PlanRefused, match="does not fit even 2 node"):
        plan_over(
            host_of, empty_root, "a100-80g-pcie-1x", 2, sets=big_step
        )  # 70 GiB a stage: over 0.92 of 80 GiB
    p = plan_over(host_of, empty_root, "a100-80g-pcie-1x", 3, sets=big_step)
    n0, _n1, n2 = p.instances
    assert (p.nodes, [i.node for i in p.instances], n0.nnodes) == (3, [0, 1, 2], 3)
    assert (n0.pipeline_parallel_size, n0.tensor_parallel_size) == (3, 1)
    assert "does not fit one node: pipeline parallel over 3 nodes" in reason(p, "layout.nodes")
    assert (n0.master_addr, n0.master_port, n2.node_address) == ("10.0.0.1", 29501, "10.0.0.3")
    # each node holds a stage: about a third of the weights (the embeddings counted whole on each)
    assert n0.memory.weights_bytes < 0.4 * p.model.weights_bytes
    # the link between the nodes: one hidden state per token per stage boundary, in the estimate
    est = n0.estimate
    assert (est.nodes_parallel, est.internode_bytes_per_token) == (
        "pipeline",
        2 * 8192 * 2,
    )  # hidden 8192, bf16
    assert est.internode_gbps == 100 and est.internode_latency_us == 20
    assert est.internode_ms_per_token == pytest.approx((32768 * 8 / 100e9 + 2 * 20e-6) * 1e3, abs=1e-4)
    # the group's ceiling: the three stages' weight reads one after another, plus the link
    stage = est.decode_tok_s_ceiling_batch1
    group = 1 / (3 / stage + est.internode_ms_per_token / 1e3)
    assert est.decode_tok_s_ceiling_batch1_group == pytest.approx(group, abs=0.1)  # rounded to 0.1 tok/s
    assert p.to_json()["instances"][1]["estimate"]["internode_basis"].startswith("3 stages in turn")
    # render: node 0 serves the API, the others are headless, all name the rendezvous
    rendered = [argv(p, i) for i in p.instances]
    for r, rank in zip(rendered, "012", strict=True):
        a = r.argv
        assert a[a.index("--nnodes") + 1] == "3" and a[a.index("--node-rank") + 1] == rank
        assert a[a.index("--master-addr") + 1] == "10.0.0.1" and a[a.index("--master-port") + 1] == "29501"
        assert a[a.index("--pipeline-parallel-size") + 1] == "3"
        assert ("--headless" in a) == (rank != "0")
        assert r.env.get("VLLM_HOST_IP") == ADDR[int(rank)]


def test_a_slower_link_lowers_the_group_ceiling_and_not_one_stage_ceiling(host_of, empty_root) -> None:
    fast = plan_over(host_of, empty_root, "a100-80g-pcie-1x", 3).instances[0].estimate
    slow = (
        plan_over(
            host_of,
            empty_root,
            "a100-80g-pcie-1x",
            3,
            sets=["layout.internode_gbps=1", "layout.internode_latency_us=5000"],
        )
        .instances[0]
        .estimate
    )
    assert slow.decode_tok_s_ceiling_batch1 == fast.decode_tok_s_ceiling_batch1
    assert slow.decode_tok_s_ceiling_batch1_group < fast.decode_tok_s_ceiling_batch1_group
    assert slow.internode_ms_per_token > 5


def test_a_model_that_fits_one_node_uses_one_and_says_the_others_are_idle(host_of, empty_root) -> None:
    p = plan_over(host_of, empty_root, "a800-pcie-4x-2numa", 2)
    assert p.nodes == 1 and all(i.nnodes is None or i.node == 0 for i in p.instances)
    assert "fits one node" in reason(p, "layout.nodes")
    assert any("nodes 1-1 are not used" in w and "layout.nodes=2" in w for w in p.warnings)


def test_layout_nodes_n_makes_one_data_parallel_rank_per_node(host_of, empty_root) -> None:
    p = plan_over(
        host_of, empty_root, "a100-80g-pcie-1x", 2, model="Qwen/Qwen2.5-32B-Instruct", sets=["layout.nodes=2"]
    )
    n0, n1 = p.instances
    assert n0.ranks == n1.ranks == 2 and "one data-parallel rank on each" in reason(p, "layout.nodes")
    assert (
        n0.estimate.internode_bytes_per_token == 0
        and "nothing crosses the link" in n0.estimate.internode_basis
    )
    a0, a1 = argv(p, n0).argv, argv(p, n1).argv
    assert (
        a0[a0.index("--data-parallel-size") + 1] == "2"
        and a0[a0.index("--data-parallel-size-local") + 1] == "1"
    )
    assert a0[a0.index("--data-parallel-address") + 1] == "10.0.0.1"
    assert "--headless" in a1 and a1[a1.index("--data-parallel-start-rank") + 1] == "1"
    with pytest.raises(Unrenderable, match=r"0\.9\.2\+"):
        argv(p, n0, "0.8.5")


def test_two_4x_a800_hosts_pipeline_a_235b_model_with_tensor_parallel_inside_each(
    host_of, empty_root
) -> None:
    p = plan_over(host_of, empty_root, "a800-pcie-4x-2numa", 2, model=HUGE)
    n0, n1 = p.instances
    assert (n0.tensor_parallel_size, n0.pipeline_parallel_size, n0.gpus, n1.gpus) == (
        4,
        2,
        (0, 1, 2, 3),
        (0, 1, 2, 3),
    )
    assert "(tensor parallel 4 inside each)" in reason(p, "layout.nodes")
    assert not any("across 2 nodes" in w for w in p.warnings)


def test_tensor_parallel_across_nodes_only_when_asked_and_with_a_warning(host_of, empty_root) -> None:
    p = plan_over(
        host_of, empty_root, "a800-pcie-4x-2numa", 2, model=HUGE, sets=["layout.tensor_parallel_size=8"]
    )
    n0, _n1 = p.instances
    assert n0.tensor_parallel_size == 8 and n0.pipeline_parallel_size == 1
    assert any("tensor parallel 8 across 2 nodes" in w for w in p.warnings)
    est = n0.estimate
    # two all-reduces per layer, each a ring of 2 steps of half the hidden state (4096 x 2 bytes): 94 layers
    assert est.nodes_parallel == "tensor" and est.internode_bytes_per_token == 94 * 2 * 2 * 4096 * 2 // 2
    assert est.internode_ms_per_token == pytest.approx(
        (est.internode_bytes_per_token * 8 / 100e9 + 94 * 2 * 2 * 20e-6) * 1e3, abs=1e-4
    )
    pipeline = plan_over(host_of, empty_root, "a800-pcie-4x-2numa", 2, model=HUGE).instances[0].estimate
    assert est.decode_tok_s_ceiling_batch1_group < pipeline.decode_tok_s_ceiling_batch1_group
    a = argv(p, n0).argv
    assert a[a.index("--tensor-parallel-size") + 1] == "8" and a[a.index("--nnodes") + 1] == "2"


def test_refused_with_the_fix_when_even_every_node_does_not_fit(host_of, empty_root) -> None:
    with pytest.raises(PlanRefused) as e:
        plan_over(host_of, empty_root, "rtx3060-12g-1x", 2, model="Qwen/Qwen3-235B-A22B")
    assert "does not fit even 2 node(s)" in e.value.message
    assert "more nodes (another --from snapshot)" in e.value.suggestions
    with pytest.raises(PlanRefused, match=r"layout\.nodes=3, but 2 host snapshots"):
        plan_over(host_of, empty_root, "a100-80g-pcie-1x", 2, sets=["layout.nodes=3"])


def test_the_ray_backend_runs_vllm_on_node_0_only(host_of, empty_root) -> None:
    p = plan_over(
        host_of, empty_root, "a800-pcie-4x-2numa", 2, model=HUGE, sets=["layout.multinode_backend=ray"]
    )
    n0, n1 = p.instances
    r0 = argv(p, n0)
    assert r0.argv[r0.argv.index("--distributed-executor-backend") + 1] == "ray" and "--nnodes" not in r0.argv
    assert any("ray start --head --node-ip-address 10.0.0.1 --port 6379" in w for w in r0.warnings)
    with pytest.raises(Unrenderable, match=r"runs no vLLM.*ray start --address 10\.0\.0\.1:6379"):
        argv(p, n1)
    # a release without --nnodes (before 0.12) falls back to Ray, and says so
    old = plan_over(host_of, empty_root, "a800-pcie-4x-2numa", 2, model=HUGE, version="0.10.1")
    r0 = argv(old, old.instances[0], "0.10.1")
    assert "--nnodes" not in r0.argv and any("has no --nnodes (0.12+)" in w for w in r0.warnings)


def test_each_node_runs_its_own_part_of_the_same_plan(host_of, empty_root) -> None:
    host = host_of("a800-pcie-4x-2numa")
    inputs = [
        PlanInputs(
            host,
            str(empty_root),
            model=HUGE,
            sets=("speculative.method=none",),
            nodes=(host,),
            addresses=ADDR[:2],
            node_rank=k,
        )
        for k in (0, 1)
    ]
    mine = [i.replan() for i in inputs]
    assert [[x.name for x in p.instances] for p in mine] == [
        ["vllm-gpu0-1-2-3-node0"],
        ["vllm-gpu0-1-2-3-node1"],
    ]
    assert mine[0].instances[0].server.port == mine[1].instances[0].server.port
    back = PlanInputs.from_json(json.loads(json.dumps(inputs[1].to_json())), "test")
    assert back.node_rank == 1 and len(back.nodes) == 1 and back.addresses == ADDR[:2]


def test_cli_plan_over_an_inventory_and_one_node_part(host_of, empty_root, tmp_path, fake_host) -> None:
    from hwprofile.host.detect import detect_host

    fake_host("a800-pcie-4x-2numa")
    snap = tmp_path / "node.json"
    snap.write_text(json.dumps(detect_host().to_dict()))
    inv = tmp_path / "nodes.yaml"
    inv.write_text(
        f"nodes:\n  - {{snapshot: {snap}, address: 10.0.0.1}}\n  - {{snapshot: {snap}, address: 10.0.0.2}}\n"
    )
    run = ["plan", "--model", HUGE, "--set", "speculative.method=none"]
    env = {**os.environ, "HWPROFILE_CONFIG_ROOT": str(empty_root)}
    out = inproc.hwprofile([*run, "--inventory", str(inv), "--json"], env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [i["node_rank"] for i in doc["instances"]] == [0, 1]
    text = inproc.hwprofile([*run, "--from", str(snap), "--from", str(snap)], env)
    assert text.returncode == 0, text.stderr
    assert (
        "link between nodes       pipeline parallel" in text.stdout
        and "the group's decode ceiling" in text.stdout
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - {snapshot: /nonexistent.json, address: 10.0.0.1}\n")
    out = inproc.hwprofile([*run, "--inventory", str(bad)], env)
    assert out.returncode != 0 and "nonexistent.json" in out.stderr


def test_launching_node_1_of_a_ray_group_is_refused_before_anything_starts(
    fake_host, empty_root, tmp_path
) -> None:
    from vllmtools import fake_vllm_shim

    from hwprofile.host.detect import detect_host

    fake_host("a800-pcie-4x-2numa")
    snap = tmp_path / "node.json"
    snap.write_text(json.dumps(detect_host().to_dict()))
    shim = fake_vllm_shim(tmp_path / "vllm")
    env = {
        **os.environ,
        "HWPROFILE_CONFIG_ROOT": str(empty_root),
        "HWPROFILE_RUNTIME_DIR": str(tmp_path / "rt"),
    }
    base = [
        sys.executable,
        "-m",
        "hwprofile",
        "launch",
        "--model",
        HUGE,
        "--from",
        str(snap),
        "--from",
        str(snap),
        "--vllm-version",
        "0.32.0",
        "--set",
        "speculative.method=none",
        "--set",
        "layout.multinode_backend=ray",
        "--set",
        f"server.vllm_command={shim}",
    ]
    for extra in (["--dry-run"], []):
        out = subprocess.run(
            [*base, "--node-rank", "1", *extra], capture_output=True, text=True, env=env, timeout=60
        )
        assert out.returncode == 1, out.stdout + out.stderr
        assert "runs no vLLM" in out.stderr and "ray start --address gpu-a800-4x:6379" in out.stderr
    assert not (tmp_path / "rt" / "state.json").exists()
    out = subprocess.run(
        [*base, "--node-rank", "2", "--dry-run"], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode != 0 and "node 2" in out.stderr


def test_the_daemon_holds_every_node_of_a_group_and_no_one_host_server(host_of, empty_root) -> None:
    from hwprofile.daemon.loop import instance_spec

    p = plan_over(host_of, empty_root, "a100-80g-pcie-1x", 3, sets=["engine.max_num_batched_tokens=16384"])
    assert [instance_spec(p, i).held.split(":")[0] for i in p.instances] == [
        "node 0 of a group over 3 nodes",
        "node 1 of a group over 3 nodes",
        "node 2 of a group over 3 nodes",
    ]
    assert "every node must restart together" in instance_spec(p, p.instances[0]).held
    alone = plan_over(host_of, empty_root, "a800-pcie-4x-2numa", 2)
    assert all(instance_spec(alone, i).held is None for i in alone.instances)


def test_every_release_renders_each_node_with_flags_it_has_or_says_why_not(host_of, empty_root) -> None:
    """The 26 releases' own parsers (data/vllm.json): --nnodes and friends from 0.12, data parallel
    across nodes from 0.9.2, the Ray backend before; never a flag the release lacks."""
    from hwprofile.render.versions import known_versions, parse_version

    pipe = plan_over(host_of, empty_root, "a800-pcie-4x-2numa", 2, model=HUGE)
    dp = plan_over(
        host_of, empty_root, "a100-80g-pcie-1x", 2, model="Qwen/Qwen2.5-32B-Instruct", sets=["layout.nodes=2"]
    )
    for v in known_versions():
        rel = release(v)
        for p in (pipe, dp):
            for inst in p.instances:
                try:
                    r = render_instance(p, inst, rel, "vllm", None)
                except Unrenderable as e:
                    if p is dp:
                        assert parse_version(v) < (0, 9, 2) and "0.9.2+" in str(e), (v, str(e))
                    else:
                        assert parse_version(v) < (0, 12) and inst.node == 1 and "ray start" in str(e), (
                            v,
                            str(e),
                        )
                    continue
                flags = [a for a in r.argv if a.startswith("--")]
                assert all(rel.has(f) for f in flags), (v, [f for f in flags if not rel.has(f)])
                if p is pipe:
                    assert ("--nnodes" in flags) == (parse_version(v) >= (0, 12)), v
                    assert ("--distributed-executor-backend" in flags) == (parse_version(v) < (0, 12)), v
                else:
                    assert "--data-parallel-address" in flags and ("--headless" in flags) == (
                        inst.node == 1
                    ), v
