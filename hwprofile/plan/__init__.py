"""The planner: host snapshot + merged settings + model facts → a launch plan, every value with its
reason and where it came from. Pure: it reads no files and probes nothing (the model catalog and the
GPU table are package data)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..config import ConfigError, Source
from ..config.layers import get
from ..config.schema import with_defaults
from ..model import ModelFacts
from ..snapshot import Gpu, HostSnapshot
from . import gpufacts
from .memory import (
    BLOCK_TOKENS,
    CPU_BLOCK_TOKENS,
    Fit,
    GiB,
    MiB,
    active_weights_bytes,
    fit,
    kv_bytes_per_token,
    kv_tokens_in,
    longest_context,
    sequence_bytes,
)

if TYPE_CHECKING:
    from typing import Any

SCHEMA = "hwprofile.plan/1"
TP_SIZES = (1, 2, 4, 8, 16, 32, 64)
AVERAGE_FILL = 0.5  # assumed share of max_model_len an average request occupies (concurrency cap)


class PlanRefused(Exception):
    """The model cannot run on this host under these settings; ``suggestions`` say what would."""

    def __init__(self, message: str, suggestions: list[str]) -> None:
        super().__init__(message)
        self.message = message
        self.suggestions = suggestions


class Reasons:
    """Collects ``(key, value, reason, source)`` for every planned value."""

    def __init__(self, provenance: Mapping[tuple[str, ...], Source]) -> None:
        self.items: list[dict[str, Any]] = []
        self.provenance = provenance

    def add(self, key: str, value: Any, reason: str, setting: tuple[str, ...] | None = None) -> Any:
        src = self.provenance.get(setting) if setting else None
        self.items.append(
            {"key": key, "value": value, "reason": reason, "source": str(src) if src else "planner"}
        )
        return value


def _s(settings: Mapping[str, Any], *path: str) -> Any:
    return get(settings, path)


# -- layout ---------------------------------------------------------------------------------


def _group_by_model(gpus: tuple[Gpu, ...]) -> list[list[Gpu]]:
    groups: dict[tuple[str | None, int], list[Gpu]] = {}
    for g in gpus:
        groups.setdefault((g.name, round((g.memory_total_bytes or 0) / GiB)), []).append(g)
    return list(groups.values())


def _nvlinked(host: HostSnapshot, gpus: list[Gpu]) -> bool:
    if len(gpus) < 2:
        return bool(gpus and gpus[0].nvlink_active_links)
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            lk = host.link(a.index, b.index)
            if not (lk and lk.link and lk.link.startswith("NV")):
                return False
    return True


def _tp_ok(model: ModelFacts, tp: int) -> bool:
    kv = model.num_kv_heads
    return model.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def _partition(
    host: HostSnapshot, gpus: list[Gpu], tp: int, warnings: list[str], nvlink: bool = False
) -> list[list[Gpu]]:
    """Split into groups of ``tp``: GPUs of one NUMA node together, best-linked pairs first."""
    by_node: dict[int | None, list[Gpu]] = {}
    for g in sorted(gpus, key=lambda g: (g.numa_node if g.numa_node is not None else -1, g.index)):
        by_node.setdefault(g.numa_node, []).append(g)
    out: list[list[Gpu]] = []
    leftovers: list[Gpu] = []
    for node_gpus in by_node.values():
        while len(node_gpus) >= tp:
            out.append(node_gpus[:tp])
            node_gpus = node_gpus[tp:]
        leftovers += node_gpus
    while len(leftovers) >= tp:
        grp, leftovers = leftovers[:tp], leftovers[tp:]
        if not nvlink:
            warnings.append(
                f"GPUs {[g.index for g in grp]} share a tensor-parallel group across NUMA nodes (over PCIe)"
            )
        out.append(grp)
    if leftovers:
        warnings.append(
            f"GPU(s) {[g.index for g in leftovers]} left idle: not enough GPUs for another TP={tp} group"
        )
    return sorted(out, key=lambda grp: grp[0].index)


# -- the plan -----------------------------------------------------------------------------


def build_plan(
    host: HostSnapshot,
    settings: Mapping[str, Any],
    provenance: Mapping[tuple[str, ...], Source],
    profile: str,
    matched_because: list[str],
    model: ModelFacts,
    draft: ModelFacts | None,
) -> dict[str, Any]:
    # Every setting the layers left unset takes its schema default (the only default there is):
    # below, settings are read without fallbacks, so an explicit 0 stays 0.
    settings, filled = with_defaults(settings)
    r = Reasons({**{p: Source("default", "schema") for p in filled}, **provenance})
    warnings: list[str] = []
    gpus = host.usable_gpus
    if any(g.lost for g in host.gpus):
        warnings.append(f"GPU(s) {[g.index for g in host.gpus if g.lost]} are lost and not planned for")

    model = _choose_checkpoint(model, settings, r, warnings, gpus)
    spec_method, draft = _choose_speculator(
        model, draft, settings, r, warnings, _heterogeneous_vocab_ok(host.software.vllm_version)
    )

    try:
        instances = _instances(host, settings, model, draft, spec_method, r, warnings)
    except PlanRefused:
        variant = model.quantized_variants.get(4)
        # 4-bit AWQ checkpoints need GPU kernels: no automatic switch for the CPU backend.
        if not (variant and gpus and model.bits > 4 and _s(settings, "engine", "weights_bits") == "auto"):
            raise
        r.items.clear()
        r.add(
            "model.name",
            variant,
            f"{model.name} at {model.bits} bits does not fit this host; its 4-bit checkpoint {variant} does (engine.weights_bits: auto)",
            ("engine", "weights_bits"),
        )
        model = _choose_checkpoint(
            model,
            {**settings, "engine": {**settings["engine"], "weights_bits": 4}},
            Reasons({}),
            warnings,
            gpus,
        )
        spec_method, draft = _choose_speculator(
            model, draft, settings, r, warnings, _heterogeneous_vocab_ok(host.software.vllm_version)
        )
        instances = _instances(host, settings, model, draft, spec_method, r, warnings)
    return {
        "schema": SCHEMA,
        "profile": profile,
        "matched_because": matched_because,
        "host": {"hostname": host.hostname, "gpus": len(gpus), "vllm_version": host.software.vllm_version},
        "model": _model_json(model),
        "draft": _model_json(draft) if draft else None,
        "instances": instances,
        "supervise": dict(settings["supervise"]),
        "logs": dict(settings["logs"]),
        "watch": dict(settings["watch"]),
        "degrade": dict(settings["degrade"]),
        "reasons": r.items,
        "provenance": {".".join(k): str(v) for k, v in sorted(provenance.items())},
        "warnings": warnings,
    }


def _instances(
    host: HostSnapshot,
    settings: Mapping[str, Any],
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    r: Reasons,
    warnings: list[str],
) -> list[dict[str, Any]]:
    gpus = host.usable_gpus
    instances: list[dict[str, Any]] = []
    if not gpus:
        instances.append(_cpu_instance(host, settings, model, draft, spec_method, r, warnings))
    else:
        groups = _group_by_model(gpus)
        if len(groups) > 1:
            warnings.append(
                "mixed GPU models: "
                + "; ".join(f"{grp[0].name} x{len(grp)}" for grp in groups)
                + " — planned separately, never tensor parallel across models"
            )
        replicas = _s(settings, "layout", "replicas")
        strategy = _s(settings, "layout", "strategy")
        for grp in groups:
            tp = _choose_tp(host, grp, model, draft, settings, strategy, r, warnings)
            parts = _partition(host, grp, tp, warnings, nvlink=_nvlinked(host, grp))
            for part in parts:
                instances.append({"gpus": part, "tp": tp})
        if strategy == "single":
            replicas = 1
        if isinstance(replicas, int) and replicas < len(instances):
            idle = [g.index for inst in instances[replicas:] for g in inst["gpus"]]
            r.add(
                "layout.replicas",
                replicas,
                f"{replicas} instance(s) asked for; GPU(s) {idle} stay free",
                ("layout", "replicas"),
            )
            instances = instances[:replicas]
        elif isinstance(replicas, int) and replicas > len(instances):
            warnings.append(f"{replicas} replicas asked for, but the GPUs allow {len(instances)}")
        _check_ports(settings, len(instances), r)
        instances = [
            _gpu_instance(host, i, inst["gpus"], inst["tp"], settings, model, draft, spec_method, r, warnings)
            for i, inst in enumerate(instances)
        ]
    return instances


def _check_ports(settings: Mapping[str, Any], count: int, r: Reasons) -> None:
    """Instances take consecutive ports from server.port: the last must still be a port."""
    first = int(_s(settings, "server", "port"))
    last = first + count - 1
    if last > 65_535:
        src = r.provenance.get(("server", "port"))
        raise ConfigError(
            f"server.port {first} ({src or 'default'}): {count} instances take ports {first}-{last}, "
            f"and ports end at 65535; set server.port to at most {65_536 - count} "
            "(or plan fewer instances with layout.replicas)"
        )


def _model_json(m: ModelFacts) -> dict[str, Any]:
    return {
        "name": m.name,
        "source": m.source,
        "path": m.path,
        "architecture": m.architecture,
        "params": m.params,
        "weights_bytes": m.weights_bytes,
        "weights_bytes_source": m.weights_bytes_source,
        "bits": m.bits,
        "quantization": m.quant_method,
        "layers": m.num_layers,
        "kv_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "vocab_size": m.vocab_size,
        "sliding_window": m.sliding_window,
        "sliding_layers": m.sliding_layers,
    }


def _choose_checkpoint(
    model: ModelFacts, settings: Mapping[str, Any], r: Reasons, warnings: list[str], gpus: tuple[Gpu, ...]
) -> ModelFacts:
    """Honour ``engine.weights_bits``: a catalog model switches to its quantized checkpoint; a local
    checkpoint cannot be re-quantized here."""
    bits = _s(settings, "engine", "weights_bits")
    if not isinstance(bits, int) or bits >= model.bits:
        return model
    variant = model.quantized_variants.get(bits)
    if variant:
        new = model._replace(
            name=variant, quant_method="awq", quant_bits=bits, weights_bytes=model.weights_bytes_at_bits(bits)
        )
        r.add(
            "model.name",
            variant,
            f"engine.weights_bits={bits}: the {bits}-bit checkpoint of {model.name}",
            ("engine", "weights_bits"),
        )
        return new
    raise PlanRefused(
        f"engine.weights_bits={bits} asks for a {bits}-bit checkpoint, but {model.name} is {model.bits}-bit "
        "and hwprofile does not re-quantize weights",
        [
            f"point --model at a {bits}-bit (AWQ/GPTQ) checkpoint of this model",
            "or remove engine.weights_bits",
        ],
    )


def _draft_candidates(model: ModelFacts, want_b: float) -> list[ModelFacts]:
    from ..model import catalog_models

    out = [d for d in catalog_models() if d.model_type == model.model_type and d.params * 4 <= model.params]
    return sorted(out, key=lambda d: abs(d.params / 1e9 - want_b))


def _heterogeneous_vocab_ok(vllm_version: str | None) -> bool:
    """vLLM 0.25+ runs a draft with another vocabulary (``use_heterogeneous_vocab``); older releases
    refuse it (facts: shared/facts/vllm-flags.md, speculative config)."""
    if not vllm_version:
        return False
    parts = vllm_version.split(".")
    try:
        return (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= (0, 25)
    except (ValueError, IndexError):
        return False


def _choose_speculator(
    model: ModelFacts,
    draft: ModelFacts | None,
    settings: Mapping[str, Any],
    r: Reasons,
    warnings: list[str],
    hetero_ok: bool = False,
) -> tuple[str | None, ModelFacts | None]:
    method = _s(settings, "speculative", "method")
    src = ("speculative", "method")
    if method == "none":
        r.add("speculative.method", None, "speculative decoding is off", src)
        return None, None
    if method in ("ngram", "suffix"):
        r.add(
            "speculative.method",
            method,
            f"{method} asked for: proposals from the prompt, no draft model",
            src,
        )
        return method, None
    if method in ("eagle", "eagle3"):
        if draft is None:
            raise PlanRefused(
                f"speculative.method={method} needs speculative.draft (an EAGLE head for this model)",
                ["set speculative.draft to the EAGLE checkpoint", "or use speculative.method=ngram"],
            )
        r.add("speculative.method", method, f"{method} head {draft.name}", src)
        return method, draft
    if method == "mtp" or (method == "auto" and model.mtp_layers and draft is None):
        if not model.mtp_layers:
            raise PlanRefused(
                f"speculative.method=mtp, but {model.name} ships no multi-token-prediction layers",
                ["use speculative.method=draft_model or ngram"],
            )
        r.add(
            "speculative.method",
            "mtp",
            f"{model.name} ships {model.mtp_layers} MTP layer(s): no separate draft needed",
            src,
        )
        return "mtp", None
    # draft_model or auto
    want_b = float(_s(settings, "speculative", "draft_params_b"))
    if draft is not None:
        if draft.vocab_size != model.vocab_size and hetero_ok:
            r.add(
                "speculative.method",
                "draft_model",
                f"draft {draft.name} has vocab_size {draft.vocab_size}, the target {model.vocab_size}: the "
                "installed vLLM (0.25+) runs it with use_heterogeneous_vocab (proposals mapped through the "
                "shared tokens)",
                ("speculative", "draft"),
            )
            return "draft_model", draft
        if draft.vocab_size != model.vocab_size:
            msg = (
                f"draft {draft.name} has vocab_size {draft.vocab_size} but the target has {model.vocab_size}: "
                "vLLM before 0.25 refuses a draft whose vocabulary differs (0.25+ accepts it with "
                "use_heterogeneous_vocab)"
            )
            warnings.append(msg + "; falling back to ngram")
            r.add("speculative.method", "ngram", msg + "; ngram proposals instead", ("speculative", "draft"))
            return "ngram", None
        r.add(
            "speculative.method",
            "draft_model",
            f"draft {draft.name} ({draft.params / 1e9:.1f}B) shares the target's vocabulary ({model.vocab_size})",
            ("speculative", "draft"),
        )
        return "draft_model", draft
    rejected = []
    for cand in _draft_candidates(model, want_b):
        if cand.params > 3 * want_b * 1e9:
            rejected.append(
                f"{cand.name} ({cand.params / 1e9:.1f}B) is far above the ~{want_b:g}B draft class"
            )
            continue
        if cand.vocab_size != model.vocab_size:
            rejected.append(f"{cand.name}: vocab_size {cand.vocab_size} != {model.vocab_size}")
            continue
        r.add(
            "speculative.method",
            "draft_model",
            f"catalog draft {cand.name} ({cand.params / 1e9:.1f}B, same family, same vocab_size {model.vocab_size}) "
            f"is the closest to the profile's ~{want_b:g}B draft class",
            ("speculative", "draft_params_b"),
        )
        return "draft_model", cand
    why = "; ".join(rejected[:3]) or f"no catalog draft of the {model.model_type or 'unknown'} family"
    if method == "draft_model":
        raise PlanRefused(
            f"speculative.method=draft_model but no compatible draft: {why}",
            ["set speculative.draft to a model with the same vocabulary", "or use speculative.method=ngram"],
        )
    r.add(
        "speculative.method",
        "ngram",
        f"no compatible draft model ({why}); ngram prompt lookup needs none",
        src,
    )
    return "ngram", None


def _kv_dtype(
    settings: Mapping[str, Any], gpu: Gpu | None, model: ModelFacts, r: Reasons, key: str
) -> tuple[str, int]:
    want = _s(settings, "engine", "kv_cache_dtype")
    src = ("engine", "kv_cache_dtype")
    if want == "fp8_if_supported":
        row = gpufacts.lookup(gpu.name, gpu.memory_total_gib) if gpu else None
        fp8 = bool(row and row.get("fp8_support"))
        if fp8:
            r.add(
                key,
                "fp8",
                f"8-bit KV cache: {gpu.name if gpu else '?'} has FP8 hardware (datasheet table); halves KV bytes per token",
                src,
            )
            return "fp8", 1
        r.add(
            key,
            "auto",
            f"KV cache in the model's dtype ({model.dtype}): {gpu.name if gpu else 'this device'} has no FP8 hardware",
            src,
        )
        return "auto", model.dtype_bytes
    if want.startswith("fp8"):
        r.add(key, want, "8-bit KV cache as configured", src)
        return want, 1
    if want in ("bfloat16", "float16"):
        r.add(key, want, "KV cache dtype as configured", src)
        return want, 2
    r.add(key, "auto", f"KV cache in the model's dtype ({model.dtype})", src)
    return "auto", model.dtype_bytes


def _fit_args(settings: Mapping[str, Any], eager: bool) -> dict[str, Any]:
    return {
        "context_bytes": _s(settings, "memory", "cuda_context_bytes"),
        "graph_bytes": 0 if eager else _s(settings, "memory", "cuda_graph_bytes"),
        "margin_bytes": _s(settings, "memory", "margin_bytes"),
        "activation_factor": _s(settings, "memory", "activation_factor"),
    }


def _choose_tp(
    host: HostSnapshot,
    grp: list[Gpu],
    model: ModelFacts,
    draft: ModelFacts | None,
    settings: Mapping[str, Any],
    strategy: str,
    r: Reasons,
    warnings: list[str],
) -> int:
    want = _s(settings, "layout", "tensor_parallel_size")
    nvlink = _nvlinked(host, grp)
    cap_pcie = _s(settings, "layout", "max_pcie_tensor_parallel")
    usable = [t for t in TP_SIZES if t <= len(grp) and _tp_ok(model, t)]
    src = ("layout", "tensor_parallel_size")
    if strategy == "numa_pairs" and want == "auto":
        want = 2
    if strategy == "replicas" and want == "auto":
        want = 1
    if isinstance(want, int):
        if want > len(grp):
            raise PlanRefused(
                f"tensor_parallel_size={want} needs {want} GPUs of one model; this host has {len(grp)} {grp[0].name}",
                [f"--set layout.tensor_parallel_size={max(usable or [1])}"],
            )
        if not _tp_ok(model, want):
            raise PlanRefused(
                f"tensor_parallel_size={want} does not divide {model.name}'s {model.num_heads} attention heads "
                f"({model.num_kv_heads} KV heads)",
                [f"--set layout.tensor_parallel_size={t}" for t in usable[-2:]],
            )
        if want > cap_pcie and not nvlink:
            warnings.append(
                f"tensor parallel {want} over PCIe: vLLM disables its custom all-reduce beyond 2 GPUs without NVLink"
            )
        r.add(
            "tensor_parallel_size",
            want,
            f"tensor parallel {want} as configured" + (" (NVLink)" if nvlink else " (PCIe)"),
            src,
        )
        return want
    if nvlink and len(grp) > 1 and strategy in ("auto", "tensor_parallel"):
        tp = max(usable)
        r.add(
            "tensor_parallel_size",
            tp,
            f"all {len(grp)} GPUs are NVLink-connected: one tensor-parallel instance over {tp}",
            src,
        )
        return tp
    if strategy == "tensor_parallel":
        tp = max(usable)
        if tp > cap_pcie:
            warnings.append(
                f"tensor parallel {tp} over PCIe: vLLM disables its custom all-reduce beyond 2 GPUs without NVLink"
            )
        r.add(
            "tensor_parallel_size",
            tp,
            f"strategy tensor_parallel: one instance over {tp} GPUs",
            ("layout", "strategy"),
        )
        return tp
    # PCIe: the smallest TP that fits, at most the PCIe cap.
    gpu = grp[0]
    eager = bool(_s(settings, "engine", "enforce_eager"))
    need = _s(settings, "engine", "min_model_len")
    for tp in [t for t in usable if t <= cap_pcie]:
        f = fit(
            gpu.memory_total_bytes or 0,
            _s(settings, "engine", "gpu_memory_utilization"),
            model,
            draft,
            tp,
            1 if str(_s(settings, "engine", "kv_cache_dtype")).startswith("fp8") else model.dtype_bytes,
            _s(settings, "engine", "max_num_batched_tokens"),
            _s(settings, "engine", "max_num_seqs"),
            **_fit_args(settings, eager),
        )
        if f.fits and f.kv_cache_bytes >= sequence_bytes(model, draft, tp, model.dtype_bytes, need):
            why = "fits on one GPU" if tp == 1 else f"needs {tp} GPUs' memory"
            r.add(
                "tensor_parallel_size",
                tp,
                f"{model.name} {why}; PCIe-only GPUs: as little tensor parallelism as fits, the rest become replicas",
                src,
            )
            return tp
    return max([t for t in usable if t <= cap_pcie] or [1])


def _gpu_instance(
    host: HostSnapshot,
    i: int,
    gpus: list[Gpu],
    tp: int,
    settings: Mapping[str, Any],
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    r: Reasons,
    warnings: list[str],
) -> dict[str, Any]:
    name = "vllm-gpu" + "-".join(str(g.index) for g in gpus)
    key = f"instances[{i}]"
    pp = _s(settings, "layout", "pipeline_parallel_size")
    gpu = min(gpus, key=lambda g: g.memory_total_bytes or 0)
    total = gpu.memory_total_bytes or 0

    # NUMA
    nodes = {g.numa_node for g in gpus}
    numa = next(iter(nodes)) if len(nodes) == 1 else None
    if not _s(settings, "layout", "numa_bind"):
        r.add(f"{key}.numa_node", None, "NUMA binding is off", ("layout", "numa_bind"))
        numa = None
    elif numa is None and None not in nodes:
        r.add(
            f"{key}.numa_node",
            None,
            f"GPUs {[g.index for g in gpus]} span NUMA nodes {sorted(nodes)}: each rank bound to its own "
            "GPU's node where vLLM binds per rank (0.20+, --numa-bind-nodes), else not bound",
            ("layout", "numa_bind"),
        )
    elif numa is None:
        warnings.append(f"{name}: NUMA node unknown or mixed ({sorted(map(str, nodes))}); no binding")
        r.add(
            f"{key}.numa_node",
            None,
            "GPUs' NUMA node unknown or not shared: not bound",
            ("layout", "numa_bind"),
        )
    else:
        r.add(
            f"{key}.numa_node",
            numa,
            f"GPU(s) {[g.index for g in gpus]} sit on NUMA node {numa} (from {gpu.numa_node_source})",
            ("layout", "numa_bind"),
        )
    cpus = next((n.cpus for n in host.numa_nodes if n.id == numa), None) if numa is not None else None

    # memory share, corrected for memory other processes already hold
    util = float(_s(settings, "engine", "gpu_memory_utilization"))
    r.add(
        f"{key}.engine.gpu_memory_utilization",
        util,
        f"{util:.2f} of each GPU's {total / GiB:.1f} GiB for this instance",
        ("engine", "gpu_memory_utilization"),
    )
    used = max((g.memory_used_bytes or 0) + (g.memory_reserved_bytes or 0) for g in gpus)
    if total and used > total * (1 - util):
        new = round(max(0.05, (total - used - 256 * MiB) / total), 3)
        warnings.append(
            f"{name}: {used / GiB:.1f} GiB already in use on GPU {gpu.index}; memory share lowered to {new}"
        )
        r.add(
            f"{key}.engine.gpu_memory_utilization",
            new,
            f"vLLM fails when free memory < total × share; {used / GiB:.1f} GiB is taken by other processes",
        )
        util = new

    kv_name, kv_bytes = _kv_dtype(settings, gpu, model, r, f"{key}.engine.kv_cache_dtype")
    eager = bool(_s(settings, "engine", "enforce_eager"))
    r.add(
        f"{key}.engine.enforce_eager",
        eager,
        "CUDA graphs off (eager)"
        if eager
        else "CUDA graphs on: they work with speculative decoding and cut launch overhead",
        ("engine", "enforce_eager"),
    )
    batched = int(_s(settings, "engine", "max_num_batched_tokens"))
    seqs = int(_s(settings, "engine", "max_num_seqs"))

    f = fit(total, util, model, draft, tp, kv_bytes, batched, seqs, **_fit_args(settings, eager))
    if draft is not None and not f.fits:
        no_draft = fit(total, util, model, None, tp, kv_bytes, batched, seqs, **_fit_args(settings, eager))
        if no_draft.fits:
            warnings.append(
                f"{name}: the draft {draft.name} does not fit beside the target; ngram speculation instead"
            )
            r.add(
                f"{key}.speculative.method",
                "ngram",
                f"draft {draft.name} ({draft.weights_bytes / GiB:.1f} GiB) leaves no room for the KV cache",
            )
            draft, spec_method = None, "ngram"
        f = no_draft  # refuse (below) on the target's own needs
    if not f.fits:
        raise PlanRefused(
            f"{model.name} does not fit on {gpu.name} x{tp}: weights {f.weights_bytes / GiB:.1f} GiB per GPU "
            f"+ activations {f.activation_bytes / GiB:.1f} GiB + overhead {f.overhead_bytes / GiB:.1f} GiB "
            f"exceed the {f.budget_bytes / GiB:.1f} GiB budget ({util:.2f} of {total / GiB:.1f} GiB)",
            _suggestions(host, model, tp, f, total, util),
        )

    # context length
    want_len = int(_s(settings, "engine", "max_model_len"))
    min_len = int(_s(settings, "engine", "min_model_len"))
    length = want_len
    if model.max_position_embeddings and length > model.max_position_embeddings:
        length = int(model.max_position_embeddings)
        r.add(
            f"{key}.engine.max_model_len",
            length,
            f"capped at the model's max_position_embeddings ({length})",
            ("engine", "max_model_len"),
        )
    one = sequence_bytes(model, draft, tp, kv_bytes, length)
    # vLLM keeps one block of the pool as its null block: a request gets the others.
    usable = f.kv_cache_bytes - f.kv_bytes_per_token * BLOCK_TOKENS
    if one > usable:
        fits_len = longest_context(model, draft, tp, kv_bytes, usable)
        if fits_len < min_len:
            raise PlanRefused(
                f"{model.name} on {gpu.name} x{tp}: after weights the KV cache gets {f.kv_cache_bytes / GiB:.2f} GiB, "
                f"enough for {fits_len} tokens of context; the profile needs at least {min_len}",
                _suggestions(host, model, tp, f, total, util),
            )
        r.add(
            f"{key}.engine.max_model_len",
            fits_len,
            f"{length} tokens would need {one / GiB:.2f} GiB of KV cache, {f.kv_cache_bytes / GiB:.2f} GiB is left: shortened to the longest that fits",
            ("engine", "max_model_len"),
        )
        length = fits_len
    else:
        r.add(
            f"{key}.engine.max_model_len",
            length,
            f"one {length}-token request needs {one / GiB:.2f} GiB of the {f.kv_cache_bytes / GiB:.2f} GiB KV cache",
            ("engine", "max_model_len"),
        )

    # concurrency: vLLM preallocates the KV cache, so more sequences than it holds queue or get
    # preempted rather than run out of memory; say so instead of silently lowering the setting.
    full_len = f.kv_cache_bytes // max(1, sequence_bytes(model, draft, tp, kv_bytes, length))
    half = max(
        1,
        int(
            f.kv_cache_bytes
            // max(1, sequence_bytes(model, draft, tp, kv_bytes, max(16, int(length * AVERAGE_FILL))))
        ),
    )
    holds = f"the KV cache holds {half} requests at {int(AVERAGE_FILL * 100)}% of max_model_len, {full_len} at full length"
    if seqs > half:
        warnings.append(
            f"{name}: max_num_seqs {seqs} > {half} ({holds}); under long requests vLLM will queue or preempt"
        )
        r.add(
            f"{key}.engine.max_num_seqs",
            seqs,
            f"{seqs} as configured; {holds} (more queue or are preempted)",
            ("engine", "max_num_seqs"),
        )
    else:
        r.add(f"{key}.engine.max_num_seqs", seqs, holds, ("engine", "max_num_seqs"))
    chunked = bool(_s(settings, "engine", "enable_chunked_prefill"))
    if batched < seqs:
        batched = seqs
        r.add(
            f"{key}.engine.max_num_batched_tokens",
            batched,
            "raised to max_num_seqs (vLLM requires max_num_batched_tokens >= max_num_seqs)",
        )
    elif not chunked and batched < length:
        batched = length
        r.add(
            f"{key}.engine.max_num_batched_tokens",
            batched,
            "raised to max_model_len: without chunked prefill a whole prompt must fit one step",
        )
    else:
        r.add(
            f"{key}.engine.max_num_batched_tokens",
            batched,
            "tokens per scheduler step",
            ("engine", "max_num_batched_tokens"),
        )

    quant = model.quant_method
    engine = {
        "gpu_memory_utilization": util,
        "max_model_len": length,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": batched,
        "kv_cache_dtype": kv_name,
        "quantization": quant,
        "dtype": _s(settings, "engine", "dtype"),
        "enforce_eager": eager,
        "enable_prefix_caching": bool(_s(settings, "engine", "enable_prefix_caching")),
        "enable_chunked_prefill": chunked,
    }
    r.add(
        f"{key}.engine.quantization",
        quant,
        f"from the checkpoint's quantization_config ({quant})" if quant else "unquantized checkpoint",
    )
    spec = _speculative(settings, spec_method, draft, tp, r, key)
    port = int(_s(settings, "server", "port")) + i
    return {
        "name": name,
        "device": "cuda",
        "gpus": [g.index for g in gpus],
        "gpu_uuids": [g.uuid for g in gpus],
        "gpu_minors": [g.minor_number for g in gpus],
        "gpu_name": gpu.name,
        "numa_node": numa,
        "gpu_numa_nodes": [g.numa_node for g in gpus] if _s(settings, "layout", "numa_bind") else [],
        "cpus": cpus,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "server": _server(settings, port),
        "engine": engine,
        "speculative": spec,
        "memory": _memory_json(f, model, draft, tp, kv_bytes, length),
        "estimate": _estimate(gpu, model, draft, tp, spec, settings),
    }


def _server(settings: Mapping[str, Any], port: int) -> dict[str, Any]:
    return {
        "host": _s(settings, "server", "host"),
        "port": port,
        "served_model_name": _s(settings, "server", "served_model_name"),
        "api_key_env": _s(settings, "server", "api_key_env"),
        "shutdown_timeout": int(_s(settings, "server", "shutdown_timeout")),
        "vllm_command": _s(settings, "server", "vllm_command"),
        "user": _s(settings, "server", "user"),
        "metrics": _s(settings, "server", "metrics") is not False,
        "extra_args": list(_s(settings, "server", "extra_args")),
    }


def _speculative(
    settings: Mapping[str, Any], method: str | None, draft: ModelFacts | None, tp: int, r: Reasons, key: str
) -> dict[str, Any] | None:
    if method is None:
        return None
    k = int(_s(settings, "speculative", "num_speculative_tokens"))
    r.add(
        f"{key}.speculative.num_speculative_tokens",
        k,
        f"{k} tokens proposed per step",
        ("speculative", "num_speculative_tokens"),
    )
    spec: dict[str, Any] = {
        "method": method,
        "model": draft.path or draft.name if draft else None,
        "num_speculative_tokens": k,
    }
    if draft is not None:
        spec["draft_tensor_parallel_size"] = tp
        r.add(
            f"{key}.speculative.draft_tensor_parallel_size",
            tp,
            "vLLM (>= 0.15) requires the draft's TP to equal the target's",
        )
    if method == "ngram":
        spec["prompt_lookup_max"] = int(_s(settings, "speculative", "prompt_lookup_max"))
        spec["prompt_lookup_min"] = int(_s(settings, "speculative", "prompt_lookup_min"))
    table = _s(settings, "speculative", "by_batch_size")
    if table:
        spec["num_speculative_tokens_per_batch_size"] = table
        r.add(
            f"{key}.speculative.num_speculative_tokens_per_batch_size",
            table,
            "k chosen by the running batch size (vLLM has no per-request k): fewer proposals as load grows",
            ("speculative", "by_batch_size"),
        )
    return spec


def _memory_json(
    f: Fit, model: ModelFacts, draft: ModelFacts | None, tp: int, kv_bytes: int, length: int
) -> dict[str, Any]:
    return {
        "budget_bytes": f.budget_bytes,
        "weights_bytes": f.weights_bytes,
        "draft_weights_bytes": f.draft_weights_bytes,
        "activation_bytes": f.activation_bytes,
        "overhead_bytes": f.overhead_bytes,
        "kv_cache_bytes": f.kv_cache_bytes,
        "kv_bytes_per_token": f.kv_bytes_per_token,
        "kv_bytes_per_token_target": kv_bytes_per_token(model, tp, kv_bytes),
        "kv_bytes_per_token_draft": kv_bytes_per_token(draft, tp, kv_bytes) if draft else 0,
        "kv_tokens": f.kv_tokens,
        "block_size": BLOCK_TOKENS,
        "kv_bytes_per_max_len_request": sequence_bytes(model, draft, tp, kv_bytes, length),
    }


def _estimate(
    gpu: Gpu,
    model: ModelFacts,
    draft: ModelFacts | None,
    tp: int,
    spec: dict[str, Any] | None,
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    row = gpufacts.lookup(gpu.name, gpu.memory_total_gib)
    bw = row.get("memory_bandwidth_gbs") if row else None
    out: dict[str, Any] = {"gpu_datasheet": row["name"] if row else None, "memory_bandwidth_gbs": bw}
    if not bw:
        out["note"] = "no bandwidth figure for this GPU in the datasheet table"
        return out
    bytes_per_gpu = active_weights_bytes(model) / tp  # MoE: only the routed experts are read
    base = bw * 1e9 / bytes_per_gpu
    out["bytes_read_per_token_per_gpu"] = int(bytes_per_gpu)
    out["decode_tok_s_ceiling_batch1"] = round(base, 1)
    if spec:
        a = float(_s(settings, "speculative", "assumed_acceptance"))
        k = int(spec["num_speculative_tokens"])
        expected = (1 - a ** (k + 1)) / (1 - a)
        draft_bytes = (active_weights_bytes(draft) / tp) if draft else 0.0
        step_bytes = bytes_per_gpu + k * draft_bytes
        out["assumed_acceptance"] = a
        out["expected_tokens_per_step"] = round(expected, 2)
        out["decode_tok_s_ceiling_batch1_speculative"] = round(expected * bw * 1e9 / step_bytes, 1)
    out["basis"] = (
        "memory bandwidth / weight bytes read per token (batch 1, short context, no compute or communication cost; "
        "a mixture of experts reads its active parameters only: shared weights + the experts each token is routed to)"
    )
    return out


def _suggestions(
    host: HostSnapshot, model: ModelFacts, tp: int, f: Fit, total: int, util: float
) -> list[str]:
    out: list[str] = []
    need = f.weights_bytes + f.draft_weights_bytes + f.activation_bytes + f.overhead_bytes + 2 * GiB
    fixed = f.budget_bytes - f.kv_cache_bytes  # everything but the KV cache
    if model.bits > 4:
        w4 = model.weights_bytes_at_bits(4) / tp
        variant = model.quantized_variants.get(4)
        out.append(
            f"a 4-bit checkpoint ({variant or 'AWQ/GPTQ'}): ~{w4 / GiB:.1f} GiB of weights per GPU instead of {f.weights_bytes / GiB:.1f}"
            + (f" (--model {variant} or --set engine.weights_bits=4)" if variant else "")
        )
    if fixed < f.budget_bytes:
        out.append("a shorter context (--set engine.max_model_len=... or engine.min_model_len=...)")
    out.append(f"a GPU with at least {need / util / GiB:.0f} GiB, or more GPUs in tensor parallel")
    room = f.budget_bytes - f.activation_bytes - f.overhead_bytes - 2 * GiB
    smaller = _smaller_models(model, room * tp)
    if smaller:
        out.append("a smaller model that fits: " + ", ".join(smaller))
    if len(host.usable_gpus) > tp:
        out.append(f"--set layout.tensor_parallel_size={tp * 2} (spread the weights over {tp * 2} GPUs)")
    return out


def _smaller_models(model: ModelFacts, room_bytes: int) -> list[str]:
    """Catalog models of the same family whose weights (16-bit, or their 4-bit checkpoint) fit."""
    from ..model import catalog_models

    out = []
    for m in catalog_models():
        if m.model_type != model.model_type or m.params >= model.params:
            continue
        if m.weights_bytes <= room_bytes:
            out.append(f"{m.name} ({m.weights_bytes / GiB:.1f} GiB)")
        elif 4 in m.quantized_variants:
            w4 = m.weights_bytes_at_bits(4)
            if w4 <= room_bytes:
                out.append(f"{m.quantized_variants[4]} ({w4 / GiB:.1f} GiB)")
    return sorted(out, key=lambda s: -float(s.rsplit("(", 1)[1].split()[0]))[:3]


def _cpu_instance(
    host: HostSnapshot,
    settings: Mapping[str, Any],
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    r: Reasons,
    warnings: list[str],
) -> dict[str, Any]:
    key = "instances[0]"
    kv_gib = float(_s(settings, "cpu", "kv_cache_space_gib"))
    kv_space = int(kv_gib * GiB)
    r.add(
        f"{key}.cpu.kv_cache_space_gib",
        kv_gib,
        "CPU backend: the KV cache is a fixed size in RAM (VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes)",
        ("cpu", "kv_cache_space_gib"),
    )
    ram = host.memory_bytes or 0
    need = model.weights_bytes + (draft.weights_bytes if draft else 0) + kv_space + 2 * GiB
    if ram and need > ram:
        raise PlanRefused(
            f"{model.name} on the CPU needs about {need / GiB:.1f} GiB of RAM (weights + KV + 2 GiB), the host has {ram / GiB:.1f}",
            [
                "a smaller model",
                f"a smaller KV space (--set cpu.kv_cache_space_gib={max(0.25, kv_gib / 4):g})",
            ],
        )
    length = int(_s(settings, "engine", "max_model_len"))
    if model.max_position_embeddings and length > model.max_position_embeddings:
        length = int(model.max_position_embeddings)
    per_tok = kv_bytes_per_token(model, 1, model.dtype_bytes) + (
        kv_bytes_per_token(draft, 1, model.dtype_bytes) if draft else 0
    )
    block = CPU_BLOCK_TOKENS
    tokens = kv_tokens_in(kv_space, per_tok, block)
    if tokens - block < length:  # one block is vLLM's null block
        fits_len = longest_context(
            model, draft, 1, model.dtype_bytes, kv_space - per_tok * block, step=block, block=block
        )
        r.add(
            f"{key}.engine.max_model_len",
            fits_len,
            f"{kv_gib:g} GiB of KV space holds {tokens} tokens",
            ("engine", "max_model_len"),
        )
        length = fits_len
    else:
        r.add(
            f"{key}.engine.max_model_len",
            length,
            f"{kv_gib:g} GiB of KV space holds {tokens} tokens",
            ("engine", "max_model_len"),
        )
    seqs = int(_s(settings, "engine", "max_num_seqs"))
    r.add(
        f"{key}.engine.max_num_seqs",
        seqs,
        "CPU backend: few concurrent sequences",
        ("engine", "max_num_seqs"),
    )
    batched = max(seqs, int(_s(settings, "engine", "max_num_batched_tokens")))
    eager = bool(_s(settings, "engine", "enforce_eager"))
    r.add(
        f"{key}.engine.enforce_eager",
        eager,
        "CPU backend: eager starts in ~25 s, compiled mode in 30-75 s"
        if eager
        else "torch.compile on the CPU",
        ("engine", "enforce_eager"),
    )
    numa = host.numa_nodes[0].id if host.numa_nodes and _s(settings, "layout", "numa_bind") else None
    cpus = host.numa_nodes[0].cpus if numa is not None else None
    if len(host.numa_nodes) > 1:
        warnings.append("CPU backend on a multi-node host: bound to NUMA node 0 only")
    engine = {
        "gpu_memory_utilization": None,
        "max_model_len": length,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": batched,
        "kv_cache_dtype": "auto",
        "kv_cache_memory_bytes": kv_space,
        "quantization": model.quant_method,
        "dtype": "bfloat16" if _s(settings, "engine", "dtype") == "auto" else _s(settings, "engine", "dtype"),
        "enforce_eager": eager,
        "enable_prefix_caching": bool(_s(settings, "engine", "enable_prefix_caching")),
        "enable_chunked_prefill": bool(_s(settings, "engine", "enable_chunked_prefill")),
    }
    spec = _speculative(settings, spec_method, draft, 1, r, key)
    return {
        "name": "vllm-cpu",
        "device": "cpu",
        "gpus": [],
        "gpu_name": None,
        "numa_node": numa,
        "cpus": cpus,
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "server": _server(settings, int(_s(settings, "server", "port"))),
        "engine": engine,
        "speculative": spec,
        "memory": {
            "budget_bytes": kv_space + model.weights_bytes,
            "weights_bytes": model.weights_bytes,
            "draft_weights_bytes": draft.weights_bytes if draft else 0,
            "activation_bytes": 0,
            "overhead_bytes": 0,
            "kv_cache_bytes": kv_space,
            "kv_bytes_per_token": per_tok,
            "kv_bytes_per_token_target": kv_bytes_per_token(model, 1, model.dtype_bytes),
            "kv_bytes_per_token_draft": kv_bytes_per_token(draft, 1, model.dtype_bytes) if draft else 0,
            "kv_tokens": tokens,
            "block_size": block,
            "kv_bytes_per_max_len_request": sequence_bytes(model, draft, 1, model.dtype_bytes, length, block),
        },
        "estimate": {"note": "CPU backend: no datasheet bandwidth figure"},
    }
