"""What `hwprofile plan` says of a GPU's memory against what vLLM's memory profile logged at start-up:
the weights, the profile's activation peak, the KV cache, and whether vLLM started at all, for every
point of benchmarks/data/validation_memory.yaml (published logs; nothing fitted to them).

    python benchmarks/bench_memory.py [--json]

Each point is planned as `plan --json --from` a snapshot of its host fixture would be: the point's
release, the GPU's total as CUDA counted it where the log gives it (NVML's total less the driver's
reservation), the kernel packages where the install says, and the point's settings with vLLM's defaults
where its command line gave none. A point vLLM refused to start is matched by a plan that refuses; its
figures then come from the memory fit the refusal names (`refused.memory`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

DATA = ROOT / "benchmarks" / "data" / "validation_memory.yaml"
GIB = 1 << 30
# the KV cache within this much of vLLM's: half a GiB, or 5 % of a larger cache
KV_WITHIN_GIB, KV_WITHIN_SHARE = 0.5, 0.05


def load_points(path: Path = DATA) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text())
    assert doc.get("schema") == "hwprofile.validation-memory/1", f"{path}: schema {doc.get('schema')!r}"
    return list(doc["points"])


def settings_of(point: dict[str, Any]) -> list[str]:
    """`--set` values for the point's run: its flags, vLLM's defaults where it gave none, no speculation."""
    given = {**(point.get("defaults") or {}), **(point.get("flags") or {})}
    # the checkpoint named, not a 4-bit one in its place (engine.weights_bits: auto)
    # and the model's own KV dtype, as vLLM's default (auto), whatever a matched profile asks
    sets = [
        "layout.replicas=1",
        "speculative.method=none",
        "engine.weights_bits=16",
        "engine.kv_cache_dtype=auto",
    ]
    if "tensor_parallel_size" in given:
        sets.append(f"layout.tensor_parallel_size={given['tensor_parallel_size']}")
    for key in ("gpu_memory_utilization", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        if key in given:
            sets.append(f"engine.{key}={given[key]}")
    if "max_model_len" in given:  # the run's context, even where the plan's floor would refuse less
        sets.append(f"engine.min_model_len={given['max_model_len']}")
    if given.get("kv_cache_dtype"):
        sets.append(f"engine.kv_cache_dtype={given['kv_cache_dtype']}")
    if given.get("attention_backend"):
        sets.append(f"engine.attention_backend={given['attention_backend']}")
    if given.get("language_model_only"):
        sets.append(f"engine.language_model_only={given['language_model_only']}")
    return sets


def host_of(point: dict[str, Any], lib_dir: Path, work: Path) -> Any:
    """The point's host fixture with its release, CUDA's total and its kernel packages."""
    import bench_predict

    hw = point["hardware"]
    host = bench_predict.host_snapshot(hw["host"], str(point["vllm"]), lib_dir, work)
    gpus = list(host.gpus)
    if hw.get("cuda_total_gib"):
        cuda = int(hw["cuda_total_gib"] * GIB)
        gpus = [g._replace(memory_reserved_bytes=max(0, (g.memory_total_bytes or 0) - cuda)) for g in gpus]
    packages = point.get("kernel_packages")
    software = host.software._replace(kernel_packages=None if packages is None else tuple(packages))
    return host._replace(gpus=tuple(gpus), software=software)


def plan_point(point: dict[str, Any], lib_dir: Path, work: Path) -> dict[str, Any]:
    """``{"memory": the instance's (or the refusal's) fit, "refused": reason or None}``."""
    from hwprofile.pipeline import make_plan
    from hwprofile.plan.refusal import PlanRefused

    root = work / "etc-hwprofile"
    root.mkdir(exist_ok=True)
    host = host_of(point, lib_dir, work)
    try:
        ck = point["checkpoint"]  # a catalog name, or a config-only copy in the repository (examples/models)
        model = str(ROOT / ck) if (ROOT / ck).is_dir() else ck
        plan = make_plan(host, root, environ={}, sets=settings_of(point), model=model)
    except PlanRefused as e:
        return {"memory": getattr(e, "memory", None) or {}, "refused": e.message}
    return {"memory": plan.to_json()["instances"][0]["memory"], "refused": None}


def compare(point: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """The point's figures beside the plan's, and whether the KV cache and the start agree."""
    mem, logged = got["memory"], point.get("logged") or {}
    row: dict[str, Any] = {"id": point["id"], "refused": got["refused"]}
    for name, key in (
        ("weights", "weights_bytes"),
        ("activation", "activation_bytes"),
        ("kv_cache", "kv_cache_bytes"),
    ):
        plan = mem.get(key)
        row[name] = {
            "logged_gib": logged.get(f"{name}_gib"),
            "plan_gib": None if plan is None else round(plan / GIB, 2),
        }
    kv = row["kv_cache"]
    if kv["logged_gib"] is not None and kv["plan_gib"] is not None:
        delta = kv["plan_gib"] - kv["logged_gib"]
        kv["delta_gib"] = round(delta, 2)
        kv["within"] = abs(delta) <= max(KV_WITHIN_GIB, KV_WITHIN_SHARE * abs(kv["logged_gib"]))
    # vLLM's "GPU KV cache size": the plan's count of it where the two differ (a hybrid, sliding
    # windows), else the cache's own tokens
    said = mem.get("vllm_logged_kv_tokens") or mem.get("kv_tokens")
    if logged.get("kv_tokens") and said:
        kv["tokens"] = {"logged": logged["kv_tokens"], "plan": said}
    if "started" in point:
        row["start_agrees"] = (got["refused"] is None) == bool(point["started"])
    if point.get("open"):
        row["open"] = point["open"]  # misses the data file names as not yet explained
    return row


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def report(rows: list[dict[str, Any]]) -> None:
    print(f"{'point':38} {'weights GiB':>17} {'activation GiB':>17} {'KV cache GiB':>24}  start")
    print(
        f"{'':38} {'logged':>8} {'plan':>8} {'logged':>8} {'plan':>8} {'logged':>8} {'plan':>8} {'delta':>6}"
    )
    for r in rows:
        w, a, k = r["weights"], r["activation"], r["kv_cache"]
        start = "-" if "start_agrees" not in r else ("ok" if r["start_agrees"] else "OFF")
        print(
            f"{r['id']:38} {_cell(w['logged_gib']):>8} {_cell(w['plan_gib']):>8} {_cell(a['logged_gib']):>8} "
            f"{_cell(a['plan_gib']):>8} {_cell(k['logged_gib']):>8} {_cell(k['plan_gib']):>8} "
            f"{_cell(k.get('delta_gib')):>6}  {start}"
            + ("" if k.get("within", True) else "  KV OFF")
            + "".join(f"  ({name}: open)" for name in r.get("open", {}))
        )
    tokens = [r["kv_cache"]["tokens"] for r in rows if "tokens" in r["kv_cache"]]
    if tokens:
        ratios = ", ".join(f"x{t['plan'] / t['logged']:.3f}" for t in tokens)
        print(f"\nvLLM's logged KV tokens (GPU KV cache size), plan / logged: {ratios}")
    judged = [r for r in rows if "within" in r["kv_cache"]]
    starts = [r for r in rows if "start_agrees" in r]
    deltas = sorted(abs(r["kv_cache"]["delta_gib"]) for r in judged)
    print(
        f"\nKV cache within max({KV_WITHIN_GIB} GiB, {KV_WITHIN_SHARE:.0%}) of vLLM's: "
        f"{sum(r['kv_cache']['within'] for r in judged)}/{len(judged)}; median |delta| "
        f"{deltas[len(deltas) // 2] if deltas else 0:.2f} GiB, largest {max(deltas, default=0):.2f}; "
        f"started or refused as vLLM did: {sum(r['start_agrees'] for r in starts)}/{len(starts)}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = ap.parse_args(argv)
    from fakehost import compile_fake_nvml

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lib = compile_fake_nvml(work / "lib")
        rows = [compare(p, plan_point(p, lib.parent, work)) for p in load_points()]
    if args.json:
        print(json.dumps({"source": str(DATA.relative_to(ROOT)), "points": rows}, indent=2))
    else:
        report(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
