"""Compare what vLLM says it started with (its startup log) against the plan."""

from __future__ import annotations

import ast
import re
from typing import Any

from ..plan.memory import vllm_reported_kv_tokens
from ..plan.types import ABSENT, InstancePlan
from .numalog import numa_differences, parse_numa

_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})")
_KV = re.compile(r"KV cache size: ([\d,]+) tokens")
# the pool vLLM profiled (GPU workers; ``format_gib``: GiB with two decimals); absent where the start
# was pinned (--kv-cache-memory-bytes: "reserved ... as specified by kv_cache_memory_bytes") and on CPU
_POOL = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
# torch.compile's graphs: compiled now (a cold compile cache) or loaded from the cache (vLLM 0.33
# compilation/backends.py; "dynamic shape" in older releases)
_COLD = re.compile(r"Compiling a graph for (?:compile range|dynamic shape)")
_WARM = re.compile(r"Directly load the compiled graph\(s\) for")

# plan engine key → vLLM's argument name
CHECKED = {
    "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "enforce_eager": "enforce_eager",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "kv_cache_dtype": "kv_cache_dtype",
}


def parse_startup(log_text: str) -> dict[str, Any]:
    """What the LAST start in ``log_text`` reported (an instance's log holds every start it had:
    after a restart with new settings, the earlier start's lines must not be compared)."""
    out: dict[str, Any] = {}
    starts = list(_NON_DEFAULT.finditer(log_text))
    if starts:
        m = starts[-1]
        try:
            out["non_default_args"] = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError):
            out["non_default_args_text"] = m.group(1)
        log_text = log_text[m.start() :]
    kv = list(_KV.finditer(log_text))
    if kv:
        out["kv_cache_tokens"] = int(kv[-1].group(1).replace(",", ""))
    pool = list(_POOL.finditer(log_text))
    if pool:
        out["kv_pool_gib"] = pool[-1].group(1)
        out["compile"] = "cold" if _COLD.search(log_text) else "warm" if _WARM.search(log_text) else "eager"
    numa = parse_numa(log_text)
    if any(numa):
        out["numa"] = numa
    return out


def compare(inst: InstancePlan, started: dict[str, Any]) -> list[str]:
    """Differences between the planned instance and what vLLM reports, each with both values."""
    warnings: list[str] = []
    args = started.get("non_default_args") or {}
    e = inst.engine
    for key, arg in CHECKED.items():
        planned = getattr(e, key)
        if (
            planned is None
            or planned is ABSENT
            or (key == "kv_cache_dtype" and planned == "auto")
            or (key == "enforce_eager" and not planned)
        ):
            continue
        if arg in args and args[arg] != planned:
            warnings.append(f"{key}: planned {planned}, vLLM started with {args[arg]}")
    tp = inst.tensor_parallel_size
    if tp > 1 and args.get("tensor_parallel_size") not in (None, tp):
        warnings.append(
            f"tensor_parallel_size: planned {tp}, vLLM started with {args['tensor_parallel_size']}"
        )
    logged = started.get("kv_cache_tokens")
    mem = inst.memory
    if logged is not None and mem.kv_tokens:
        expected = mem.vllm_logged_kv_tokens  # the planner's copy of vLLM's own arithmetic
        if expected is None or expected is ABSENT:
            expected = vllm_reported_kv_tokens(mem.kv_tokens, int(e.max_model_len), int(mem.block_size))
        if expected != logged:
            warnings.append(f"KV cache: planned {expected} tokens, vLLM reports {logged} tokens")
    if "numa" in started:  # vLLM's own binding (--numa-bind): a fallback or another node than planned
        nodes = () if inst.gpu_numa_nodes is ABSENT else tuple(inst.gpu_numa_nodes or ())
        warnings += numa_differences(started["numa"], nodes, inst.numa_node)
    return warnings
