"""vLLM's NUMA fallback read from its startup log and reported as a difference from the plan.

The messages are vLLM's own format strings, copied from ``vllm/utils/numa_utils.py`` and filled in
with ``%`` the way its logger does:

- ``_resolve_numactl_args`` (0.25.0, 0.29.0, 0.32.0 line 498; 0.33.0 line 466): the membind
  fallback; not in 0.20.0/0.22.0;
- ``_mp_set_executable`` (0.20.0/0.22.0 line 300, 0.25.0-0.32.0 line 586, 0.33.0 line 554);
- ``_get_numactl_worker_args`` (0.32.0 lines 355 and 364): the node each worker is bound to.

Where vLLM is installed, the format strings are checked to be in its source.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from hwprofile.supervise.numalog import NumaLog, numa_differences, parse_numa
from hwprofile.supervise.verify import compare, parse_startup

# verbatim from vllm 0.32.0 vllm/utils/numa_utils.py (the adjacent literals joined)
REJECTED = "numactl args %r rejected; falling back to %r. Add --cap-add SYS_NICE for full NUMA binding."
SPAWN = (
    "NUMA binding requires spawn method but got '%s'. NUMA binding will be ineffective. "
    "Set VLLM_WORKER_MULTIPROC_METHOD=spawn to enable NUMA binding."
)
BOUND = "Binding worker subprocess (local_rank=%s, gpu_index=%s) to NUMA node %s"
BOUND_CPUS = "Binding worker subprocess (local_rank=%s, gpu_index=%s) to CPUs %s and NUMA node %s"
PREFIX = "(EngineCore pid=4242) WARNING 12-02 07:00:01 [numa_utils.py:497] "
INFO = "(EngineCore pid=4242) INFO 12-02 07:00:01 [numa_utils.py:363] "


def test_format_strings_are_the_installed_vllms() -> None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM not installed")
    src = (Path(next(iter(spec.submodule_search_locations))) / "utils" / "numa_utils.py").read_text()
    joined = (
        src.replace('"\n                    "', "")
        .replace('"\n            "', "")
        .replace('"\n        "', "")
    )
    for fmt in (REJECTED, SPAWN, BOUND, BOUND_CPUS):
        assert fmt in joined, fmt


def test_membind_rejected_cpus_only_and_nothing() -> None:
    log = (
        "(APIServer pid=1) INFO 12-02 07:00:00 [api_utils.py:286] non-default args: {'numa_bind': True}\n"
        + PREFIX
        + REJECTED % ("--cpunodebind=1 --membind=1", "--cpunodebind=1")
        + "\n"
        + PREFIX
        + REJECTED % ("--cpunodebind=1 --membind=1", "--cpunodebind=1")
        + "\n"  # a second worker
        + PREFIX
        + REJECTED % ("--physcpubind=8-15 --membind=1", "no binding")
        + "\n"
    )
    numa = parse_numa(log)
    assert numa.fallbacks == (
        ("--cpunodebind=1 --membind=1", "--cpunodebind=1"),
        ("--physcpubind=8-15 --membind=1", "no binding"),
    )
    diffs = numa_differences(numa, (1,), 1)
    assert diffs[0].startswith(
        "NUMA binding: planned numactl --cpunodebind=1 --membind=1, vLLM fell back to CPUs only "
        "(--cpunodebind=1), memory not bound"
    )
    assert "fell back to no binding at all" in diffs[1] and "SYS_NICE" in diffs[1]


def test_spawn_method_and_another_node() -> None:
    log = (
        PREFIX
        + SPAWN % "fork"
        + "\n"
        + INFO
        + BOUND % (0, 0, 0)
        + "\n"
        + INFO
        + BOUND_CPUS % (1, 1, "8-15", 0)
        + "\n"
    )
    numa = parse_numa(log)
    assert numa == NumaLog((), "fork", ((0, 0, 0), (1, 1, 0)))
    diffs = numa_differences(numa, (0, 1), None)
    assert "workers start with the 'fork' method" in diffs[0] and "spawn" in diffs[0]
    assert diffs[1:] == ["NUMA binding: planned node 1 for rank 1, vLLM bound it to node 0"]


def test_nothing_planned_nothing_reported_and_a_clean_start_is_quiet() -> None:
    numa = parse_numa(PREFIX + REJECTED % ("--cpunodebind=0 --membind=0", "--cpunodebind=0"))
    assert numa_differences(numa, (), None) == []  # the plan bound nothing
    assert parse_numa(INFO + BOUND % (0, 0, 1)) == NumaLog((), None, ((0, 0, 1),))
    assert numa_differences(parse_numa(INFO + BOUND % (0, 0, 1)), (1,), 1) == []


def test_startup_verification_reports_the_fallback(host_of, empty_root) -> None:
    from hwprofile.pipeline import make_plan

    host = host_of("a800-pcie-4x-2numa")
    host = host._replace(
        software=host.software._replace(vllm_version="0.32.0", numactl_path="/usr/bin/numactl")
    )
    inst = make_plan(host, empty_root, sets=["speculative.method=none"], environ={}).instances[0]
    assert inst.gpu_numa_nodes and inst.gpu_numa_nodes[0] is not None  # each rank bound by vLLM
    node = inst.gpu_numa_nodes[0]
    inst = dataclasses.replace(inst, memory=dataclasses.replace(inst.memory, kv_tokens=0))  # KV not compared
    log = PREFIX + REJECTED % (f"--cpunodebind={node} --membind={node}", f"--cpunodebind={node}") + "\n"
    warnings = compare(inst, parse_startup(log))
    assert warnings == [
        f"NUMA binding: planned numactl --cpunodebind={node} --membind={node}, vLLM fell back to CPUs only "
        f"(--cpunodebind={node}), memory not bound: the host refused memory binding (set_mempolicy; in a "
        "container add --cap-add SYS_NICE)"
    ]
    assert compare(inst, parse_startup(INFO + BOUND % (0, 0, node))) == []
