"""What vLLM's startup log says about NUMA binding, against the plan's (pure).

With ``--numa-bind`` (0.20+), vLLM starts each engine-core and worker process through
``numactl`` (``vllm/utils/numa_utils.py``). From 0.25.0 it first tries the arguments with
``numactl <args> true`` and, where the host rejects memory binding (a container without
``CAP_SYS_NICE``: ``set_mempolicy`` refused), drops ``--membind`` and keeps the CPU binding, or
binds nothing, with one warning (``_resolve_numactl_args``; the string at line 498 in 0.25.0,
0.29.0 and 0.32.0, 466 in 0.33.0)::

    numactl args '--cpunodebind=0 --membind=0' rejected; falling back to '--cpunodebind=0'. Add
    --cap-add SYS_NICE for full NUMA binding.

(0.20.0 and 0.22.0 have no such fallback: numactl itself refuses and the process fails to start.)
Every release with ``--numa-bind`` also warns when the binding cannot take effect at all
(``_mp_set_executable``; line 300 in 0.20.0/0.22.0, 586 in 0.25.0-0.32.0, 554 in 0.33.0)::

    NUMA binding requires spawn method but got 'fork'. NUMA binding will be ineffective. Set
    VLLM_WORKER_MULTIPROC_METHOD=spawn to enable NUMA binding.

and logs the node each worker is bound to (``Binding worker subprocess (local_rank=0, gpu_index=0)
to NUMA node 1``, ``... to CPUs 0-7 and NUMA node 1`` with ``--numa-bind-cpus``; 0.20/0.22 write
the process kind through ``%s``, the same text for workers), checked against the node the plan
gives the rank's GPU. (Engine-core lines are not: their ``local_rank`` is not a GPU's.)
"""

from __future__ import annotations

import re
from typing import NamedTuple

_REJECTED = re.compile(
    r"numactl args (?P<q1>['\"])(?P<asked>.*?)(?P=q1) rejected; falling back to "
    r"(?P<q2>['\"])(?P<used>.*?)(?P=q2)\."
)
_SPAWN = re.compile(r"NUMA binding requires spawn method but got '(?P<method>[^']*)'")
_BOUND = re.compile(
    r"Binding worker subprocess \(local_rank=(?P<rank>\d+), gpu_index=(?P<gpu>\d+)\) to "
    r"(?:CPUs (?P<cpus>\S+) and )?NUMA node (?P<node>\d+)"
)


class NumaLog(NamedTuple):
    """The NUMA lines of one start: ``fallbacks`` ``(asked, used)`` numactl arguments (``used``
    ``"no binding"`` when vLLM bound nothing), ``ineffective`` the start method that defeated the
    binding (else None), ``bound`` ``(local_rank, gpu_index, node)`` per worker."""

    fallbacks: tuple[tuple[str, str], ...] = ()
    ineffective: str | None = None
    bound: tuple[tuple[int, int, int], ...] = ()


def parse_numa(log_text: str) -> NumaLog:
    """The NUMA lines of ``log_text`` (one start's lines), each distinct line once."""
    fallbacks: list[tuple[str, str]] = []
    for m in _REJECTED.finditer(log_text):
        pair = (m.group("asked"), m.group("used"))
        if pair not in fallbacks:
            fallbacks.append(pair)
    spawn = _SPAWN.search(log_text)
    bound: list[tuple[int, int, int]] = []
    for m in _BOUND.finditer(log_text):
        row = (int(m.group("rank")), int(m.group("gpu")), int(m.group("node")))
        if row not in bound:
            bound.append(row)
    return NumaLog(tuple(fallbacks), spawn.group("method") if spawn else None, tuple(bound))


def _kept(used: str) -> str:
    if used in ("", "no binding"):
        return "no binding at all"
    if "--membind" not in used:
        return f"CPUs only ({used}), memory not bound"
    return used


def numa_differences(numa: NumaLog, planned_nodes: tuple[int | None, ...], node: int | None) -> list[str]:
    """Differences from the planned binding, each with both sides and what fixes it.
    ``planned_nodes``: the plan's node per GPU (rank order), ``node``: the instance's node."""
    if not planned_nodes and node is None:
        return []  # the plan binds nothing: nothing to differ from
    out: list[str] = []
    for asked, used in numa.fallbacks:
        out.append(
            f"NUMA binding: planned numactl {asked}, vLLM fell back to {_kept(used)}: the host refused "
            "memory binding (set_mempolicy; in a container add --cap-add SYS_NICE)"
        )
    if numa.ineffective is not None:
        out.append(
            f"NUMA binding: planned, but vLLM's workers start with the {numa.ineffective!r} method and are "
            "not bound (set VLLM_WORKER_MULTIPROC_METHOD=spawn)"
        )
    for rank, _gpu, got in numa.bound:
        want = planned_nodes[rank] if rank < len(planned_nodes) else node
        if want is not None and want != got:
            out.append(f"NUMA binding: planned node {want} for rank {rank}, vLLM bound it to node {got}")
    return out
