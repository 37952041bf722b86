"""The KV cache pool pinned in bytes, calibrated from what vLLM measured on an earlier start of the
same instance on the same GPUs (``supervise.pin_kv_pool``, off by default).

Why: vLLM profiles the memory left for the KV cache at every start, and the pool it finds varies by
about 1 GiB between starts of one configuration; the first start on a cold compile cache gets a
smaller one (operators' reports, shared/facts/hybrid.md). Operators measure it once and pass it in
bytes (``--kv-cache-memory-bytes``, vLLM 0.10.2+: vLLM then skips the profiling of the pool and uses
the bytes as given).

What is recorded (by the supervisor, :mod:`hwprofile.supervise.pools`): per :func:`pool_key` (the host's
GPUs, the instance's GPUs by UUID, the vLLM release, the model and every engine and speculative
setting of the instance, but the pin itself), each profiled start's pool from vLLM's own line
``Available KV cache memory: X GiB`` (``format_gib``: two decimals, so the bytes are taken half a
step lower, never above what was measured), when, and whether that start compiled its graphs cold,
loaded them from the compile cache, or ran eager. A start that was itself pinned logs no such line and
records nothing.

What is pinned (:func:`choose`): the smallest pool of the starts that did not compile cold (the
conservative end of the start-to-start spread). A cold start's pool is never pinned (it is the
smaller one the cold cache causes): with only cold measurements nothing is pinned yet, and the next
(warm) start is recorded. A key differs for any other GPU, release, model or
setting, so a pool measured for another plan is never pinned: a re-plan (a memory-ladder step, a
degrade) is profiled afresh and recorded under its own key. Pure: the pipeline reads the file, the
supervisor writes it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import TypedDict

from .types import ABSENT, InstancePlan, Plan, Reason

GiB = 2**30
SCHEMA = "hwprofile.kv-pools/1"
KEEP = 8  # measurements kept per key (the newest)
HALF_STEP = GiB // 200  # vLLM logs the pool in GiB with two decimals: +-0.005 GiB


class KvRecord(TypedDict):
    """One measured pool in ``kv-pools.json``: the bytes vLLM measured, when (epoch seconds), and the state
    of the compile cache at that start (cold, warm, eager or unknown)."""

    bytes: int
    at: float
    compile: str


class KvPools(TypedDict):
    """A ``kv-pools.json`` document: its schema and the records per pool key (:func:`pool_key`)."""

    schema: str
    pools: dict[str, list[KvRecord]]


def pool_key(plan: Plan, inst: InstancePlan) -> str:
    """24 hex digits naming what sets ``inst``'s KV pool: the host's GPUs (the plan's calibration
    fingerprint), the instance's GPUs (UUIDs, else indexes) and its parallel sizes, the vLLM release,
    the model (name, path, revision, quantization, bits), the draft, and the engine and speculative
    settings (the pin itself left out)."""
    engine = {k: v for k, v in inst.engine.to_json().items() if k != "kv_cache_memory_bytes"}
    fingerprint = (
        (plan.prediction or {}).get("calibration", {}).get("fingerprint")
        if plan.prediction is not ABSENT
        else None
    )
    what = {
        "host": fingerprint,
        "gpus": list(inst.gpu_uuids)
        if inst.gpu_uuids is not ABSENT and all(inst.gpu_uuids)
        else list(inst.gpus),
        "tp": inst.tensor_parallel_size,
        "pp": inst.pipeline_parallel_size,
        "dp": inst.ranks,
        "vllm": plan.host.vllm_version,
        "model": [
            plan.model.name,
            plan.model.path,
            plan.model.revision if plan.model.revision is not ABSENT else None,
            plan.model.quantization,
            plan.model.bits,
        ],
        "draft": [plan.draft.name, plan.draft.path] if plan.draft else None,
        "engine": engine,
        "speculative": inst.speculative.to_json() if inst.speculative else None,
        "device": inst.device,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


def measured_bytes(gib_text: str) -> int:
    """The bytes of vLLM's ``Available KV cache memory: <gib_text> GiB``, half a rounding step lower
    (never above what vLLM measured)."""
    return max(0, round(float(gib_text) * GiB) - HALF_STEP)


def parse_pools(doc: object) -> dict[str, list[KvRecord]]:
    """The records of a ``kv-pools.json`` document: ``{key: [{"bytes", "at", "compile"}, ...]}``;
    what is not such a record is left out (a file written by hand is not trusted)."""
    out: dict[str, list[KvRecord]] = {}
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("pools"), dict):
        return out
    for key, recs in doc["pools"].items():
        if not isinstance(key, str) or not isinstance(recs, list):
            continue
        good: list[KvRecord] = [
            {"bytes": r["bytes"], "at": float(r["at"]), "compile": r.get("compile") or "unknown"}
            for r in recs
            if isinstance(r, dict)
            and type(r.get("bytes")) is int
            and r["bytes"] > 0
            and isinstance(r.get("at"), (int, float))
            and r.get("compile") in (None, "cold", "warm", "eager", "unknown")
        ]
        if good:
            out[key] = good
    return out


def add_record(doc: object, key: str, nbytes: int, at: float, compile_state: str) -> KvPools:
    """``doc`` (a ``kv-pools.json`` document, or anything: started afresh) with one more measurement
    under ``key`` (the newest :data:`KEEP` kept)."""
    pools = parse_pools(doc)
    new: KvRecord = {"bytes": int(nbytes), "at": at, "compile": compile_state}
    pools[key] = [*pools.get(key, []), new][-KEEP:]
    return {"schema": SCHEMA, "pools": pools}


def choose(records: Sequence[KvRecord]) -> KvRecord | None:
    """The measurement to pin (module doc): the smallest of the starts that did not compile cold,
    else None."""
    warm = [r for r in records if r.get("compile") != "cold"]
    return min(warm, key=lambda r: r["bytes"]) if warm else None


def when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def pin(plan: Plan, pools: Mapping[str, Sequence[KvRecord]]) -> Plan:
    """``plan`` with each GPU instance's pool pinned where a measurement of it is recorded in
    ``pools`` (:func:`parse_pools`), each with its reason; an instance without one says so."""
    instances: list[InstancePlan] = []
    reasons: list[Reason] = []
    for i, inst in enumerate(plan.instances):
        key = f"instances[{i}].engine.kv_cache_memory_bytes"
        if inst.device != "cuda":
            instances.append(inst)
            continue
        recs = list(pools.get(pool_key(plan, inst), ()))
        chosen = choose(recs)
        if chosen is None:
            cold = f" ({len(recs)} measured, all on a cold compile cache)" if recs else ""
            reasons.append(
                Reason(
                    key,
                    None,
                    "not pinned: no pool vLLM measured for this instance on these GPUs with "
                    f"these settings and this release{cold}; its next profiled start is recorded",
                    "planner",
                )
            )
            instances.append(inst)
            continue
        nbytes = int(chosen["bytes"])
        others = len([r for r in recs if r.get("compile") != "cold"])
        reasons.append(
            Reason(
                key,
                nbytes,
                f"calibrated from the start at {when(float(chosen['at']))}: vLLM measured "
                f"{nbytes / GiB:.2f} GiB for the KV cache (the smallest of {others} start(s) not on a "
                "cold compile cache, on these GPUs with these settings); pinned in bytes, vLLM skips "
                "profiling the pool (the plan's kv_tokens stay its own estimate)",
                "planner",
            )
        )
        instances.append(
            dataclasses.replace(inst, engine=dataclasses.replace(inst.engine, kv_cache_memory_bytes=nbytes))
        )
    return dataclasses.replace(plan, instances=tuple(instances), reasons=tuple(plan.reasons) + tuple(reasons))
