"""Human-readable views of hwprofile's data (formatting only; no decisions)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .host.snapshot import Gpu, HostSnapshot

if TYPE_CHECKING:
    from typing import Any

    from .plan.types import Plan


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
        out.append(f"GPUs ({len(s.usable_gpus)} usable of {len(s.gpus)})")
        rows = [
            [
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
        ]
        for g in s.gpus:
            if g.lost:
                rows.append([str(g.index), "LOST", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"])
                continue
            rows.append(
                [
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
            )
        out.extend(_table(rows))
        degraded = [g.index for g in s.usable_gpus if g.pcie.degraded]
        if degraded:
            out.append(
                "  warning: PCIe link below its maximum on GPU "
                + ", ".join(map(str, degraded))
                + " (reseat the card, check the slot, or the BIOS link setting)"
            )

    if s.gpu_links:
        idx = [g.index for g in s.usable_gpus]
        out.append("")
        out.append("GPU links (nvidia-smi topo vocabulary; * = P2P supported)")
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


def format_profiles(profiles: dict[str, Any], results: list[Any], winner: Any) -> str:
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


def format_plan(plan: Plan, explain: bool = False) -> str:
    from .plan.types import ABSENT

    m = plan.model
    out = [f"Profile {plan.profile}"]
    out += [f"  {b}" for b in plan.matched_because]
    out.append(
        f"Model {m.name} ({m.source}): {m.params / 1e9:.1f}B params, {human_bytes(m.weights_bytes)} of weights, {m.bits}-bit"
    )
    if explain and m.origin:
        out.append(f"  from {m.origin}")
    if plan.draft:
        d = plan.draft
        out.append(
            f"Draft {d.name} ({d.source}): {d.params / 1e9:.1f}B params, {human_bytes(d.weights_bytes)}"
        )
    for inst in plan.instances:
        e, mem, est = inst.engine.to_json(), inst.memory, inst.estimate
        where = f"GPU {','.join(map(str, inst.gpus))} ({inst.gpu_name})" if inst.gpus else "CPU"
        out.append("")
        out.append(
            f"Instance {inst.name}: {where}, TP {inst.tensor_parallel_size}, PP {inst.pipeline_parallel_size}"
            + (f", DP {inst.ranks}" if inst.ranks > 1 else "")
            + f", NUMA {inst.numa_node if inst.numa_node is not None else '-'}, http://{inst.server.host}:{inst.server.port}"
        )
        for k, v in e.items():
            out.append(f"  {k:24s} {v}")
        spec = inst.speculative
        if spec:
            out.append(
                f"  speculative              {spec.method}"
                + (f" {spec.model}" if spec.model else "")
                + f", k={spec.num_speculative_tokens}"
            )
            if spec.num_speculative_tokens_per_batch_size:
                table = spec.to_json()["num_speculative_tokens_per_batch_size"]  # printed as the JSON lists
                out.append(f"  k by batch size          {table}")
        else:
            out.append("  speculative              off")
        out.append(
            f"  memory per GPU           budget {human_bytes(mem.budget_bytes)} = weights {human_bytes(mem.weights_bytes)}"
            f" + draft {human_bytes(mem.draft_weights_bytes)} + activations {human_bytes(mem.activation_bytes)}"
            f" + overhead {human_bytes(mem.overhead_bytes)} + KV {human_bytes(mem.kv_cache_bytes)}"
        )
        out.append(
            f"  KV cache                 {mem.kv_bytes_per_token} B/token, {mem.kv_tokens} tokens"
        )
        if mem.state_bytes_per_sequence is not ABSENT:
            out.append(
                f"  recurrent state          {human_bytes(mem.state_bytes_per_sequence)} per running sequence, "
                f"{mem.state_sequences} sequences' state fit; attention blocks of {mem.block_size} tokens"
            )
        if est.decode_tok_s_ceiling_batch1 is not ABSENT:
            line = f"  decode ceiling (batch 1) {est.decode_tok_s_ceiling_batch1} tok/s ({est.gpu_datasheet}, {est.memory_bandwidth_gbs} GB/s)"
            if est.decode_tok_s_ceiling_batch1_speculative is not ABSENT:
                line += f"; with speculation {est.decode_tok_s_ceiling_batch1_speculative} tok/s at acceptance {est.assumed_acceptance}"
            out.append(line)
        if inst.nnodes is not ABSENT:
            label = f"node {inst.node} of {inst.nnodes}"
            line = (f"  {label:24s} {inst.node_address}, {'API server' if not inst.headless else 'headless'}, "
                    f"rendezvous {inst.master_addr}:{inst.master_port}")
            out.append(line)
        if est.nodes_parallel is not ABSENT:
            line = (f"  link between nodes       {est.nodes_parallel} parallel: {est.internode_bytes_per_token} B/token at "
                    f"{est.internode_gbps:g} Gb/s, {est.internode_latency_us:g} µs: {est.internode_ms_per_token} ms/token")
            if est.decode_tok_s_ceiling_batch1_group is not ABSENT:
                line += f"; the group's decode ceiling (batch 1) {est.decode_tok_s_ceiling_batch1_group} tok/s"
            out.append(line)
    if plan.endpoint is not None:
        out.append("")
        out.append(f"Clients: {plan.endpoint.url} ({plan.endpoint.how})")
    if plan.warnings:
        out.append("")
        out.append("Warnings")
        out += [f"  - {w}" for w in plan.warnings]
    if explain and plan.prediction:
        out += _predictions(plan)
    if explain:
        out.append("")
        out.append("Reasons")
        for r in plan.reasons:
            out.append(f"  {r.key} = {r.value}")
            out.append(f"      {r.reason}  [{r.source}]")
    return "\n".join(out) + "\n"


def _predictions(plan: Plan) -> list[str]:
    """``plan --explain``: the candidates the performance model compared, and each instance's figures."""
    pr = plan.prediction
    w = pr["workload"]
    cal = pr["calibration"]
    out = ["", f"Predictions at {w['input_len']} in / {w['output_len']} out, {w['concurrency']} requests in flight "
               f"(objective {pr['objective']}: TTFT <= {pr['ttft_target_ms']:g} ms, TPOT <= {pr['tpot_target_ms']:g} ms)"]  # fmt: skip
    out.append(f"  calibration: {cal['path']} (bench {cal['created']})" if cal["path"] else
               f"  calibration: none (hwprofile bench results copied to <config root>/calibration/{cal['fingerprint']}.json "
               "are used instead of the datasheet)")  # fmt: skip
    for g in pr["groups"]:
        out.append(f"  GPUs {','.join(map(str, g['gpus']))} ({g['gpu_name']}): {g['chosen']} by {g['chosen_by']}")
        rows = [["", "layout", "TTFT ms", "TPOT ms", "out tok/s", "capacity tok/s", "at", "source"]]
        for c in g["candidates"]:
            rows.append([
                "=>" if c["chosen"] else ("x" if not c["fits"] else ""), c["layout"], f"{c['ttft_ms']:g}",
                f"{c['tpot_ms']:g}", f"{c['output_tokens_per_s']:g}", f"{c['capacity_output_tokens_per_s']:g}",
                str(c["capacity_concurrency"]), c.get("why_not") or c["source"],
            ])  # fmt: skip
        out += ["  " + line for line in _table(rows)]
        out.append(f"      {g['reason']}")
        if g.get("batching"):
            out.append(f"    {g['chosen']} at other batching (max_num_seqs / max_num_batched_tokens: TTFT ms, TPOT ms, "
                       "out tok/s; * configured, => run):")  # fmt: skip
            cells = [f"{'=>' if b.get('chosen') else ''}{b['max_num_seqs']}/{b['max_num_batched_tokens']}"
                     f"{'*' if b['planned'] else ''}: {b['ttft_ms']:g}, {b['tpot_ms']:g}, {b['output_tokens_per_s']:g}"
                     + ("" if b["fits"] else " (does not fit)") for b in g["batching"]]  # fmt: skip
            out += ["      " + "; ".join(cells[i : i + 3]) for i in range(0, len(cells), 3)]
            if g.get("batching_reason"):
                out.append(f"      batching ({g.get('batching_chosen_by')}): {g['batching_reason']}")
    for inst in plan.instances:
        p = inst.prediction
        if not p:
            continue
        out.append(f"  {inst.name}: TTFT {p.ttft_ms:g} ms, TPOT {p.tpot_ms:g} ms, {p.output_tokens_per_s:g} output tok/s "
                   f"at {p.concurrency} requests ({p.source})")  # fmt: skip
        for t in p.terms:
            out.append(f"      {t['term']}: {t['ms']:g} ms  [{t['source']}]")
    return out
