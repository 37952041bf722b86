"""Translate one planned instance into the arguments and environment of a given vLLM release.

Every decision that depends on the release lives here; each setting that had to be dropped or
translated becomes a warning. The result is plain data the templates only format. Arguments are an
argv list; nothing here builds a shell string, and the API key is carried by reference only.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from .versions import Release

Pair = tuple[str, Any]  # (flag, value); value None = a switch, list = several values


class Rendered(NamedTuple):
    name: str
    vllm_version: str  # the target release
    flag_table: str  # the release whose flag table was used
    prefix: list[str]  # NUMA wrapper in front of vLLM (may be empty)
    command: list[str]  # [vllm, "serve", model]
    args: list[Pair]  # vLLM's own flags, in order
    env: dict[str, str]  # environment for the instance (no secret values)
    secrets: dict[str, str]  # variable vLLM reads → variable of hwprofile's environment holding it
    numa_node: int | None
    cpus: str | None
    gpus: list[int]
    device: str
    stop_timeout_s: int  # how long a supervisor waits after SIGTERM before SIGKILL
    warnings: list[str]

    @property
    def argv(self) -> list[str]:
        return [*self.prefix, *self.command, *flatten(self.args)]

    def config(self) -> dict[str, Any]:
        """The same flags as a vLLM ``--config`` YAML mapping (keys = flag names without dashes)."""
        out: dict[str, Any] = {}
        for flag, value in self.args:
            key = flag.lstrip("-")
            if flag == "--speculative-config":
                value = json.loads(value)
            out[key] = True if value is None else value
        return out


def flatten(args: list[Pair]) -> list[str]:
    out: list[str] = []
    for flag, value in args:
        out.append(flag)
        if value is None:
            continue
        if isinstance(value, list):
            out.extend(str(v) for v in value)
        else:
            out.append(str(value))
    return out


def render_instance(
    plan: dict[str, Any], inst: dict[str, Any], rel: Release, vllm_command: str, numactl: str | None
) -> Rendered:
    warnings: list[str] = []
    if rel.note:
        warnings.append(rel.note)
    e, srv = inst["engine"], inst["server"]
    cuda = inst["device"] == "cuda"
    args: list[Pair] = [("--host", srv["host"]), ("--port", srv["port"])]
    if srv.get("served_model_name"):
        args.append(("--served-model-name", srv["served_model_name"]))

    def add(flag: str, value: Any = None, why_missing: str | None = None) -> bool:
        if rel.has(flag):
            args.append((flag, value))
            return True
        warnings.append(
            f"{flag} does not exist in vLLM {rel.table}: not emitted"
            + (f" ({why_missing})" if why_missing else "")
        )
        return False

    def choice(flag: str, value: str, fallback: str) -> str | None:
        allowed = rel.choices(flag)
        if allowed is None or value in allowed:
            return value
        warnings.append(
            f"{flag} {value} is not accepted by vLLM {rel.table} (accepts {', '.join(allowed)}): {fallback}"
        )
        return None

    if cuda and e.get("gpu_memory_utilization") is not None:
        add("--gpu-memory-utilization", e["gpu_memory_utilization"])
    add("--max-model-len", e["max_model_len"])
    add("--max-num-seqs", e["max_num_seqs"])
    add("--max-num-batched-tokens", e["max_num_batched_tokens"])
    if inst["tensor_parallel_size"] > 1:
        add("--tensor-parallel-size", inst["tensor_parallel_size"])
    if inst["pipeline_parallel_size"] > 1:
        add("--pipeline-parallel-size", inst["pipeline_parallel_size"])
    if e.get("dtype") and e["dtype"] != "auto":
        dt = choice("--dtype", e["dtype"], "left to the model's own dtype")
        if dt:
            add("--dtype", dt)
    if e.get("kv_cache_dtype") and e["kv_cache_dtype"] != "auto":
        kv = choice("--kv-cache-dtype", e["kv_cache_dtype"], "KV cache stays in the model's dtype (auto)")
        if kv:
            add("--kv-cache-dtype", kv)
    if e.get("quantization"):
        q = choice(
            "--quantization",
            e["quantization"],
            "not emitted; vLLM reads the checkpoint's quantization_config itself",
        )
        if q:
            add("--quantization", q)
    if e.get("enforce_eager"):
        add("--enforce-eager")
    for key, flag in (
        ("enable_prefix_caching", "--enable-prefix-caching"),
        ("enable_chunked_prefill", "--enable-chunked-prefill"),
    ):
        if e.get(key):
            add(flag)
        elif rel.has("--no-" + flag[2:]):
            args.append(("--no-" + flag[2:], None))
        else:
            warnings.append(
                f"{key}=false cannot be said to vLLM {rel.table} (no --no-{flag[2:]}); its default applies"
            )

    env: dict[str, str] = {
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CONFIGURE_LOGGING": "1",
        "VLLM_LOGGING_LEVEL": "INFO",
    }
    if plan["model"].get("source") in ("dir", "hf-cache"):
        env["HF_HUB_OFFLINE"] = "1"  # the weights are local: never reach for the hub
    if cuda:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's numbering = NVML's (hwprofile's) numbering
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in inst["gpus"])
    else:
        env["VLLM_CPU_OMP_THREADS_BIND"] = inst.get("cpus") or "auto"
        kv_bytes = e.get("kv_cache_memory_bytes")
        if kv_bytes:
            if rel.has("--kv-cache-memory-bytes"):
                args.append(("--kv-cache-memory-bytes", kv_bytes))
            else:
                gib = max(1, -(-kv_bytes // 2**30))
                env["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
                if gib * 2**30 != kv_bytes:
                    warnings.append(
                        f"vLLM {rel.table} sizes the CPU KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE={gib}); the plan's {kv_bytes} bytes rounded up"
                    )

    _speculative(inst, e, rel, args, warnings)

    # Logs and metrics: keep vLLM's stats (they feed /metrics); keep health polls out of the access log.
    if not srv.get("metrics", True):
        add("--disable-log-stats")
    if rel.has("--disable-access-log-for-endpoints"):
        args.append(("--disable-access-log-for-endpoints", "/health,/metrics,/ping"))
    if srv.get("shutdown_timeout"):
        if rel.has("--shutdown-timeout"):
            args.append(("--shutdown-timeout", srv["shutdown_timeout"]))
        else:
            warnings.append(
                f"--shutdown-timeout does not exist in vLLM {rel.table}: on SIGTERM it does not drain; "
                f"the supervisor escalates to SIGKILL after {srv['shutdown_timeout']} s"
            )

    # NUMA binding: vLLM's own flags where they exist (GPU workers), else numactl in front.
    prefix: list[str] = []
    node = inst.get("numa_node")
    if node is None:
        warnings.append(f"{inst['name']}: NUMA node unknown: not bound")
    elif cuda and rel.has("--numa-bind") and rel.has("--numa-bind-nodes"):
        args += [("--numa-bind", None), ("--numa-bind-nodes", [node] * len(inst["gpus"]))]
        if not numactl:
            warnings.append(
                "vLLM's --numa-bind runs workers under numactl, which is not on this host (apt-get install numactl)"
            )
    elif numactl:
        prefix = [numactl, f"--cpunodebind={node}", f"--membind={node}", "--"]
    else:
        warnings.append(
            f"{inst['name']}: numactl not found: NUMA node {node} not bound (apt-get install numactl)"
        )

    if srv.get("extra_args"):
        warnings.append(
            f"server.extra_args appended as given (not checked against the plan): {' '.join(srv['extra_args'])}"
        )
        args += [(a, None) for a in srv["extra_args"]]
    secrets = {"VLLM_API_KEY": srv["api_key_env"]} if srv.get("api_key_env") else {}
    model = plan["model"]["path"] or plan["model"]["name"]
    return Rendered(
        name=inst["name"],
        vllm_version=rel.target,
        flag_table=rel.table,
        prefix=prefix,
        command=[vllm_command, "serve", model],
        args=args,
        env=env,
        secrets=secrets,
        numa_node=node,
        cpus=inst.get("cpus"),
        gpus=list(inst["gpus"]),
        device=inst["device"],
        stop_timeout_s=int(srv.get("shutdown_timeout") or 0) + 20,
        warnings=warnings,
    )


def _speculative(
    inst: dict[str, Any], e: dict[str, Any], rel: Release, args: list[Pair], warnings: list[str]
) -> None:
    spec = inst.get("speculative")
    if not spec:
        return
    v = rel.v
    method, model, k = spec["method"], spec.get("model"), int(spec["num_speculative_tokens"])
    lookup_max, lookup_min = spec.get("prompt_lookup_max", 4), spec.get("prompt_lookup_min", 2)
    if method == "draft_model" and (0, 10, 0) <= v < (0, 15, 0):
        warnings.append(
            f"vLLM {rel.table} (V1 engine) has no draft-model speculation (NotImplementedError until 0.15.0): "
            f"ngram prompt lookup instead of {model}"
        )
        method, model = "ngram", None
    table = rel.spec_table()
    methods = table["methods"] if table else ["draft_model", "ngram"]
    if method not in methods:
        warnings.append(
            f"speculative method {method} does not exist in vLLM {rel.table} (has {', '.join(methods)}): speculative decoding off"
        )
        return

    by_batch = spec.get("num_speculative_tokens_per_batch_size")
    disable_by_batch: int | None = None
    per_batch: list[list[int]] | None = None
    keys = table["keys"] if table else []
    if by_batch:
        if "num_speculative_tokens_per_batch_size" in keys:
            per_batch = [
                [lo, hi if hi is not None else max(lo, e["max_num_seqs"]), kk] for lo, hi, kk in by_batch
            ]
        else:
            k = by_batch[0][2] or k
            off = next((row[0] for row in by_batch if row[2] <= 1), None)
            if off is not None and (("disable_by_batch_size" in keys) or (table is None and v < (0, 8, 2))):
                disable_by_batch = off
                warnings.append(
                    f"vLLM {rel.table} has no k by batch size (0.25+): k={k} at light load, speculation off from "
                    f"batch size {off} (disable_by_batch_size), the nearest it offers"
                )
            else:
                warnings.append(
                    f"vLLM {rel.table} has no k by batch size (0.25+) nor disable_by_batch_size: a fixed k={k}"
                )

    if v < (0, 8, 2):  # legacy flags
        args.append(("--speculative-model", model if method == "draft_model" else "[ngram]"))
        args.append(("--num-speculative-tokens", k))
        if method == "ngram":
            args += [("--ngram-prompt-lookup-max", lookup_max), ("--ngram-prompt-lookup-min", lookup_min)]
        elif spec.get("draft_tensor_parallel_size"):
            args.append(("--speculative-draft-tensor-parallel-size", spec["draft_tensor_parallel_size"]))
        if disable_by_batch is not None:
            args.append(("--speculative-disable-by-batch-size", disable_by_batch))
        return
    cfg: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
    if model:
        cfg["model"] = model
    if method == "ngram":
        cfg["prompt_lookup_max"], cfg["prompt_lookup_min"] = lookup_max, lookup_min
    if spec.get("draft_tensor_parallel_size") and method == "draft_model":
        cfg["draft_tensor_parallel_size"] = spec["draft_tensor_parallel_size"]
    if disable_by_batch is not None:
        cfg["disable_by_batch_size"] = disable_by_batch
    if per_batch:
        cfg["num_speculative_tokens_per_batch_size"] = per_batch
    if keys:
        for key in [key for key in cfg if key not in keys]:
            warnings.append(f"speculative key {key} does not exist in vLLM {rel.table}: dropped")
            del cfg[key]
    args.append(("--speculative-config", json.dumps(cfg, separators=(",", ":"))))
