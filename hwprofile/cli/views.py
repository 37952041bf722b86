"""Human-readable views of hwprofile's data (formatting only; no decisions)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, TypeVar

from ..host.snapshot import Gpu, HostSnapshot

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from ..match.profiles import ProfileFile
    from ..match.rules import RuleResult
    from ..plan.interconnect import Decision, Report
    from ..plan.types import InstancePlan, Plan, SpeculativeConfig

_K = TypeVar("_K", bound=Hashable)  # what _fold groups names by


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _v(x: object, suffix: str = "") -> str:
    return "?" if x is None else f"{x}{suffix}"


def _pcie(g: Gpu) -> str:
    p = g.pcie
    if p.gen is None and p.width is None:
        return "?"
    text = f"Gen{_v(p.gen)} x{_v(p.width)}"
    if p.degraded:
        text += f" (max Gen{_v(p.max_gen)} x{_v(p.max_width)}) BELOW MAX"
    return text


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def format_host(s: HostSnapshot) -> str:
    out: list[str] = []
    cpu = s.cpu
    out.append(f"Host {s.hostname or '?'} (kernel {s.kernel or '?'})")
    out.append(
        f"  CPU: {cpu.model or '?'}, {_v(cpu.sockets)} socket(s), {_v(cpu.logical_cpus)} logical CPUs;"
        f" memory {human_bytes(s.memory_bytes)}"
    )
    d, sw = s.driver, s.software
    out.append(
        f"  NVIDIA driver {d.version or 'none'}, CUDA {d.cuda_version or '-'};"
        f" vLLM {sw.vllm_version or 'not installed'}"
        + (f" ({sw.vllm_distribution})" if sw.vllm_distribution else "")
    )
    out.append(
        f"  numactl {sw.numactl_path or 'not found'};"
        f" tmpfs {sw.tmpfs_path or 'none'}"
        + (f" ({human_bytes(sw.tmpfs_free_bytes)} free)" if sw.tmpfs_free_bytes is not None else "")
        + f"; vllm-router {sw.router_path or 'not installed'}"
    )

    out.append("")
    if not s.gpus:
        out.append("GPUs: none detected")
    else:
        out += _host_gpus(s)
    if s.gpu_links:
        out += _host_links(s)

    out.append("")
    if s.numa_nodes:
        out.append(f"NUMA nodes ({len(s.numa_nodes)})")
        for n in s.numa_nodes:
            on = [str(g.index) for g in s.usable_gpus if g.numa_node == n.id]
            out.append(
                f"  node {n.id}: CPUs {n.cpus}, memory {human_bytes(n.memory_bytes)}"
                + (f", GPUs {','.join(on)}" if on else "")
            )
    else:
        out.append("NUMA nodes: unknown")

    if s.errors:
        out.append("")
        out.append(f"Could not read ({len(s.errors)})")
        for e in s.errors:
            out.append(f"  {e.where}: {e.message}")
    return "\n".join(out) + "\n"


_GPU_COLUMNS = [
    "#",
    "name",
    "memory",
    "CC",
    "NUMA",
    "CPUs",
    "PCIe",
    "NVLink",
    "temp (slow/shut)",
    "power",
    "SM MHz",
    "clock events",
]


def _gpu_row(g: Gpu) -> list[str]:
    """One GPU's row of the host's GPU table (a lost GPU: its index and LOST)."""
    if g.lost:
        return [str(g.index), "LOST", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"]
    return [
        str(g.index),
        g.name or "?",
        human_bytes(g.memory_total_bytes),
        _v(g.compute_capability),
        _v(g.numa_node),
        _v(g.cpu_affinity),
        _pcie(g),
        "none" if g.nvlink_active_links == 0 else f"{_v(g.nvlink_active_links)} links",
        f"{_v(g.temperature_c, ' C')} ({_v(g.temperature_slowdown_c)}/{_v(g.temperature_shutdown_c)})",
        _v(None if g.power_limit_watts is None else f"{g.power_limit_watts:.0f}", " W"),
        f"{_v(g.sm_clock_mhz)}/{_v(g.sm_clock_max_mhz)}",
        ",".join(g.clocks_event_reasons)
        if g.clocks_event_reasons
        else ("-" if g.clocks_event_reasons is not None else "?"),
    ]


def _host_gpus(s: HostSnapshot) -> list[str]:
    """The GPU table, then each usable GPU's faults and the PCIe links below their maximum."""
    out = [f"GPUs ({len(s.usable_gpus)} usable of {len(s.gpus)})"]
    out.extend(_table([list(_GPU_COLUMNS)] + [_gpu_row(g) for g in s.gpus]))
    for g in s.usable_gpus:
        if g.faults:
            out.append(
                f"  FAULT: GPU {g.index}: {'; '.join(g.faults)} (not planned for: reset or replace it)"
            )
    degraded = [g.index for g in s.usable_gpus if g.pcie.degraded]
    if degraded:
        out.append(
            "  warning: PCIe link below its maximum on GPU "
            + ", ".join(map(str, degraded))
            + " (reseat the card, check the slot, or the BIOS link setting)"
        )
    return out


def _host_links(s: HostSnapshot) -> list[str]:
    """The matrix of links between the usable GPUs, in nvidia-smi topo's words."""
    idx = [g.index for g in s.usable_gpus]
    out = ["", "GPU links (nvidia-smi topo vocabulary; * = P2P supported)"]
    rows = [[""] + [f"GPU{i}" for i in idx]]
    for a in idx:
        row = [f"GPU{a}"]
        for b in idx:
            if a == b:
                row.append("X")
                continue
            lk = s.link(a, b)
            row.append("?" if lk is None or lk.link is None else lk.link + ("*" if lk.p2p else ""))
        rows.append(row)
    out.extend(_table(rows))
    return out


def format_profiles(
    profiles: Mapping[str, ProfileFile], results: Sequence[RuleResult], winner: RuleResult | None
) -> str:
    out = ["Rules (first match wins)"]
    for res in results:
        mark = "=>" if res is winner else ("ok" if res.matched else "--")
        out.append(f"  {mark} {res.rule.profile:16s} {res.rule.why}")
        for c in res.checks:
            out.append(f"       {'+' if c.ok else 'x'} {c.predicate}: {c.detail}")
    out.append("")
    out.append("Profiles")
    for p in sorted(profiles.values(), key=lambda p: p.name):
        chosen = " (chosen)" if winner is not None and p.name == winner.rule.profile else ""
        parent = f" extends {p.parent}" if p.parent else ""
        out.append(f"  {p.name}{chosen}{parent} [{p.kind} {p.path}]")
        if p.description:
            out.append(f"      {p.description}")
    out.append("")
    out.append(f"Chosen: {winner.rule.profile if winner else 'none'}")
    return "\n".join(out) + "\n"


# -- plan ---------------------------------------------------------------------------------------------
#
# What a person asks first comes first: what runs, where, does it fit, how fast, what to watch. The
# details (every reason, the performance model's terms, the batching grid) on request: ``--explain``
# adds the prediction and the reasons for the values one asks about, ``--explain=all`` every reason.
# Identical instances are folded into one block, paths are shown relative to a legend of roots, and no
# Python value (None, True, tuples) reaches the page.

EXPLAIN_LEVELS = ("short", "all")
# the reasons --explain (short) shows: the values a person asks about (an instance's key without its
# ``instances[N].`` prefix, or a top-level key); every value a user set is shown too
_HEADLINE = frozenset(
    {
        "model.name",
        "speculative.method",
        "tensor_parallel_size",
        "engine.max_model_len",
        "engine.max_num_seqs",
        "engine.gpu_memory_utilization",
        "engine.kv_cache_dtype",
        "engine.quantization",
        "cpu.kv_cache_space_gib",
        "speculative.num_speculative_tokens",
    }
)
_USER_KINDS = ("etc-profile", "overrides.d", "overrides", "env", "cli")
_SOURCE_WORDS = {
    "default": "hwprofile's own default for the setting (no profile, file or --set names it)",
    "planner": "computed by the planner from the host and the model",
}


class _Roots:
    """Absolute paths shown relative to a short label, and the legend of the labels used."""

    def __init__(self, roots: Sequence[tuple[str, str, str]]) -> None:
        # the longest path first: a root inside another is named by its own label
        self.roots = sorted(
            ((lbl, path.rstrip("/") + "/", what) for lbl, path, what in roots if path),
            key=lambda r: -len(r[1]),
        )
        self.used: dict[str, str] = {}

    def short(self, text: str) -> str:
        for label, path, what in self.roots:
            if path in text:
                text = text.replace(path, label)
                self.used[label] = f"{path.rstrip('/')} ({what})"
        return text

    def source(self, src: str) -> str:
        """A reason's source: the file (relative), the --set, the variable; ``default``, ``planner``."""
        if src == "default schema":
            self.used["default"] = _SOURCE_WORDS["default"]
            return "default"
        if src == "planner":
            self.used["planner"] = _SOURCE_WORDS["planner"]
            return "planner"
        kind, _, rest = src.partition(" ")
        if kind == "builtin" or (kind in _USER_KINDS and rest):
            return self.short(rest)
        return self.short(src)


def _human(value: object) -> str:
    """A planned value as a person reads it: no None, True or tuple reprs."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ", ".join(_human(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_human(v)}" for k, v in value.items())
    return str(value)


def _words(text: str) -> str:
    """A rule check's ``want nvlink=False`` / ``P2P True`` (the JSON keeps them) as rules.yaml writes them."""
    import re

    return (
        re.sub(r"(?<=[=\s])(True|False)\b", lambda m: m.group(1).lower(), text)
        .replace("=false", ": false")
        .replace("=true", ": true")
    )


def _k_table(table: Sequence[Sequence[int | None]]) -> str:
    """``[[1, 8, 5], [9, 64, 3], [65, None, 1]]`` → ``5 at 1-8 running sequences, 3 at 9-64, 1 at 65 and more``."""
    parts = [f"{k} at {lo}-{hi}" if hi is not None else f"{k} at {lo} and more" for lo, hi, k in table]
    if parts:
        parts[0] += " running sequences"
    return ", ".join(parts)


def _billions(params: int | None) -> str:
    return "unknown" if params is None else f"{params / 1e9:.1f}B"


def _names(names: Sequence[str], every: int) -> str:
    return "every instance" if len(names) == every > 1 else ", ".join(names)


def _instance_body(inst: InstancePlan) -> list[str]:
    """Everything of one instance but where it is (its name, GPUs, NUMA node, URL): identical bodies fold."""
    from ..plan.types import ABSENT

    mem, est = inst.memory, inst.estimate
    gpu = bool(inst.gpus)
    out = [
        f"  {'runs on':24s} "
        + (f"{inst.gpu_name}, tensor parallel {inst.tensor_parallel_size}" if gpu else "CPU")
        + (f", pipeline parallel {inst.pipeline_parallel_size}" if inst.pipeline_parallel_size > 1 else "")
        + (f", data parallel {inst.ranks}" if inst.ranks > 1 else "")
    ]
    out += _engine_lines(inst.engine.to_json(), gpu)
    out.append(f"  {'speculative':24s} {_speculative_line(inst.speculative)}")
    terms = [
        ("weights", mem.weights_bytes),
        ("draft", mem.draft_weights_bytes),
        ("activations", mem.activation_bytes),
        ("overhead", mem.overhead_bytes),
        ("KV", mem.kv_cache_bytes),
    ]
    parts = " + ".join(f"{n} {human_bytes(b)}" for n, b in terms if b)
    label = "memory per GPU" if gpu else "memory (RAM)"
    out.append(f"  {label:24s} {human_bytes(mem.budget_bytes)} = {parts}")
    out.append(f"  {'KV cache':24s} {mem.kv_tokens} tokens, {mem.kv_bytes_per_token} B per token")
    if mem.state_bytes_per_sequence is not ABSENT:
        out.append(
            f"  {'recurrent state':24s} {human_bytes(mem.state_bytes_per_sequence)} per running sequence, "
            f"{mem.state_sequences} sequences' state fit; attention blocks of {mem.block_size} tokens"
        )
    if est.decode_tok_s_ceiling_batch1 is not ABSENT:
        line = (
            f"{est.decode_tok_s_ceiling_batch1} tok/s ({est.gpu_datasheet}, {est.memory_bandwidth_gbs} GB/s)"
        )
        if est.decode_tok_s_ceiling_batch1_speculative is not ABSENT:
            src = est.acceptance_source
            measured = " (measured by this host's bench)" if str(src).startswith("measured") else ""
            line += (
                f"; {est.decode_tok_s_ceiling_batch1_speculative} tok/s with speculation at acceptance "
                f"{est.assumed_acceptance}{measured}"
            )
        out.append(f"  {'decode, 1 request':24s} at most {line}")
    if est.nodes_parallel is not ABSENT:
        line = (
            f"  {'link between nodes':24s} {est.nodes_parallel} parallel: {est.internode_bytes_per_token} B/token "
            f"at {est.internode_gbps:g} Gb/s, {est.internode_latency_us:g} µs: {est.internode_ms_per_token} ms/token"
        )
        if est.decode_tok_s_ceiling_batch1_group is not ABSENT:
            line += f"; the group's decode ceiling (batch 1) {est.decode_tok_s_ceiling_batch1_group} tok/s"
        out.append(line)
    return out


def _engine_lines(engine: dict[str, Any], gpu: bool) -> list[str]:
    """One line per engine value, sizes in bytes also in words; unset ones say vLLM decides."""
    out = []
    for k, v in engine.items():
        if k == "gpu_memory_utilization" and not gpu:
            continue  # a CPU server has no GPU memory to share out
        if v is None:
            shown = "not set (vLLM decides)"
        elif k.endswith("_bytes") and isinstance(v, int):
            shown = f"{human_bytes(v)} ({v})"
        else:
            shown = _human(v)
        out.append(f"  {k:24s} {shown}")
    return out


def _speculative_line(spec: SpeculativeConfig | None) -> str:
    """The speculative method, its draft and k (and k by batch size), or off."""
    if not spec:
        return "off"
    line = f"{spec.method}" + (f" {spec.model}" if spec.model else "") + f", k={spec.num_speculative_tokens}"
    if spec.num_speculative_tokens_per_batch_size:
        line += f" (k by batch: {_k_table(spec.to_json()['num_speculative_tokens_per_batch_size'])})"
    return line


def _instance_where(inst: InstancePlan) -> str:
    from ..plan.types import ABSENT

    where = f"GPU {','.join(map(str, inst.gpus))}" if inst.gpus else "CPU"
    text = f"{inst.name}: {where}" + (f", NUMA node {inst.numa_node}" if inst.numa_node is not None else "")
    text += f", http://{inst.server.host}:{inst.server.port}"
    if inst.nnodes is not ABSENT:
        text += (
            f", node {inst.node} of {inst.nnodes} ({inst.node_address}, "
            f"{'API server' if not inst.headless else 'headless'}, rendezvous {inst.master_addr}:{inst.master_port})"
        )
    return text


def _fold(items: Sequence[tuple[str, _K]]) -> list[tuple[list[str], _K]]:
    """``(name, key)`` pairs → ``(names, key)`` in first-seen order, equal keys together."""
    groups: dict[_K, list[str]] = {}
    for name, key in items:
        groups.setdefault(key, []).append(name)
    return [(names, key) for key, names in groups.items()]


def format_plan(
    plan: Plan, explain: str | bool | None = None, roots: Sequence[tuple[str, str, str]] = ()
) -> str:
    """The plan for a person. ``explain``: None (what runs), ``"short"`` (and how fast, and why the values
    one asks about), ``"all"`` (every reason, the performance model's terms); ``roots``: (label, path,
    what it is) shown as the label where a path starts with it, with a legend."""
    level = "short" if explain is True else (explain or None)
    r = _Roots(roots)
    m = plan.model
    out = _summary(plan)
    out += ["", f"Profile {plan.profile}"]
    out += [f"  {_words(r.short(b))}" for b in (plan.matched_because if level else plan.matched_because[:1])]
    out.append(
        f"Model {m.name} ({m.source}): {_billions(m.params)} params, {human_bytes(m.weights_bytes)} of weights, {m.bits}-bit"
    )
    if level and m.origin:
        out.append(f"  from {r.short(m.origin)}")
    if plan.draft:
        d = plan.draft
        out.append(
            f"Draft {d.name} ({d.source}): {_billions(d.params)} params, {human_bytes(d.weights_bytes)}"
        )
    for names, body in _fold([(inst.name, tuple(_instance_body(inst))) for inst in plan.instances]):
        insts = [i for i in plan.instances if i.name in names]
        out.append("")
        if len(insts) == 1:
            out.append(f"Instance {_instance_where(insts[0])}")
        else:
            out.append(f"{len(insts)} instances like this, each as below:")
            out += [f"  {_instance_where(i)}" for i in insts]
        out += list(body)
    if plan.endpoint is not None:
        out.append("")
        out.append(f"Clients: {plan.endpoint.url} ({plan.endpoint.how})")
    every = len(plan.instances)
    if plan.warnings:
        out.append("")
        out.append("Warnings")
        for who, text in _warnings(plan):
            named = [n for n in who if n]
            out.append(f"  - {r.short(text)}" + (f" ({_names(named, every)})" if named and every > 1 else ""))
    if (
        level
        and plan.prediction
        and (plan.prediction.get("groups") or any(i.prediction for i in plan.instances))
    ):
        out += _predictions(plan, level, r)
    if level:
        out += _reasons(plan, level, r)
        if level == "short" and "more, and the prediction's terms" not in out[-1]:
            out.append("  (the prediction's terms: --explain=all)")
    if r.used:
        out.append("")
        out.append("Where the sources are")
        out += [f"  {label:14s} {what}" for label, what in r.used.items()]
    return "\n".join(out) + "\n"


def _warnings(plan: Plan) -> list[tuple[list[str], str]]:
    """The warnings, one per text: ``vllm-gpu0: TEXT`` of several instances folded (names, TEXT)."""
    names = [i.name for i in plan.instances]
    split = []
    for w in plan.warnings:
        name = next((n for n in names if w.startswith(f"{n}: ")), None)
        split.append((name or "", w[len(name) + 2 :] if name else w))
    return _fold(split)


def _where(insts: Sequence[InstancePlan]) -> str:
    """The headline's "where": how many servers, on which GPUs (or the CPU), and each one's GPUs."""
    gpus = sorted({g for i in insts for g in i.gpus})
    names = sorted({i.gpu_name or "unnamed GPU" for i in insts if i.gpus})
    n = len(insts)
    servers = f"{n} vLLM server{'s' if n > 1 else ''}"
    if gpus:
        # a server's GPUs: its tensor x pipeline group, once per data-parallel rank behind its API server
        tps = sorted({i.tensor_parallel_size * i.pipeline_parallel_size * i.ranks for i in insts})
        dp = sorted({(i.ranks, i.tensor_parallel_size) for i in insts if i.ranks > 1})
        layout = ", ".join(f"data parallel {r} x tensor parallel {t}" for r, t in dp)
        where = (
            f"{servers} on GPU {','.join(map(str, gpus))} ({', '.join(names)}), "
            f"{' or '.join(map(str, tps))} GPU{'s' if tps != [1] else ''}{' each' if n > 1 else ''}"
            + (f" ({layout})" if layout else "")
        )
    else:
        where = f"{servers} on the CPU"
    return where


def _summary(plan: Plan) -> list[str]:
    """What a person asks first: what runs, where, does it fit, how fast, what to watch."""
    from ..plan.types import ABSENT

    m, insts = plan.model, plan.instances
    what = f"{m.name} ({m.bits}-bit)" + (f" with draft {plan.draft.name}" if plan.draft else "")
    n, where = len(insts), _where(insts)
    out = [f"Runs     {what}: {where}"]
    if plan.endpoint is not None:
        out.append(
            f"URL      {plan.endpoint.url}"
            + (
                " (nginx in front of the servers)"
                if n > 1 and plan.endpoint.url != f"http://{insts[0].server.host}:{insts[0].server.port}"
                else ""
            )
        )
    i0 = insts[0]
    mem = i0.memory
    per = "per GPU" if i0.gpus else "RAM"
    draft = f" (draft {human_bytes(mem.draft_weights_bytes)} included)" if mem.draft_weights_bytes else ""
    out.append(
        f"Fits     {per} {human_bytes(mem.budget_bytes)} planned: weights "
        f"{human_bytes(mem.weights_bytes + (mem.draft_weights_bytes or 0))}{draft}, KV cache {human_bytes(mem.kv_cache_bytes)} ({mem.kv_tokens} tokens"
        f"{' per server' if n > 1 else ''})"
    )
    pr = plan.prediction
    preds = [i.prediction for i in insts if i.prediction is not ABSENT]
    if pr and preds:
        p = preds[0]
        ttft_t, tpot_t = pr["ttft_target_ms"], pr["tpot_target_ms"]
        met = p.ttft_ms <= ttft_t and p.tpot_ms <= tpot_t
        out.append(
            f"Speed    TTFT {p.ttft_ms:.0f} ms, TPOT {p.tpot_ms:.1f} ms, {p.output_tokens_per_s:.0f} output tok/s"
            f"{' per server' if n > 1 else ''} at {p.concurrency} requests, predicted ({p.source}); "
            f"{'within' if met else 'NOT within'} the targets TTFT <= {ttft_t:g} ms, TPOT <= {tpot_t:g} ms"
        )
    else:
        out.append(
            f"Speed    not predicted for {'these GPUs (no datasheet figures)' if any(i.gpus for i in insts) else 'a CPU server'}: "
            "`hwprofile bench` measures it"
        )
    if plan.warnings:
        k = len(_warnings(plan))
        out.append(f"Watch    {k} warning{'s' if k > 1 else ''}, below")
    return out


def _reasons(plan: Plan, level: str, r: _Roots) -> list[str]:
    import re

    names = [i.name for i in plan.instances]
    items: list[tuple[str, tuple[str, str, str, str]]] = []
    for x in plan.reasons:
        mt = re.match(r"instances\[(\d+)\]\.(.*)", x.key)
        key, who = (
            (mt.group(2), names[int(mt.group(1))]) if mt and int(mt.group(1)) < len(names) else (x.key, "")
        )
        value = _k_table(x.value) if key.endswith("per_batch_size") and x.value else _human(x.value)
        items.append((who, (key, value, x.reason, x.source)))
    folded = _fold(items)
    shown = [
        (who, k)
        for who, k in folded
        if level == "all"
        or k[0] in _HEADLINE
        or k[0].startswith("layout.")
        or k[3].split(" ")[0] in _USER_KINDS
    ]
    out = ["", "Reasons" if level == "all" else "Why (the values one asks about first)"]
    for whose, (key, value, reason, source) in shown:
        named = [n for n in whose if n]
        out.append(
            f"  {key} = {value}"
            + (f"  ({_names(named, len(names))})" if named and len(names) > 1 else "")
            + f"  [{r.source(source)}]"
        )
        out.append(f"      {r.short(reason)}")
    if len(shown) < len(folded):
        out.append(f"  ... {len(folded) - len(shown)} more, and the prediction's terms: --explain=all")
    return out


def _predictions(plan: Plan, level: str, r: _Roots) -> list[str]:
    """The candidates the performance model compared, and each instance's figures (``all``: the terms
    and the batching grid)."""
    from ..plan.types import ABSENT

    pr = plan.prediction
    if pr is ABSENT:
        return []
    w = pr["workload"]
    cal = pr["calibration"]
    ttft_t, tpot_t = pr["ttft_target_ms"], pr["tpot_target_ms"]
    out = [
        "",
        f"Predictions at {w['input_len']} in / {w['output_len']} out, {w['concurrency']} requests in flight "
        f"(objective {pr['objective']}: TTFT <= {ttft_t:g} ms, TPOT <= {tpot_t:g} ms)",
    ]
    if cal["path"]:
        out.append(f"  calibration: {r.short(cal['path'])} (bench {cal['created']})")
    else:
        where = r.short(next((p for lbl, p, _ in r.roots if lbl == "<config root>/"), "<config root>/"))
        out.append(
            f"  calibration: none: the GPU datasheet's figures (hwprofile bench results copied to "
            f"{where}calibration/{cal['fingerprint']}.json would be used instead)"
        )
    for g in pr["groups"]:
        out += _prediction_group(g, level, w["concurrency"])
    out += _instance_predictions(plan, level, r, ttft_t, tpot_t)
    return out


def _prediction_group(g: Mapping[str, Any], level: str, concurrency: int) -> list[str]:
    """One GPU group's candidate layouts as a table, why one was chosen, and (``all``) the
    predictions at other batching."""
    out = [f"  GPUs {','.join(map(str, g['gpus']))} ({g['gpu_name']}): {g['chosen']} by {g['chosen_by']}"]
    rows = [["", "layout", "TTFT ms", "TPOT ms", "out tok/s", "capacity tok/s", "at", "source"]]
    for c in g["candidates"]:
        rows.append(
            [
                "=>" if c["chosen"] else ("x" if not c["fits"] else ""),
                c["layout"],
                f"{c['ttft_ms']:g}",
                f"{c['tpot_ms']:g}",
                f"{c['output_tokens_per_s']:g}",
                f"{c['capacity_output_tokens_per_s']:g}",
                str(c["capacity_concurrency"]),
                c.get("why_not") or c["source"],
            ]
        )
    out += ["  " + line for line in _table(rows)]
    if g.get("batching_chosen_by") == "prediction":
        out.append(
            "      (the layouts at the configured batching; the batching that runs, and its figures: below)"
        )
    out.append(f"      {g['reason']}")
    if g.get("batching") and level == "all":
        out.append(
            f"    {g['chosen']} at other batching (max_num_seqs / max_num_batched_tokens: TTFT ms, "
            "TPOT ms, out tok/s; * configured, => run; equal predictions together):"
        )
        cells = [
            (
                f"{'=>' if b.get('chosen') else ''}{b['max_num_seqs']}/{b['max_num_batched_tokens']}"
                f"{'*' if b['planned'] else ''}",
                f"{b['ttft_ms']:g}, {b['tpot_ms']:g}, {b['output_tokens_per_s']:g}"
                + ("" if b["fits"] else " (does not fit)"),
            )
            for b in g["batching"]
        ]
        for settings, figures in _fold(cells):
            out.append(f"      {' '.join(settings)}: {figures}")
        if len(cells) > 1 and len(_fold(cells)) == 1:
            out.append(f"      (no batching changes the prediction at {concurrency} requests in flight)")
    if g.get("batching_reason"):
        out.append(f"      batching ({g.get('batching_chosen_by')}): {g['batching_reason']}")
    return out


def _instance_predictions(plan: Plan, level: str, r: _Roots, ttft_t: float, tpot_t: float) -> list[str]:
    """Each instance's predicted figures against the targets (``all``: the terms), equal ones folded."""
    from ..plan.types import ABSENT

    out: list[str] = []
    every = len(plan.instances)
    lines = []
    for inst in plan.instances:
        p = inst.prediction
        if p is ABSENT:
            continue
        over = [f"TTFT over the {ttft_t:g} ms target"] if p.ttft_ms > ttft_t else []
        over += [f"TPOT over the {tpot_t:g} ms target"] if p.tpot_ms > tpot_t else []
        head = (
            f"TTFT {p.ttft_ms:g} ms, TPOT {p.tpot_ms:g} ms, {p.output_tokens_per_s:g} output tok/s "
            f"at {p.concurrency} requests ({p.source})" + (f": {', '.join(over)}" if over else "")
        )
        terms = tuple(
            f"      {t['term']}: {t['ms']:g} ms{_band(t)}  [{r.short(t['source'])}]" for t in p.terms
        )
        detail = (terms if level == "all" else ()) + tuple(_simulated_lines(p.simulated))
        lines.append((inst.name, (head, detail)))
    for names, (head, terms) in _fold(lines):
        out.append(f"  {'each instance' if len(names) == every > 1 else ', '.join(names)}: {head}")
        out += list(terms)
    return out


def _band(term: Mapping[str, Any]) -> str:
    """A term's basis and error band, where it carries them (``(datasheet, 1.1-1.9 ms)``)."""
    band = term.get("band_ms")
    if not band and not term.get("basis"):
        return ""
    parts = [term["basis"]] if term.get("basis") else []
    if band:
        parts.append(f"{band[0]:g}-{band[1]:g} ms")
    return f" ({', '.join(parts)})"


def _simulated_lines(sim: Mapping[str, Any] | None) -> list[str]:
    """plan/simulate.py's figures under an instance's prediction: each with its error band and source."""
    if not sim:
        return []
    if "not_simulated" in sim:
        return [f"      simulated: not run ({sim['not_simulated']})"]
    head = f"preemptions {sim['preemptions']}, peak running {sim['peak_running']}"
    if sim.get("api_busy_fraction") is not None:  # plan/servercost.py's CPU outside the GPU
        head += (
            f", engine busy {sim['engine_busy_fraction']:.0%}, API server busy {sim['api_busy_fraction']:.0%}"
        )
        if sim.get("frontend_busy_fraction") is not None:
            head += f", the CPU it shares with EngineCore busy {sim['frontend_busy_fraction']:.0%}"
    out = [f"      simulated ({sim['regime']}): {head}"] + [
        f"        note: {n}" for n in sim.get("notes") or ()
    ]
    units = {"ttft_ms": "ms TTFT", "tpot_ms": "ms TPOT", "output_tokens_per_s": "output tok/s"}
    for key, unit in units.items():
        f = sim[key]
        b = f.get("band")
        band = (
            f"band x{b['ratio_lo']:g}-x{b['ratio_hi']:g} of measured ({b['points']} points)"
            if b
            else f"band unknown: {f.get('band_unknown')}"
        )
        out.append(f"        {f['value']:g} {unit}; {band}  [{f['source']}]")
    return out


def format_interconnect(
    host: HostSnapshot, report: Report, decisions: Sequence[Decision], saved: str | None
) -> str:
    """``hwprofile doctor --interconnect``: what the host says, what the all-reduce check measured,
    what plans take from it (``report`` a :class:`~.plan.interconnect.Report`, ``decisions`` its
    :class:`~.plan.interconnect.Decision` per group)."""
    ic = host.interconnect
    out = [
        "Interconnect",
        f"  IOMMU: {ic.iommu or 'unknown'}" + (f" ({ic.iommu_evidence})" if ic.iommu_evidence else ""),
    ]
    if ic.acs_ports:
        for p in ic.acs_ports:
            state = p.unknown or (
                "no ACS"
                if p.acs_ctrl == 0
                else f"ACS ctrl 0x{p.acs_ctrl:04x}" + (" REDIRECT" if p.redirect else "")
            )
            out.append(f"  port {p.bdf} (GPUs {','.join(map(str, p.gpu_indexes))}): {state}")
    else:
        out.append(f"  ACS: {ic.acs_unknown or 'no PCIe port between the GPUs'}")
    for c in ic.vllm_p2p:  # vLLM's own P2P test, as its custom all-reduce cached it
        gpus = ",".join(map(str, c.gpu_indexes)) if c.gpu_indexes else "?"
        said = c.unknown or (f"no P2P for {', '.join(c.denied)}" if c.denied else "P2P between every pair")
        out.append(f"  vLLM P2P cache {c.file} (GPUs {gpus}): {said}")
    if not ic.vllm_p2p:
        out.append(f"  vLLM P2P cache: {ic.vllm_p2p_unknown or 'none'}")
    for lk in host.gpu_links:
        caps = " ".join(
            f"{k}={_v(v)}"
            for k, v in (("read", lk.p2p), ("write", lk.p2p_write), ("atomics", lk.p2p_atomics))
        )
        out.append(f"  NVML P2P {lk.a}-{lk.b} ({lk.link or '?'}): {caps}")
    out.append("")
    out.append(
        f"All-reduce check ({report.backend}, torch {report.torch_version or '?'}, {report.measured_at or '?'})"
    )
    header = f"  {'group':<10} {'P2P':<4} {'outcome':<8} {'small':>12} {'large':>14}  detail"
    out.append(header)
    for r in report.runs:
        small = f"{r.sizes[0].seconds * 1e6:.0f} us" if r.sizes else "-"
        large = f"{r.sizes[-1].bus_gbs:.2f} GB/s" if len(r.sizes) > 1 else "-"
        group = ",".join(map(str, r.group))
        out.append(
            f"  {group:<10} {'on' if r.p2p else 'off':<4} {r.outcome:<8} {small:>12} {large:>14}  {r.detail}"
        )
    out.append("")
    for d in decisions:
        verdict = {True: "proven", False: "NOT SAFE", None: "not checked"}[d.proven]
        out.append(f"  group {','.join(map(str, d.group))}: {verdict}")
        out.extend(f"    - {why}" for why in d.reasons)
    if saved:
        out.append(f"\nrecorded in {saved}; plans on this host read it")
    return "\n".join(out) + "\n"
