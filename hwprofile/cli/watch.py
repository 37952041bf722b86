"""``hwprofile watch``: the daemon's telemetry and policy evaluation for vLLM servers started some
other way (docker, k8s, by hand). It never launches, restarts or changes anything."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from ..config.settings import Watch
from ..daemon.policy import describe, instant_level
from ..daemon.watcher import InstanceSpec, Report, Watcher
from ..host.sampler import GpuSampler
from ..telemetry.scrape import scrape


def instance_specs(urls: Sequence[str], draft_cost: float, max_num_seqs: int | None) -> list[InstanceSpec]:
    out = []
    for i, url in enumerate(urls):
        name = url if len(urls) == 1 else f"{i}:{url}"
        # k is read off the per-position counters (vLLM creates one per proposal position)
        out.append(InstanceSpec(name, url, (), None, draft_cost, max_num_seqs))
    return out


def _with_k(w: Watcher, rep_scrapes: dict[str, Any]) -> None:
    """Learn each external server's k from its per-position counters."""
    for name, r in rep_scrapes.items():
        spec = w.instances[name]
        if r.metrics is None or spec.num_speculative_tokens:
            continue
        k = sum(1 for key in r.metrics.counters if "_per_pos_total{position=" in key)
        if k:
            w.instances[name] = InstanceSpec(
                spec.name, spec.url, spec.gpus, k, spec.draft_cost, spec.max_num_seqs, spec.adaptive_k
            )


def format_text(rep: Report, settings: Watch | None = None) -> str:
    """The report for a person; with ``settings`` (``--once``) each GPU's state is what its reading
    is now (:func:`~.policy.instant_level`), not what the dwell timer has confirmed so far."""
    lines = []
    for g in rep.gpus:
        st = g.state
        if settings is not None:
            state, reason = instant_level(g.reading, settings)
            why = f"; {reason}" if state != "ok" else ""
        else:
            state = "gpu_lost" if st.lost else st.level
            why = f"; {st.reason}" if st.level != "ok" or st.pending or st.lost else ""
        lines.append(f"GPU {g.reading.index}: {state} — {describe(g.reading)}{why}")
    for i in rep.instances:
        head = f"{i.name}: {i.status}"
        if i.status != "ok":
            lines.append(f"{head} ({i.error})" if i.error else head)
            continue
        parts = [
            f"running {i.running:.0f}" if i.running is not None else None,
            f"waiting {i.waiting:.0f}" if i.waiting is not None else None,
            f"KV {i.kv_usage:.0%}" if i.kv_usage is not None else None,
            f"acceptance {i.acceptance_rate:.0%} (mean length {i.mean_acceptance_length:.2f})"
            if i.acceptance_rate is not None and i.mean_acceptance_length is not None
            else None,
            f"TTFT p50/p99 {i.ttft_p50_s * 1000:.0f}/{i.ttft_p99_s * 1000:.0f} ms"
            if i.ttft_p50_s is not None and i.ttft_p99_s is not None
            else None,
            f"ITL p50/p99 {i.itl_p50_s * 1000:.0f}/{i.itl_p99_s * 1000:.0f} ms"
            if i.itl_p50_s is not None and i.itl_p99_s is not None
            else None,
            f"preemptions {i.preemptions:.0f} in {i.window_s:.0f} s" if i.preemptions else None,
        ]
        lines.append(head + ": " + ", ".join(p for p in parts if p))
        if i.warning:
            lines.append(f"  warning: {i.warning}")
        if i.advice:
            lines.append(f"  advice: {i.advice.reason}")
    return "\n".join(lines)


def _write_report(
    rep: Report, settings: Watch, once: bool, as_json: bool, took: float, nvml_error: str | None, out: IO[str]
) -> None:
    """One tick's report, as a JSON line or as text (``--once``: each card's instant level, not what
    a dwell confirmed)."""
    doc = rep.to_json()
    if once:  # a one-shot look reports what each card is, not what a dwell confirmed
        for g, gj in zip(rep.gpus, doc["gpus"], strict=True):
            gj["thermal_state"], gj["reason"] = instant_level(g.reading, settings)
            gj["pending"] = None
    doc["tick_seconds"] = round(took, 6)
    if nvml_error:
        doc["errors"] = [*doc["errors"], f"nvml: {nvml_error}"]
    if as_json:
        out.write(json.dumps(doc, separators=(",", ":")) + "\n")
    else:
        text = format_text(rep, settings if once else None)
        if nvml_error:
            text = f"GPUs: none read ({nvml_error})\n" + text
        out.write(text + "\n\n")
    out.flush()


def run_watch(
    urls: Sequence[str],
    settings: Watch,
    once: bool,
    as_json: bool,
    interval: float | None = None,
    draft_cost: float = 0.0,
    max_num_seqs: int | None = None,
    out: IO[str] = sys.stdout,
    clock: Callable[[], float] = time.monotonic,
    stop: threading.Event | None = None,
    max_ticks: int | None = None,
) -> int:
    step = interval or settings.interval
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    sampler = GpuSampler()
    watcher = Watcher(settings, instance_specs(urls, draft_cost, max_num_seqs))
    ticks = 0
    down: dict[str, str] = {}
    try:
        deadline = clock()
        while not stop.is_set():
            now = clock()
            t0 = time.perf_counter()
            scrapes = {i.name: scrape(i.name, i.url, now) for i in watcher.instances.values()}
            _with_k(watcher, scrapes)
            rep = watcher.tick(now, sampler.sample(now), scrapes, act=False)
            ticks += 1
            took = time.perf_counter() - t0
            first = once and ticks == 1 and urls
            if not first:  # --once: a second sample one interval later gives the window figures
                _write_report(rep, settings, once, as_json, took, sampler.error, out)
                down = {n: r.error or r.status for n, r in scrapes.items() if r.status == "unreachable"}
                if once or (max_ticks is not None and ticks >= max_ticks):
                    break
            deadline += step
            stop.wait(max(0.0, deadline - clock()))
    finally:
        sampler.close()
    if once and down:  # a one-shot look at a server that is not there failed: say so, exit non-zero
        for name, why in down.items():
            print(
                f"hwprofile watch: {name} is unreachable ({why}): is vLLM running at that URL?",
                file=sys.stderr,
            )
        return 1
    return 0
