"""The text report of a benchmark. Its first line says what the hardware did: ``THROTTLED`` with
the GPU, its reasons and seconds when any GPU throttled during any point; ``CPU host: no GPU
clock/throttle tags`` where there is no GPU to sample; an incomplete sampling says so; else the
temperature and clock ranges seen. Then the workload, the host, one table per plan, the comparison
and the verdict against the p99 TTFT target."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .accuracy import lines as accuracy_lines
from .result import BenchPlan, primary_spread
from .workloads import Workload

TEXT_METRICS = ("output_throughput", "p99_ttft_ms", "p99_tpot_ms")  # the comparison's lines in the text


def _hardware(plans: Sequence[BenchPlan]) -> list[tuple[str, int, int, dict[str, Any]]]:
    """(plan label, round, concurrency, hardware tags) of every point."""
    out = []
    for p in plans:
        for r in p.runs:
            for pt, hw in zip(r["points"], r["hardware"], strict=True):
                out.append((p.label, r["round"], pt.concurrency, hw))
    return out


def headline(plans: Sequence[BenchPlan]) -> tuple[str, bool]:
    """The report's first line and whether any GPU throttled."""
    tags = _hardware(plans)
    if not tags:
        return "no benchmark point ran: no hardware tags", False
    throttled: dict[int, dict[str, Any]] = {}
    for label, rnd, conc, hw in tags:
        for g in hw["gpus"]:
            if g["throttled"]:
                t = throttled.setdefault(
                    g["index"], {"name": g["name"], "reasons": set(), "s": 0.0, "where": []}
                )
                t["reasons"] |= set(g["throttle_reasons_seen"])
                t["s"] += g["throttled_s"]
                t["where"].append(f"{label} round {rnd} concurrency {conc}")
    if throttled:
        parts = [
            f"GPU {i} ({t['name'] or '?'}) {'+'.join(sorted(t['reasons']))} for {t['s']:.1f} s "
            f"({'; '.join(t['where'][:3])}{' …' if len(t['where']) > 3 else ''})"
            for i, t in sorted(throttled.items())
        ]
        return "THROTTLED: " + ", ".join(parts) + ": these results are below the card's full speed", True
    if all(hw["status"] == "no_gpu" for *_, hw in tags):
        return "CPU host: no GPU clock/throttle tags (no NVIDIA GPU here, nothing to sample)", False
    errors = sorted({hw["error"] for *_, hw in tags if hw["status"] == "error" and hw["error"]})
    ranges: dict[int, dict[str, Any]] = {}
    for *_, hw in tags:
        for g in hw["gpus"]:
            r = ranges.setdefault(g["index"], {"name": g["name"], "t": [], "c": [], "max": None})
            r["t"] += [v for v in g["temperature_c"].values() if v is not None]
            r["c"] += [v for k, v in g["sm_clock_mhz"].items() if k != "card_max" and v is not None]
            r["max"] = g["sm_clock_mhz"]["card_max"] or r["max"]
    seen = "; ".join(
        f"GPU {i} {r['name'] or ''} "
        + (f"{min(r['t']):.0f}-{max(r['t']):.0f} °C" if r["t"] else "temperature unread")
        + (
            f", SM clock {min(r['c'])}-{max(r['c'])} of {r['max'] or '?'} MHz"
            if r["c"]
            else ", SM clock unread"
        )
        for i, r in sorted(ranges.items())
    )
    if errors:
        return f"GPU tags incomplete ({'; '.join(errors)}); no throttling in what was read: {seen}", False
    return f"no throttling seen: {seen}", False


def per_watt_median(p: BenchPlan, concurrency: int) -> float | None:
    """The median over rounds of a concurrency's output tokens/s per watt (None: power unread)."""
    import statistics

    vals = [
        hw.get("output_tokens_per_s_per_watt")
        for r in p.runs
        for pt, hw in zip(r["points"], r["hardware"], strict=True)
        if pt.concurrency == concurrency
    ]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def _ms(v: float | None) -> str:
    return f"{v:.1f}" if v is not None else "-"


def _eff(v: float | None) -> str:
    return f"{v:.3f}" if v is not None else "-"


def plan_table(p: BenchPlan, rows: list[dict[str, Any]]) -> list[str]:
    d = p.describe()
    spec = d["speculative"]
    what = [
        f"profile {d['profile']}" if d["profile"] else None,
        f"max_num_seqs {d['max_num_seqs']}" if d["max_num_seqs"] is not None else None,
        (
            f"speculation {spec['method']} k={spec['num_speculative_tokens']}"
            if spec
            else ("no speculation" if p.plan is not None else None)
        ),
        p.source if p.kind in ("url", "overrides") else None,
    ]
    lines = [f"plan {p.label}: " + ", ".join(w for w in what if w)]
    lines.append(
        f"  {'conc':>5} {'out tok/s':>10} {'req/s':>7} {'TTFT p50/p99 ms':>17} {'TPOT p50/p99 ms':>17} "
        f"{'ITL p50/p99 ms':>16} {'accept':>7} {'len':>5} {'rounds':>6} {'tok/s/W':>8}"
    )
    for row in rows:
        m = row["metrics"]

        med = {k: v["median"] for k, v in m.items()}
        acc, ln = row["acceptance_rate"], row["mean_acceptance_length"]
        thr = m.get("output_throughput")
        spread = f" ±{thr['relative_spread'] / 2:.0%}" if thr and row["rounds"] > 1 else ""
        lines.append(
            f"  {row['concurrency']:>5} {_ms(med.get('output_throughput')):>10}{spread} {med.get('request_throughput') or 0:>7.2f} "
            f"{_ms(med.get('p50_ttft_ms')) + '/' + _ms(med.get('p99_ttft_ms')):>17} "
            f"{_ms(med.get('p50_tpot_ms')) + '/' + _ms(med.get('p99_tpot_ms')):>17} "
            f"{_ms(med.get('p50_itl_ms')) + '/' + _ms(med.get('p99_itl_ms')):>16} "
            f"{(format(acc['median'], '.0%') if acc else '-'):>7} {(format(ln['median'], '.2f') if ln else '-'):>5} "
            f"{row['rounds']:>6} {_eff(per_watt_median(p, row['concurrency'])):>8}"
        )
        if row.get("merged_rounds"):
            lines.append(
                f"        {row['merged_rounds']} of {row['rounds']} rounds streamed their tokens merged (the API "
                "server's stream fell behind the engine): their TTFT, TPOT and ITL left out of the medians"
            )
    return lines


def verdict(
    plans: Sequence[BenchPlan],
    wl: Workload,
    knees: dict[str, dict[str, Any] | None],
    cmp: dict[str, Any] | None,
) -> list[str]:
    """One line per judgement: each plan against the p99 TTFT target at the primary concurrency,
    each sweep's knee, the comparison's headline ratio."""
    out = []
    for p in plans:
        s = primary_spread(p, wl, "p99_ttft_ms")
        if s is None:
            out.append(f"{p.label}: no p99 TTFT at concurrency {wl.primary}")
            continue
        ok = s.median <= wl.ttft_p99_target_ms
        cpu = (
            p.plan is not None and bool(p.plan.instances) and all(i.device == "cpu" for i in p.plan.instances)
        )
        judged = (
            "(a CPU server: the GPU serving target does not apply)"
            if cpu
            else f"{'meets' if ok else 'BREAKS'} the {wl.ttft_p99_target_ms:g} ms target"
        )
        out.append(
            f"{p.label}: p99 TTFT {s.median:.1f} ms at concurrency {wl.primary} {judged}"
            + (f" (rounds {s.min:.1f}-{s.max:.1f} ms)" if len(s.values) > 1 else "")
        )
        k = knees.get(p.label)
        if k:
            out.append(f"{p.label}: {k['verdict']}")
        out.append(gate_line(p))
    if cmp:
        for row in cmp["per_concurrency"]:
            if row["concurrency"] != cmp["primary_concurrency"]:
                continue
            for m, sentence in zip(row["metrics"], row["sentences"], strict=True):
                if m["metric"] in ("output_throughput", "p99_ttft_ms"):
                    out.append(f"at concurrency {row['concurrency']}: {sentence}")
    return out


def gate_line(p: BenchPlan) -> str:
    """The accuracy gate's verdict of one plan, with its next step."""
    from .accuracy import accuracy
    from .result import summary

    acc = accuracy(p.predictions, summary(p), p.predictions_why)
    m = acc["mape"]["overall"]
    return (
        f"{p.label}: accuracy gate {acc['state'].upper()}"
        + (f" (MAPE {m:.1%} over all figures)" if m is not None else "")
        + (f"; next: {acc['next_step']}" if acc["next_step"] else "")
    )


def text(doc: dict[str, Any], plans: Sequence[BenchPlan]) -> str:
    wl = doc["workload"]
    host = doc["host"]
    cpu = host["cpu"]

    def mib(v: int | None) -> str:
        return f"{v / 2**20:g} MiB" if v else "?"

    lines = [doc["headline"]]
    lines.append(
        f"workload {wl['name']}: concurrency {', '.join(map(str, wl['concurrencies']))}, "
        f"{wl['input_len']} in / {wl['output_len']} out tokens, {wl['num_prompts']} prompts per point, "
        f"{wl['dataset']} dataset, temperature {wl['temperature']:g}; target p99 TTFT {wl['ttft_p99_target_ms']:g} ms"
    )
    gpus = ", ".join(f"{g['index']}: {g['name']}" for g in host["gpus"]) or "none"
    lines.append(
        f"host {host['hostname']}: CPU {cpu.get('brand') or cpu.get('model') or '?'} "
        f"(L2 {mib(cpu.get('l2_cache_bytes'))}, L3 {mib(cpu.get('l3_cache_bytes'))}"
        + (f"; py-cpuinfo: {cpu['error']}" if cpu.get("error") else "")
        + f"), GPUs {gpus}"
        + (f", driver {host['driver']}" if host["driver"] else "")
        + f", vLLM {host['vllm_version'] or '?'}"
    )
    by_label = {p["label"]: p for p in doc["plans"]}
    for p in plans:
        lines += plan_table(p, by_label[p.label]["summary"])
        if any(row["rounds"] > 1 for row in by_label[p.label]["summary"]):
            lines.append(
                "  (medians over the rounds and repeats; ± = half their range of output tokens/s, of the median)"
            )
        acc = by_label[p.label].get("accuracy")
        if acc:
            lines += accuracy_lines(acc, p.label)
        nd = by_label[p.label]["non_default_settings"]
        if nd:
            shown = ", ".join(f"{s['key']}={s['value']}" for s in nd[:12])
            lines.append(f"  non-default settings: {shown}{' …' if len(nd) > 12 else ''}")
    if doc["compare"]:
        c = doc["compare"]
        lines.append(f"compare {c['b']} / {c['a']} (per round, paired):")
        for row in c["per_concurrency"]:
            for m, s in zip(row["metrics"], row["sentences"], strict=True):
                if m["metric"] in TEXT_METRICS:
                    lines.append(f"  concurrency {row['concurrency']}: {s}")
        lines.append("  (every metric's ratios: bench.json, compare)")
    if doc.get("error"):
        lines.append(f"STOPPED EARLY: {doc['error']}")
    lines.append("verdict:")
    lines += [f"  {v}" for v in doc["verdict"]]
    if doc["plot"]:
        lines.append(f"plot: {doc['output_dir']}/{doc['plot']['file']}")
    elif doc["plot_error"]:
        lines.append(f"plot: none ({doc['plot_error']})")
    lines.append(f"results: {doc['output_dir']}/bench.json")
    return "\n".join(lines) + "\n"
